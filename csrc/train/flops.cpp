#include "train/flops.h"

#include <algorithm>
#include <cctype>

namespace loom::train {
namespace {
double base(const GptFlopsShape& s) {
  return 72.0 * double(s.global_batch) * double(s.layers) * double(s.seq_length) *
         double(s.hidden) * double(s.hidden);
}
}  // namespace

double model_flops_per_iteration(const GptFlopsShape& s) {
  const double h = double(s.hidden), L = double(s.layers);
  return base(s) * (1.0 + double(s.seq_length) / (6.0 * h) + double(s.vocab) / (12.0 * h * L));
}

double selective_recompute_flops_per_iteration(const GptFlopsShape& s) {
  const double h = double(s.hidden), L = double(s.layers);
  return base(s) * (1.0 + double(s.seq_length) / (3.0 * h) + double(s.vocab) / (12.0 * h * L));
}

double full_recompute_flops_per_iteration(const GptFlopsShape& s) {
  const double h = double(s.hidden), L = double(s.layers);
  return base(s) * 4.0 / 3.0 *
         (1.0 + double(s.seq_length) / (6.0 * h) + double(s.vocab) / (16.0 * h * L));
}

std::optional<double> peak_tflops_for_device(const std::string& device_name) {
  std::string n = device_name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::toupper(c); });
  // Dense bf16 tensor-core peaks from the vendors' data sheets (SXM parts).
  if (n.find("H200") != std::string::npos) return 989.0;
  if (n.find("H100") != std::string::npos) return 989.0;
  if (n.find("A100") != std::string::npos) return 312.0;
  return std::nullopt;
}

}  // namespace loom::train
