#include "eval/scorer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <numeric>

#include "model/cross_entropy.h"
#include "model/vocab_parallel_argmax.h"

namespace loom::eval {

namespace {

// Pipeline sends in flight per stage before the oldest is waited for (bounds the hidden
// tensors kept alive).
constexpr size_t kSendsInFlight = 4;

std::vector<int64_t> harness_order(const std::vector<TokenRequest>& requests) {
  std::vector<int64_t> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const auto& ta = requests[a].tokens;
    const auto& tb = requests[b].tokens;
    if (ta.size() != tb.size()) return ta.size() > tb.size();
    return ta < tb;
  });
  return order;
}

// One batch of requests in harness order: inputs and labels [b, s], right-padded with token 0
// (never scored), on the host.
struct Batch {
  int64_t begin = 0, size = 0, length = 0;  // first position in `order`, b, s
  at::Tensor tokens, labels;
};

Batch make_batch(const std::vector<TokenRequest>& requests, const std::vector<int64_t>& order, int64_t begin,
                 int64_t end) {
  Batch batch;
  batch.begin = begin;
  batch.size = end - begin;
  const int64_t b = batch.size;
  int64_t s = 0;
  for (int64_t r = begin; r < end; ++r) s = std::max<int64_t>(s, requests[order[r]].tokens.size() - 1);
  batch.length = s;
  batch.tokens = at::zeros({b, s}, at::kLong);  // host: filled here
  batch.labels = at::zeros({b, s}, at::kLong);  // host: filled here
  auto* tok = batch.tokens.data_ptr<int64_t>();
  auto* lab = batch.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < b; ++i) {
    const auto& t = requests[order[begin + i]].tokens;
    for (size_t j = 0; j + 1 < t.size(); ++j) {
      tok[i * s + j] = t[j];
      lab[i * s + j] = t[j + 1];
    }
  }
  return batch;
}

// The first stage's tokens and positions, or the previous stage's hidden states [s, b, h].
model::StageInputs stage_inputs(const model::GptStage& stage, const Batch& batch, runtime::ProcessGroups& groups) {
  const at::Device device = groups.device();
  const int64_t b = batch.size, s = batch.length;
  model::StageInputs in;
  if (stage.layout().pre_process) {
    in.tokens = batch.tokens.to(device);
    in.position_ids = at::arange(s, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(0).expand({b, s}).contiguous();
  } else {
    in.hidden = at::empty({s, b, stage.config().hidden_size}, at::TensorOptions().dtype(at::kFloat).device(device));
    groups.pipeline_links().recv(in.hidden, groups.coords().pp - 1);
  }
  return in;
}

// On the last stage: each request's summed log-likelihood of its scored tokens and whether all
// were the greedy choice, from the [s, b, V/t] logits `y`, into out[2·req], out[2·req + 1]
// (tensor rank 0 only; the vocab-parallel reductions are collective over the tensor group).
void score_batch(const at::Tensor& y, const Batch& batch, const std::vector<TokenRequest>& requests,
                 const std::vector<int64_t>& order, runtime::ProcessGroups& groups, int64_t vocab, double* out) {
  const int64_t b = batch.size, s = batch.length;
  const auto* lab = batch.labels.data_ptr<int64_t>();
  // Only the scored positions: rows j·b + i of the [s·b, V/t] logits.
  std::vector<int64_t> rows, targets;
  for (int64_t i = 0; i < b; ++i) {
    const auto& r = requests[order[batch.begin + i]];
    const int64_t len = static_cast<int64_t>(r.tokens.size()) - 1;
    for (int64_t j = len - r.scored; j < len; ++j) {
      rows.push_back(j * b + i);
      targets.push_back(lab[i * s + j]);
    }
  }
  const auto tp = groups.tensor_ptr();
  const auto index_options = at::TensorOptions().dtype(at::kLong).device(groups.device());
  const at::Tensor picked = y.reshape({s * b, y.size(2)}).index_select(0, at::tensor(rows, index_options));  // [m, V/t]
  const at::Tensor target = at::tensor(targets, index_options);
  const at::Tensor nll = model::vocab_parallel_cross_entropy(picked, target, tp, vocab).to(at::kDouble).cpu();
  const at::Tensor greedy =
      model::vocab_parallel_is_argmax(picked.unsqueeze(1), target.view({1, -1}), tp, vocab).view({-1}).cpu();
  if (groups.coords().tp != 0) return;
  const double* nll_p = nll.data_ptr<double>();
  const bool* greedy_p = greedy.data_ptr<bool>();
  int64_t m = 0;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t req = order[batch.begin + i];
    double ll = 0;
    bool all_greedy = true;
    for (int64_t j = 0; j < requests[req].scored; ++j, ++m) {
      ll -= nll_p[m];
      all_greedy = all_greedy && greedy_p[m];
    }
    out[req * 2] = ll;
    out[req * 2 + 1] = all_greedy ? 1.0 : 0.0;
  }
}

}  // namespace

