#include "model/cross_entropy.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <stdexcept>

#include "model/capsule.h"
#include "model/mappings.h"

namespace loom::model {

namespace {

struct VocabParallelCrossEntropy : Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target, const runtime::CommunicatorPtr& tp_ptr,
                            int64_t vocab_size, double label_smoothing) {
    auto& tp = *tp_ptr;
    const int64_t v_local = logits.size(-1);
    const int64_t start = tp.rank() * v_local;
    const int64_t n_real = std::max<int64_t>(0, std::min<int64_t>(v_local, vocab_size - start));

    // Every pass over the [tokens, V/t] logits costs as much as a small GEMM, so the fp32 copy
    // is made by the subtraction itself (no separate clone) and pad columns are masked after.
    const at::Tensor logits32 = logits.to(at::kFloat);
    at::Tensor local_max = n_real > 0 ? std::get<0>(logits32.narrow(-1, 0, n_real).max(-1))
                                      : at::full(logits32.sizes().slice(0, logits32.dim() - 1),
                                                 -std::numeric_limits<float>::infinity(), logits32.options());
    at::Tensor max = comm::all_reduce(local_max, tp, runtime::ReduceOp::kMax);
    at::Tensor x = logits32 - max.unsqueeze(-1);
    if (n_real < v_local)
      x.narrow(-1, n_real, v_local - n_real).fill_(-std::numeric_limits<float>::infinity());

    at::Tensor in_range = (target >= start).logical_and(target < start + v_local);
    at::Tensor local_target = (target - start).masked_fill(in_range.logical_not(), 0);
    at::Tensor picked = x.gather(-1, local_target.unsqueeze(-1)).squeeze(-1);
    picked = comm::all_reduce(picked.masked_fill(in_range.logical_not(), 0.0f), tp);

    // Label smoothing needs the global sum of the shifted real-class logits (see below).
    at::Tensor shifted_sum;
    if (label_smoothing > 0.0) shifted_sum = comm::all_reduce(x.narrow(-1, 0, n_real).sum(-1), tp);

    at::Tensor exp = x.exp_();  // x is no longer needed as logits: reuse its storage
    at::Tensor sum_exp = comm::all_reduce(exp.sum(-1), tp);
    at::Tensor log_sum = sum_exp.log();
    at::Tensor loss = log_sum - picked;

    double smoothing = 0.0;
    if (label_smoothing > 0.0) {
      // Target distribution: 1 - ε on the target, ε/(V-1) on every other real class, i.e.
      // (1 - s)·onehot + s/V·uniform with s = ε·V/(V-1). Mean log-probability over the V
      // real classes: mean(x - max) - log(sum exp(x - max)).
      smoothing = label_smoothing * vocab_size / (vocab_size - 1);
      at::Tensor mean_log_prob = shifted_sum / static_cast<double>(vocab_size) - log_sum;
      loss = (1.0 - smoothing) * loss - smoothing * mean_log_prob;
    }

    at::Tensor softmax = exp.div_(sum_exp.unsqueeze(-1));
    ctx->save_for_backward({softmax, local_target, in_range});
    ctx->saved_data["smoothing"] = smoothing;
    ctx->saved_data["vocab_size"] = vocab_size;
    ctx->saved_data["n_real"] = n_real;
    ctx->saved_data["dtype"] = logits.scalar_type();
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    // The gradient is built in the saved softmax's storage (as Megatron's does): the loss is
    // back-propagated once per micro-batch, and saving a pass over the logits matters.
    at::Tensor grad = saved[0];
    const at::Tensor& local_target = saved[1];
    const at::Tensor& in_range = saved[2];
    const double smoothing = ctx->saved_data["smoothing"].toDouble();
    const int64_t vocab_size = ctx->saved_data["vocab_size"].toInt();
    const int64_t n_real = ctx->saved_data["n_real"].toInt();
    grad.scatter_add_(-1, local_target.unsqueeze(-1),
                      in_range.to(at::kFloat).mul(-(1.0 - smoothing)).unsqueeze(-1));
    if (smoothing > 0.0 && n_real > 0)
      grad.narrow(-1, 0, n_real).sub_(smoothing / static_cast<double>(vocab_size));
    grad.mul_(grads[0].to(at::kFloat).unsqueeze(-1));
    return {grad.to(ctx->saved_data["dtype"].toScalarType()), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                                        const runtime::CommunicatorPtr& tp, int64_t vocab_size,
                                        double label_smoothing) {
  if (logits.dim() != target.dim() + 1 ||
      logits.sizes().slice(0, target.dim()) != target.sizes())
    throw std::invalid_argument("vocab_parallel_cross_entropy: logits " +
                                c10::str(logits.sizes()) + " and target " +
                                c10::str(target.sizes()) + " must agree on the leading dims");
  if (vocab_size > logits.size(-1) * tp->size())
    throw std::invalid_argument("vocab_parallel_cross_entropy: vocab_size " +
                                std::to_string(vocab_size) + " exceeds the " +
                                std::to_string(logits.size(-1) * tp->size()) + " logit columns");
  return VocabParallelCrossEntropy::apply(logits, target, tp, vocab_size, label_smoothing);
}

}  // namespace loom::model
