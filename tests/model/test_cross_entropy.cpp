// Vocab-parallel cross entropy: the golden case of docs/design/parallel_layout.md on 4 ranks, agreement
// with ATen's cross entropy (loss and gradient, padding columns, label smoothing), and label
// smoothing giving the same loss and gradients for t = 1 and t = 2.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <chrono>

#include "harness/multiprocess.h"
#include "harness/worker_groups.h"
#include "launch/env_rendezvous.h"
#include "model/cross_entropy.h"
#include "model/mappings.h"
#include "runtime/process_groups.h"

using namespace loom;
using namespace loom::model;

namespace {

std::shared_ptr<runtime::ProcessGroups> make_groups(int t) { return loom::test::worker_groups(t); }

// Random logits [s, b, V] and targets [s, b] (fixed seed).
std::pair<at::Tensor, at::Tensor> random_problem(int64_t vocab_padded, int64_t vocab) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  at::Tensor logits = at::randn({6, 3, vocab_padded}, gen, at::kFloat) * 3.0;
  at::Tensor target = at::randint(vocab, {6, 3}, gen, at::kLong);
  return {logits, target};
}

// Loss and d(sum of loss · weights)/d logits through the vocab-parallel function on `tp`,
// with the full logits sliced to this rank's columns; the gradient is gathered back.
std::pair<at::Tensor, at::Tensor> parallel_loss_grad(const at::Tensor& full_logits,
                                                     const at::Tensor& target,
                                                     const runtime::CommunicatorPtr& tp,
                                                     int64_t vocab, double smoothing) {
  const int64_t part = full_logits.size(-1) / tp->size();
  at::Tensor local = full_logits.narrow(-1, tp->rank() * part, part).clone().requires_grad_(true);
  at::Tensor loss = vocab_parallel_cross_entropy(local, target, tp, vocab, smoothing);
  at::Tensor weights = at::linspace(0.5, 2.0, loss.numel()).view(loss.sizes());
  (loss * weights).sum().backward();
  return {loss.detach(), comm::all_gather_last_dim(local.grad(), *tp)};
}

}  // namespace

LOOM_WORKER("ce_golden") {
  auto groups = make_groups(4);
  auto tp = groups->tensor_ptr();
  // Each rank's 32 logits are 0..7 repeated; targets 0, 2, ..., 30 over 16 tokens.
  at::Tensor logits = at::arange(8, at::kFloat).repeat({4}).unsqueeze(0).repeat({16, 1});
  at::Tensor target = at::arange(0, 32, 2, at::kLong);
  at::Tensor loss = vocab_parallel_cross_entropy(logits, target, tp, 128);
  const double expected[4] = {10.2309, 8.2309, 6.2309, 4.2309};
  for (int i = 0; i < 16; ++i)
    LOOM_WCHECK(std::abs(loss[i].item<double>() - expected[i % 4]) < 1e-4,
                "token " + std::to_string(i) + ": " + std::to_string(loss[i].item<double>()));
  groups->shutdown();
}

LOOM_WORKER("ce_parallel_vs_single") {
  const int t = loom::test::env_int("T");
  auto groups = make_groups(t);
  for (double smoothing : {0.0, 0.1}) {
    for (int64_t vocab : {128, 100}) {  // no padding, and padding columns on the last rank(s)
      auto [logits, target] = random_problem(128, vocab);
      auto [loss1, grad1] = parallel_loss_grad(logits, target, runtime::Communicator::solo(), vocab, smoothing);
      auto [loss_t, grad_t] = parallel_loss_grad(logits, target, groups->tensor_ptr(), vocab, smoothing);
      const std::string what = " (t=" + std::to_string(t) + ", vocab " + std::to_string(vocab) +
                               ", smoothing " + std::to_string(smoothing) + ")";
      LOOM_WCHECK(at::allclose(loss_t, loss1, 1e-6, 1e-6), + what);
      LOOM_WCHECK(at::allclose(grad_t, grad1, 1e-6, 1e-7), + what);
    }
  }
  groups->shutdown();
}

TEST_CASE("vocab-parallel cross entropy: the golden case of docs/design/parallel_layout.md (t=4)",
          "[model][multiprocess]") {
  auto r = loom::test::run_ranks("ce_golden", 4, {}, 120.0);
  INFO(r.summary());
  CHECK(r.exit_code() == 0);
}

TEST_CASE("vocab-parallel cross entropy with t=2 equals t=1, with and without label smoothing",
          "[model][multiprocess]") {
  auto r = loom::test::run_ranks("ce_parallel_vs_single", 2, {{"T", "2"}}, 120.0);
  INFO(r.summary());
  CHECK(r.exit_code() == 0);
}

TEST_CASE("cross entropy equals ATen's, padding columns excluded, label smoothing as PyTorch's",
          "[model]") {
  const int64_t vocab = 100;
  auto [logits, target] = random_problem(128, vocab);
  for (double eps : {0.0, 0.1}) {
    auto [loss, grad] = parallel_loss_grad(logits, target, runtime::Communicator::solo(), vocab, eps);
    // Reference: ATen on the real columns only. Loom's ε puts 1 − ε on the target and
    // ε/(V−1) on each other class = PyTorch's smoothing with ε·V/(V−1).
    at::Tensor real = logits.narrow(-1, 0, vocab).clone().requires_grad_(true);
    at::Tensor ref = at::cross_entropy_loss(real.reshape({-1, vocab}), target.reshape({-1}), {},
                                            at::Reduction::None, -100, eps * vocab / (vocab - 1))
                         .view(target.sizes());
    at::Tensor weights = at::linspace(0.5, 2.0, ref.numel()).view(ref.sizes());
    (ref * weights).sum().backward();
    CHECK(at::allclose(loss, ref.detach(), 1e-5, 1e-6));
    CHECK(at::allclose(grad.narrow(-1, 0, vocab), real.grad(), 1e-5, 1e-7));
    CHECK(grad.narrow(-1, vocab, 128 - vocab).abs().max().item<double>() == 0.0);
  }
}
