#include "model/init.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>

namespace loom::model {

namespace {
// FNV-1a 64 of the name, mixed with the seed (splitmix64 finaliser).
uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  uint64_t z = h ^ (seed + 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

namespace {
thread_local bool g_shapes_only = false;
thread_local bool g_skip_values = false;

at::Tensor meta_tensor(const std::vector<int64_t>& shape) {
  return at::empty(shape, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
}
}  // namespace

ShapesOnlyInit::ShapesOnlyInit() : previous_(g_shapes_only) { g_shapes_only = true; }
ShapesOnlyInit::~ShapesOnlyInit() { g_shapes_only = previous_; }
SkipInitialValues::SkipInitialValues() : previous_(g_skip_values) { g_skip_values = true; }
SkipInitialValues::~SkipInitialValues() { g_skip_values = previous_; }

at::Tensor full_normal(uint64_t seed, const std::string& name, const std::vector<int64_t>& shape,
                       double std) {
  if (g_shapes_only || g_skip_values) return meta_tensor(shape);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(name_seed(seed, name));
  // host: drawn by a CPU generator, so every device and layout starts from the same bits.
  auto out = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  out.normal_(0.0, std, gen);
  return out;
}

at::Tensor full_uniform(uint64_t seed, const std::string& name, const std::vector<int64_t>& shape,
                        double low, double high) {
  if (g_shapes_only || g_skip_values) return meta_tensor(shape);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(name_seed(seed, name));
  // host: drawn by a CPU generator, so every device and layout starts from the same bits.
  auto out = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  out.uniform_(low, high, gen);
  return out;
}

at::Tensor shard(const at::Tensor& full, int64_t dim, int rank, int size) {
  const int64_t n = full.size(dim);
  if (n % size != 0)
    throw std::invalid_argument("shard: dimension " + std::to_string(dim) + " of size " +
                                std::to_string(n) + " does not split into " +
                                std::to_string(size) + " equal parts");
  const int64_t part = n / size;
  return full.narrow(dim, rank * part, part).contiguous().clone();
}

at::Tensor make_parameter(const at::Tensor& value, const at::TensorOptions& options) {
  if (g_skip_values && value.is_meta() && !(options.has_device() && options.device().is_meta())) {
    const at::TensorOptions target_options = value.options().merge_in(options).device(options.device());
    auto p = at::empty(value.sizes(), target_options);
    p.set_requires_grad(true);
    return p;
  }
  auto p = value.to(options).detach().clone();
  p.set_requires_grad(true);
  return p;
}

}  // namespace loom::model