ScoringCost scoring_cost(const std::vector<TokenRequest>& requests, int64_t batch_size, const model::GptConfig& config) {
  const std::vector<int64_t> order = harness_order(requests);
  const int64_t n = static_cast<int64_t>(order.size());
  ScoringCost cost;
  cost.requests = n;
  for (int64_t begin = 0; begin < n; begin += batch_size) {
    const int64_t end = std::min(n, begin + batch_size);
    // Longest first: the batch's first request sets its padded length.
    const int64_t s = static_cast<int64_t>(requests[order[begin]].tokens.size()) - 1;
    ++cost.batches;
    cost.positions += (end - begin) * s;
    // A training iteration is one forward and two forward-sized backward passes.
    ModelShape shape = config;
    shape.seq_length = s;
    cost.flops += double(end - begin) * shape.model_flops_per_sample(1) / 3;
  }
  return cost;
}

std::vector<RequestScore> score_requests(const model::GptStage& stage, runtime::ProcessGroups& groups,
                                         const std::vector<TokenRequest>& requests, int64_t batch_size,
                                         const ScoringProgress& progress) {
  at::NoGradGuard no_grad;
  const runtime::RankCoords me = groups.coords();
  const int d = groups.layout().data_parallel();
  model::DropoutContext no_dropout;
  no_dropout.training = false;

  const std::vector<int64_t> order = harness_order(requests);
  const int64_t n = static_cast<int64_t>(order.size());
  const int64_t batches = (n + batch_size - 1) / batch_size;
  int64_t mine_total = 0;
  for (int64_t k = me.dp; k < batches; k += d) mine_total += std::min(batch_size, n - k * batch_size);

  at::Tensor results = at::zeros({std::max<int64_t>(n, 1), 2}, at::kDouble);  // host: gathered over host_world
  auto* out = results.data_ptr<double>();
  std::deque<std::unique_ptr<runtime::AsyncWork>> sends;
  int64_t done = 0;
  if (progress) progress(0, mine_total);  // shown before the first (possibly long) batch
  // Data-parallel ranks take every d-th batch.
  for (int64_t k = me.dp; k < batches; k += d) {
    const Batch batch = make_batch(requests, order, k * batch_size, std::min(n, (k + 1) * batch_size));
    const at::Tensor y = stage.forward(stage_inputs(stage, batch, groups), no_dropout);
    if (stage.layout().post_process) {
      score_batch(y, batch, requests, order, groups, stage.config().vocab_size, out);
    } else {
      sends.push_back(groups.pipeline_links().isend(y.contiguous(), me.pp + 1));
      while (sends.size() > kSendsInFlight) {
        sends.front()->wait();
        sends.pop_front();
      }
    }
    done += batch.size;
    if (progress) progress(done, mine_total);
  }
  for (auto& w : sends) w->wait();
  groups.host_world().all_reduce(results);

  std::vector<RequestScore> scores(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) scores[r] = {out[r * 2], out[r * 2 + 1] != 0.0};
  return scores;
}

}  // namespace loom::eval
