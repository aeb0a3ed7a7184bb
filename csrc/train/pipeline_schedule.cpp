#include "train/pipeline_schedule.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <stdexcept>

#include "rules/layout_rules.h"

namespace loom::train {
namespace {

struct Stashed {
  at::Tensor input;   // received activation (leaf), undefined on virtual stage 0
  at::Tensor output;  // sent activation (storage may be released) or the loss
};

struct PendingSend {
  std::unique_ptr<runtime::AsyncWork> work;
  at::Tensor tensor;
  bool release_after;  // free the storage once sent
};

// Backward from `output` with gradient `grad` through the autograd engine directly: the
// output's storage may have been released, so the shape check of autograd::backward on the
// tensor itself cannot be used (the graph node keeps the real shape).
void backward_from(const at::Tensor& output, const at::Tensor& grad) {
  auto edge = torch::autograd::impl::gradient_edge(output);
  if (!edge.function) return;  // the chunk does not depend on anything that requires grad
  torch::autograd::Engine::get_default_engine().execute(
      {edge}, {grad.defined() ? grad : at::ones_like(output)}, /*keep_graph=*/false,
      /*create_graph=*/false, /*accumulate_grad=*/true);
}

}  // namespace

std::vector<ScheduledOp> schedule_order(int p, int r, int m, int v, bool forward_only) {
  if (m < 1) throw std::invalid_argument("num_microbatches must be >= 1, got " + std::to_string(m));
  if (v < 1) throw std::invalid_argument("virtual stages must be >= 1");
  if (auto violation = rules::interleaving_violation(m, p, v)) throw std::invalid_argument(violation->text());
  const int total = m * v;
  // Virtual micro-batch k → (chunk, micro-batch): groups of p micro-batches go through each
  // chunk in turn; backward visits chunks in reverse.
  auto chunk_of = [&](int k, bool fwd) {
    int c = (k % (p * v)) / p;
    return fwd ? c : v - 1 - c;
  };
  auto microbatch_of = [&](int k) { return v == 1 ? k : (k / (p * v)) * p + k % p; };

  int warmup;
  if (forward_only) {
    warmup = total;
  } else if (v == 1) {
    warmup = std::min(p - r - 1, m);
  } else if (m == p) {
    warmup = total;
  } else {
    warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
  }
  std::vector<ScheduledOp> ops;
  int f = 0, b = 0;
  auto F = [&] { ops.push_back({true, chunk_of(f, true), microbatch_of(f)}); ++f; };
  auto B = [&] { ops.push_back({false, chunk_of(b, false), microbatch_of(b)}); ++b; };
  for (int i = 0; i < warmup; ++i) F();
  if (!forward_only) {
    for (int i = 0; i < total - warmup; ++i) {
      F();
      B();
    }
    while (b < total) B();
  }
  return ops;
}

ScheduleResult run_pipeline_schedule(const ScheduleConfig& config, runtime::PipelineLinks& pipeline,
                                     const ForwardStep& forward_step) {
  const int p = pipeline.size(), r = pipeline.rank(), v = config.virtual_stages;
  const int m = config.num_microbatches;
  const auto ops = schedule_order(p, r, m, v, config.forward_only);
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  auto is_first_virtual = [&](int chunk) { return r == 0 && chunk == 0; };
  auto is_last_virtual = [&](int chunk) { return r == p - 1 && chunk == v - 1; };
  const auto act_options =
      at::TensorOptions().dtype(config.activation_dtype).device(config.activation_device);

  ScheduleResult result;
  std::map<std::pair<int, int>, Stashed> stash;  // (chunk, micro-batch) → activations
  std::deque<PendingSend> sends;
  std::map<int, at::Tensor> losses;
  auto reap_sends = [&](bool all) {
    while (!sends.empty() && (all || sends.front().work->completed())) {
      sends.front().work->wait();
      if (sends.front().release_after) {
        // Keep the autograd node, drop the data (deallocate_output_tensor in Megatron).
        sends.front().tensor.set_data(at::empty({1}, sends.front().tensor.options()));
      }
      sends.pop_front();
    }
  };

  for (const auto& op : ops) {
    const auto key = std::make_pair(op.chunk, op.microbatch);
    if (op.forward) {
      at::Tensor input;
      if (!is_first_virtual(op.chunk)) {
        input = at::empty(config.activation_shape, act_options);
        pipeline.recv(input, prev);
        if (!config.forward_only) input.requires_grad_(true);
      }
      at::Tensor output = forward_step(op.chunk, op.microbatch, input);
      ++result.stats.forwards;
      if (is_last_virtual(op.chunk)) {
        losses[op.microbatch] = output.detach();
      } else {
        at::Tensor to_send = output.contiguous();
        if (to_send.sizes().vec() != config.activation_shape) {
          throw std::logic_error("pipeline stage produced an activation of the wrong shape");
        }
        bool release = config.free_sent_activations && !config.forward_only &&
                       to_send.is_same(output) && output.requires_grad();
        sends.push_back({pipeline.isend(to_send, next), to_send, release});
      }
      if (!config.forward_only) {
        stash[key] = {input, output};
        result.stats.max_stashed = std::max<int>(result.stats.max_stashed, stash.size());
      }
    } else {
      auto it = stash.find(key);
      if (it == stash.end()) throw std::logic_error("pipeline backward before its forward");
      Stashed s = std::move(it->second);
      stash.erase(it);
      at::Tensor grad;
      if (!is_last_virtual(op.chunk)) {
        grad = at::empty(config.activation_shape, act_options);
        pipeline.recv(grad, next);
      }
      reap_sends(false);
      backward_from(s.output, grad);
      ++result.stats.backwards;
      if (config.after_backward) config.after_backward();
      if (!is_first_virtual(op.chunk)) {
        at::Tensor g = s.input.grad();
        if (!g.defined()) g = at::zeros(config.activation_shape, act_options);
        sends.push_back({pipeline.isend(g.contiguous(), prev), g.contiguous(), false});
      }
    }
    reap_sends(false);
  }
  reap_sends(true);
  if (p == 1 || r == p - 1) {
    for (auto& [mb, loss] : losses) result.losses.push_back(loss);
  }
  return result;
}

}  // namespace loom::train
