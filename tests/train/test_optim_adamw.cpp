// AdamW against LibTorch's own torch::optim::AdamW and against a float64 evaluation of the
// formula.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <cmath>

#include "train/optim/adamw.h"

using namespace loom;
using namespace loom::train::optim;

namespace {

at::Tensor seeded_randn(std::vector<int64_t> shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::kFloat);
}

// Reference AdamW in float64, straight from the paper's formulas (decoupled decay).
void adamw_reference(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, int64_t t, double lr,
                     const AdamWConfig& c, bool decay) {
  if (decay) p = p - lr * c.weight_decay * p;
  m = c.beta1 * m + (1 - c.beta1) * g;
  v = c.beta2 * v + (1 - c.beta2) * g * g;
  at::Tensor m_hat = m / (1 - std::pow(c.beta1, t));
  at::Tensor v_hat = v / (1 - std::pow(c.beta2, t));
  p = p - lr * m_hat / (v_hat.sqrt() + c.eps);
}

}  // namespace

TEST_CASE("adamw_update equals torch::optim::AdamW bit for bit", "[train][optim]") {
  AdamWConfig cfg{0.9, 0.95, 1e-8, 0.1};
  for (bool decay : {true, false}) {
    at::Tensor mine = seeded_randn({7, 5}, 1);
    at::Tensor theirs = mine.clone().set_requires_grad(true);
    at::Tensor m = at::zeros_like(mine), v = at::zeros_like(mine);
    torch::optim::AdamW ref({theirs}, torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(decay ? 0.1 : 0.0));
    for (int t = 1; t <= 5; ++t) {
      at::Tensor g = seeded_randn({7, 5}, 100 + t);
      theirs.mutable_grad() = g.clone();
      ref.step();
      adamw_update(mine, g, m, v, t, 3e-3, cfg, decay);
      REQUIRE(at::equal(mine, theirs.detach()));
    }
  }
}

TEST_CASE("adamw_update matches the float64 formula", "[train][optim]") {
  AdamWConfig cfg{0.9, 0.999, 1e-6, 0.01};
  at::Tensor p = seeded_randn({64}, 2), m = at::zeros({64}), v = at::zeros({64});
  at::Tensor pd = p.to(at::kDouble), md = m.to(at::kDouble), vd = v.to(at::kDouble);
  for (int t = 1; t <= 4; ++t) {
    at::Tensor g = seeded_randn({64}, 200 + t);
    adamw_update(p, g, m, v, t, 1e-2, cfg, true);
    adamw_reference(pd, g.to(at::kDouble), md, vd, t, 1e-2, cfg, true);
  }
  CHECK(at::allclose(p.to(at::kDouble), pd, 1e-6, 1e-7));
  CHECK(at::allclose(v.to(at::kDouble), vd, 1e-5, 1e-12));
  at::Tensor half_grad = at::zeros({64}, at::kHalf);
  CHECK_THROWS_WITH(adamw_update(p, half_grad, m, v, 1, 1e-3, cfg, true), Catch::Contains("fp32"));
}

TEST_CASE("fused_adamw_update: for-each equals adamw_update bit for bit, ATen's fused kernel within fp32 rounding", "[train][optim]") {
  CHECK_FALSE(fused_adamw_supported(at::kCPU));  // CPU takes the for-each path (stand-in lane)
  AdamWConfig cfg{0.9, 0.95, 1e-8, 0.1};
  for (auto kernel : {AdamWKernel::kAuto, AdamWKernel::kForEach, AdamWKernel::kAtenFused}) {
    const bool exact = kernel != AdamWKernel::kAtenFused;
    for (bool decay : {true, false}) {
      INFO("kernel " << int(kernel) << " decay " << decay);
      const std::vector<std::vector<int64_t>> shapes = {{7, 5}, {3}, {130}};
      AdamWTensors fused;
      std::vector<at::Tensor> p, m, v;
      for (size_t k = 0; k < shapes.size(); ++k) {
        p.push_back(seeded_randn(shapes[k], 10 + k));
        m.push_back(at::zeros(shapes[k]));
        v.push_back(at::zeros(shapes[k]));
        fused.params.push_back(p.back().clone());
        fused.exp_avgs.push_back(m.back().clone());
        fused.exp_avg_sqs.push_back(v.back().clone());
        fused.grads.push_back(at::Tensor());
      }
      for (int t = 1; t <= 6; ++t) {
        for (size_t k = 0; k < shapes.size(); ++k) {
          fused.grads[k] = seeded_randn(shapes[k], 300 + 10 * t + k);
          adamw_update(p[k], fused.grads[k], m[k], v[k], t, 3e-3, cfg, decay);
        }
        fused_adamw_update(fused, t, 3e-3, cfg, decay, kernel);
      }
      for (size_t k = 0; k < shapes.size(); ++k) {
        if (exact) {
          CHECK(at::equal(fused.params[k], p[k]));
          CHECK(at::equal(fused.exp_avgs[k], m[k]));
          CHECK(at::equal(fused.exp_avg_sqs[k], v[k]));
        } else {
          CHECK(at::allclose(fused.params[k], p[k], 1e-6, 1e-7));
          // The lerp rounds differently where β1·m and (1 − β1)·g nearly cancel: an absolute
          // fp32-rounding bound at the moments' scale (|m| ~ 0.1..1).
          CHECK((fused.exp_avgs[k] - m[k]).abs().max().item<float>() < 1e-6f);
          CHECK(at::allclose(fused.exp_avg_sqs[k], v[k], 1e-6, 1e-10));
        }
        CHECK_FALSE(at::equal(fused.params[k], seeded_randn(shapes[k], 10 + k)));  // it did update
      }
    }
  }
  AdamWTensors bad{{at::zeros({2})}, {at::zeros({2}, at::kHalf)}, {at::zeros({2})}, {at::zeros({2})}};
  CHECK_THROWS_WITH(fused_adamw_update(bad, 1, 1e-3, cfg, true), Catch::Contains("fp32"));
}
