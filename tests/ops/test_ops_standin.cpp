// The op library on the stand-in device (docs/design/devices.md): every op's forward and
// backward, fp32 and bf16, give the CPU results bit for bit, so the GPU code path run on the
// stand-in computes what CPU ranks compute.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <catch2/catch.hpp>
#include <dlfcn.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>
#include <vector>

#include "harness/standin_device.h"
#include "loom_ops/ops.h"

using namespace loom;

namespace {

at::Device standin() {
  static void* handle = dlopen(test::standin_library().c_str(), RTLD_NOW | RTLD_GLOBAL);
  REQUIRE(handle != nullptr);
  return at::Device(c10::DeviceType::PrivateUse1, 0);
}

std::vector<at::Tensor> random_inputs(const std::vector<std::vector<int64_t>>& shapes,
                                      at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  std::vector<at::Tensor> out;
  for (const auto& s : shapes) out.push_back(at::normal(0.0, 1.0, s, gen).to(dtype));
  return out;
}

// Runs `op` on copies of `inputs` placed on `device`, backpropagates a fixed gradient, and
// returns the output and every input's gradient on the host.
using Op = std::function<at::Tensor(const std::vector<at::Tensor>&)>;
std::vector<at::Tensor> run_on(at::Device device, const Op& op, const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> xs;
  for (const auto& x : inputs) xs.push_back(x.to(device).detach().requires_grad_(true));
  at::Tensor y = op(xs);
  at::Tensor g = at::linspace(-1.0, 1.0, y.numel(), at::TensorOptions().dtype(at::kFloat))
                     .reshape(y.sizes()).to(y.scalar_type()).to(device);
  torch::autograd::backward({y}, {g});
  std::vector<at::Tensor> out{y.detach().cpu()};
  for (const auto& x : xs) out.push_back(x.grad().defined() ? x.grad().cpu() : at::Tensor());
  return out;
}

void check_same_on_standin(const char* name, const Op& op, const std::vector<at::Tensor>& inputs) {
  const auto want = run_on(at::kCPU, op, inputs);
  const auto got = run_on(standin(), op, inputs);
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(name << (i == 0 ? ": output" : ": gradient of input " + std::to_string(i - 1)));
    REQUIRE(got[i].defined() == want[i].defined());
    if (want[i].defined()) CHECK(at::equal(got[i], want[i]));
  }
}

ops::DropoutSpec dropout_spec(const std::vector<int64_t>& shape) {
  ops::DropoutSpec spec;
  spec.p = 0.1;
  spec.key = {1234, ops::make_dropout_stream(3, 1, 2)};
  spec.block.global_shape = shape;
  spec.block.offset = std::vector<int64_t>(shape.size(), 0);
  return spec;
}

}  // namespace

TEST_CASE("every op gives the CPU result bit for bit on the stand-in device", "[standin][ops]") {
  standin();  // loaded before the first backward: autograd sizes its device queues once
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    INFO("dtype " << c10::toString(dtype));
    const std::vector<int64_t> x_shape{8, 2, 32};
    check_same_on_standin("layer_norm", [](const auto& v) { return ops::layer_norm(v[0], v[1], v[2], 1e-5); },
                          random_inputs({x_shape, {32}, {32}}, dtype));
    check_same_on_standin("dropout", [&](const auto& v) { return ops::dropout(v[0], dropout_spec(x_shape)); },
                          random_inputs({x_shape}, dtype));
    check_same_on_standin("bias_dropout_add",
                          [&](const auto& v) { return ops::bias_dropout_add(v[0], v[1], v[2], dropout_spec(x_shape)); },
                          random_inputs({x_shape, {32}, x_shape}, dtype));
    check_same_on_standin("scaled_masked_softmax",
                          [](const auto& v) { return ops::scaled_masked_softmax(v[0], std::nullopt, 0.125, true); },
                          random_inputs({{2, 4, 16, 16}}, dtype));
    check_same_on_standin("core_attention",
                          [](const auto& v) {
                            return ops::core_attention(v[0], v[1], v[2], std::nullopt, 0.125, true,
                                                       dropout_spec({2, 4, 16, 16}));
                          },
                          random_inputs({{2, 4, 16, 8}, {2, 4, 16, 8}, {2, 4, 16, 8}}, dtype));
    check_same_on_standin("bias_gelu", [](const auto& v) { return ops::bias_gelu(v[0], v[1]); },
                          random_inputs({{8, 2, 64}, {64}}, dtype));
    check_same_on_standin("rms_norm", [](const auto& v) { return ops::rms_norm(v[0], v[1], 1e-6); },
                          random_inputs({x_shape, {32}}, dtype));
    check_same_on_standin("rotary",  // tables: not differentiable
                          [](const auto& v) { return ops::rotary(v[0], v[1].detach(), v[2].detach()); },
                          random_inputs({{2, 4, 8, 16}, {2, 1, 8, 12}, {2, 1, 8, 12}}, dtype));
    check_same_on_standin("swiglu", [](const auto& v) { return ops::swiglu(v[0]); },
                          random_inputs({{8, 2, 64}}, dtype));
  }
}
