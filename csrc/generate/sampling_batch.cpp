#include "generate/sampling_batch.h"

#include <ATen/ATen.h>
#include <ATen/TensorIndexing.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <tuple>
#include <stdexcept>
#include <string>

namespace loom::generate {

namespace {

void check_logits(const at::Tensor& logits, const std::vector<SampleRow>& rows) {
  const int64_t m = static_cast<int64_t>(rows.size());
  if (logits.dim() != 2 || logits.size(0) != m || logits.size(1) < 1)
    throw std::invalid_argument("sample_rows: expected logits [" + std::to_string(m) + ", vocab >= 1], found " +
                                c10::str(logits.sizes()));
  for (const SampleRow& r : rows) validate(r.options);
}

// Row i's logits after the repetition penalty over its tokens (each distinct id once, the
// host's float(double(z) / p) or float(double(z) * p)) and with its banned token at -inf.
at::Tensor processed(const at::Tensor& raw, const std::vector<SampleRow>& rows) {
  const int64_t vocab = raw.size(1);
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(raw.device());
  at::Tensor z = raw;  // copied before the first change (most steps change nothing)
  std::vector<int64_t> at_row, at_id;
  std::vector<double> penalty;
  for (size_t i = 0; i < rows.size(); ++i) {
    const double p = rows[i].options.repetition_penalty;
    if (p == 1.0 || rows[i].penalized == nullptr) continue;
    std::vector<bool> seen(static_cast<size_t>(vocab), false);
    for (int64_t id : *rows[i].penalized) {
      if (id < 0 || id >= vocab || seen[static_cast<size_t>(id)]) continue;
      seen[static_cast<size_t>(id)] = true;
      at_row.push_back(static_cast<int64_t>(i));
      at_id.push_back(id);
      penalty.push_back(p);
    }
  }
  if (!at_row.empty()) {
    const at::Tensor r = at::tensor(at_row, long_options), id = at::tensor(at_id, long_options);
    const at::Tensor p = at::tensor(penalty, long_options.dtype(at::kDouble));
    const at::Tensor v = z.index({r, id}).to(at::kDouble);
    z = z.clone();
    z.index_put_({r, id}, at::where(v > 0, v / p, v * p).to(at::kFloat));
  }
  std::vector<int64_t> banned_row, banned_id;
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].banned_token >= 0 && rows[i].banned_token < vocab) {
      banned_row.push_back(static_cast<int64_t>(i));
      banned_id.push_back(rows[i].banned_token);
    }
  if (!banned_row.empty()) {
    if (z.is_same(raw)) z = z.clone();
    z.index_put_({at::tensor(banned_row, long_options), at::tensor(banned_id, long_options)},
                 -std::numeric_limits<float>::infinity());
  }
  return z;
}

// A failed row's message: its first NaN or +inf logit (a failure path: one more copy).
std::string first_bad_logit(const at::Tensor& z_row) {
  const at::Tensor bad = at::isnan(z_row).logical_or(z_row == std::numeric_limits<float>::infinity());
  const int64_t at_id = bad.to(at::kInt).argmax().item<int64_t>();
  return "TokenSampler: logit of token " + std::to_string(at_id) + " is " + std::to_string(z_row[at_id].item<float>());
}

// Each row's filtered distribution in draw order: `ids` [m, V] (decreasing logit, lower id
// first among equals), `probs` [m, V] float64 (0 for filtered tokens), `keep` [m, V] and the
// last kept index [m, 1]. Greedy rows keep their first maximum alone. Every cumulative sum a
// sequential scan, as a host loop would add.
struct Filtered {
  at::Tensor ids, probs, keep, last_kept;
};

Filtered filtered(const at::Tensor& z, const std::vector<SampleRow>& rows) {
  const int64_t m = z.size(0), vocab = z.size(1);
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(z.device());
  const auto double_options = long_options.dtype(at::kDouble);
  std::vector<int64_t> k;
  std::vector<double> inv_t, top_p;
  for (const SampleRow& r : rows) {
    const bool greedy = r.options.greedy;
    k.push_back(greedy ? 1 : r.options.top_k > 0 ? std::min(r.options.top_k, vocab) : vocab);
    inv_t.push_back(greedy ? 1.0 : 1.0 / r.options.temperature);
    top_p.push_back(greedy ? 1.0 : r.options.top_p);
  }
  const at::Tensor k_t = at::tensor(k, long_options).view({m, 1});
  const at::Tensor p_t = at::tensor(top_p, double_options).view({m, 1});
  Filtered f;
  at::Tensor sorted;
  std::tie(sorted, f.ids) = at::sort(z, /*stable=*/true, /*dim=*/1, /*descending=*/true);
  const at::Tensor scaled = sorted.to(at::kDouble) * at::tensor(inv_t, double_options).view({m, 1});
  const at::Tensor in_k = at::arange(vocab, long_options).view({1, vocab}) < k_t;
  const at::Tensor e = at::exp(scaled - scaled.narrow(1, 0, 1)).masked_fill(in_k.logical_not(), 0.0);
  at::Tensor probs = e / at::cumsum(e, 1).gather(1, k_t - 1);  // softmax over the top-k
  // Nucleus (rows with top_p < 1): keep a token while the mass before it is below top_p.
  const at::Tensor before = at::cat({at::zeros({m, 1}, double_options), at::cumsum(probs, 1).narrow(1, 0, vocab - 1)}, 1);
  const at::Tensor nucleus = p_t < 1.0;
  f.keep = in_k.logical_and(nucleus.logical_not().logical_or(before < p_t));
  // (a row with a NaN fails anyway; clamped so that it keeps an index)
  f.last_kept = (f.keep.sum(1, /*keepdim=*/true) - 1).clamp_min(0);
  probs = probs.masked_fill(f.keep.logical_not(), 0.0);
  f.probs = at::where(nucleus, probs / at::cumsum(probs, 1).gather(1, f.last_kept), probs);
  return f;
}

// The sampled rows' tokens [m] (greedy rows: their first maximum): the first kept token, in
// draw order, whose cumulative probability exceeds the row's uniform, else the last kept one.
at::Tensor drawn_tokens(const Filtered& f, const std::vector<SampleRow>& rows) {
  const int64_t m = f.probs.size(0);
  std::vector<double> u;
  for (const SampleRow& r : rows) u.push_back(r.options.greedy ? 0.0 : r.uniform);
  const at::Tensor u_t = at::tensor(u, f.probs.options()).view({m, 1});
  const at::Tensor hit = f.keep.logical_and(u_t < at::cumsum(f.probs, 1));
  const at::Tensor first = at::where(hit.any(1, /*keepdim=*/true), hit.to(at::kInt).argmax(1, /*keepdim=*/true), f.last_kept);
  return f.ids.gather(1, first).squeeze(1);
}

// [m, V] float64 in id order.
at::Tensor in_id_order(const Filtered& f) { return at::zeros_like(f.probs).scatter(1, f.ids, f.probs); }

// Speculative rows with a draft distribution q (Leviathan et al. 2023, "Fast Inference from
// Transformers via Speculative Decoding", Algorithm 1): the draft x is accepted when
// accept_uniform · q(x) < p(x), i.e. with probability min(1, p(x) / q(x)); otherwise the token
// is drawn, with the row's uniform and in id order, from normalize(max(0, p − q)) (from p
// where that is all zero, which only p = q gives, where no rejection happens). Greedy rows
// accept while their maximum is the draft. Returns (accepted [m] bool, token [m]).
std::pair<at::Tensor, at::Tensor> verify_with_draft_probs(const Filtered& f, const at::Tensor& sampled,
                                                          const at::Tensor& draft, const at::Tensor& q,
                                                          const std::vector<SampleRow>& rows) {
  const int64_t m = f.probs.size(0);
  const auto double_options = f.probs.options();
  std::vector<double> accept_u, u;
  std::vector<int64_t> greedy;
  for (const SampleRow& r : rows) {
    accept_u.push_back(r.accept_uniform);
    u.push_back(r.options.greedy ? 0.0 : r.uniform);
    greedy.push_back(r.options.greedy ? 1 : 0);
  }
  const at::Tensor is_greedy = at::tensor(greedy, double_options.dtype(at::kLong)) != 0;
  const at::Tensor p = in_id_order(f);
  const at::Tensor x = draft.clamp_min(0).view({m, 1});
  const at::Tensor px = p.gather(1, x).squeeze(1), qx = q.to(at::kDouble).gather(1, x).squeeze(1);
  const at::Tensor accepted =
      at::where(is_greedy, sampled == draft, at::tensor(accept_u, double_options) * qx < px).logical_and(draft >= 0);
  at::Tensor residual = (p - q.to(at::kDouble)).clamp_min(0.0);
  const at::Tensor mass = residual.sum(1, /*keepdim=*/true);
  residual = at::where(mass > 0, residual / mass.clamp_min(std::numeric_limits<double>::min()), p);
  const at::Tensor cumulative = at::cumsum(residual, 1);
  const at::Tensor hit = (residual > 0).logical_and(at::tensor(u, double_options).view({m, 1}) < cumulative);
  // u above the rounded total: the last token with residual mass.
  const int64_t vocab = p.size(1);
  const at::Tensor last = (residual > 0).to(at::kLong) * at::arange(vocab, draft.options()).view({1, vocab});
  const at::Tensor resampled = at::where(hit.any(1), hit.to(at::kInt).argmax(1), last.amax(1));
  const at::Tensor token = at::where(is_greedy, sampled, at::where(accepted, draft, resampled));
  return {accepted, at::where(draft >= 0, token, sampled)};
}

}  // namespace

at::Tensor processed_logits(const at::Tensor& logits, const std::vector<SampleRow>& rows) {
  check_logits(logits, rows);
  at::NoGradGuard no_grad;
  const at::Tensor z = processed(logits.to(at::kFloat).contiguous(), rows);
  return z.is_same(logits) ? z.clone() : z;  // never the caller's own tensor
}

at::Tensor sampling_probabilities(const at::Tensor& logits, const std::vector<SampleRow>& rows) {
  check_logits(logits, rows);
  at::NoGradGuard no_grad;
  if (rows.empty()) return at::zeros({0, logits.size(1)}, logits.options().dtype(at::kDouble));
  return in_id_order(filtered(processed(logits.to(at::kFloat).contiguous(), rows), rows));
}

SampledRows sample_rows(const at::Tensor& logits, const std::vector<SampleRow>& rows, const at::Tensor& draft_probs) {
  const int64_t m = static_cast<int64_t>(rows.size());
  check_logits(logits, rows);
  SampledRows out;
  if (m == 0) return out;
  at::NoGradGuard no_grad;
  const int64_t vocab = logits.size(1);
  const auto double_options = at::TensorOptions().dtype(at::kDouble).device(logits.device());
  const at::Tensor raw = logits.to(at::kFloat).contiguous();
  const at::Tensor z = processed(raw, rows);
  // Greedy: the first maximum. A NaN or +inf logit fails its row (the host sampler's check): its
  // maximum is NaN or +inf exactly then (max propagates NaN), so one pass gives both; the first
  // bad logit, for the message, is looked up only for a failed row, after the copy to the host.
  auto [row_max, token] = at::max(z, 1);
  const at::Tensor bad = at::isnan(row_max).logical_or(row_max == std::numeric_limits<float>::infinity());
  bool any_sampled = false, any_draft = false, any_logprob = false;
  std::vector<int64_t> greedy, drafts, asked;
  for (const SampleRow& r : rows) {
    greedy.push_back(r.options.greedy ? 1 : 0);
    any_sampled = any_sampled || !r.options.greedy;
    any_draft = any_draft || r.draft_token >= 0;
    asked.push_back(r.logprob || r.top_logprobs > 0 ? 1 : 0);
    any_logprob = any_logprob || asked.back() != 0;
    if (r.draft_token >= vocab)
      throw std::invalid_argument("sample_rows: draft token " + std::to_string(r.draft_token) +
                                  " is outside the vocabulary of " + std::to_string(vocab));
    drafts.push_back(r.draft_token);
  }
  if (draft_probs.defined() && (draft_probs.dim() != 2 || draft_probs.size(0) != m || draft_probs.size(1) != vocab))
    throw std::invalid_argument("sample_rows: expected draft probabilities [" + std::to_string(m) + ", " +
                                std::to_string(vocab) + "], found " + c10::str(draft_probs.sizes()));
  std::optional<Filtered> f;
  if (any_sampled || draft_probs.defined()) {
    f = filtered(z, rows);
    const at::Tensor is_greedy = at::tensor(greedy, double_options.dtype(at::kLong)) != 0;
    token = at::where(is_greedy, token, drawn_tokens(*f, rows));
  }
  // Speculative rows: a point-mass draft (n-gram) is accepted when the row's own draw is the
  // draft, i.e. with probability p(x), and a rejected row's draw is then distributed as
  // normalize(max(0, p − δx)): Leviathan et al.'s rule for q = δx, with the draw a request
  // makes without speculation.
  at::Tensor accepted = at::zeros({m}, double_options.dtype(at::kBool));
  if (any_draft) {
    const at::Tensor draft = at::tensor(drafts, double_options.dtype(at::kLong));
    if (draft_probs.defined()) {
      std::tie(accepted, token) = verify_with_draft_probs(*f, token, draft, draft_probs, rows);
    } else {
      accepted = (token == draft).logical_and(draft >= 0);
    }
  }
  token = at::where(bad, at::full_like(token, -1), token);
  // Log-probabilities of the raw logits, in float64, for the rows that ask (NaN for the others,
  // whatever shares the call): the full-vocabulary log-softmax is most of a small model's
  // sampling time, so a call where no row asks skips it.
  const double none = std::numeric_limits<double>::quiet_NaN();
  at::Tensor logprob = at::full({m, 1}, none, double_options), lse;
  if (any_logprob) {
    const at::Tensor x = raw.to(at::kDouble);
    const at::Tensor mx = x.amax(1, /*keepdim=*/true);
    lse = mx + at::log(at::exp(x - mx).sum(1, /*keepdim=*/true));
    const at::Tensor asked_t = at::tensor(asked, double_options.dtype(at::kLong)).view({m, 1}) != 0;
    logprob = at::where(asked_t, x.gather(1, token.clamp_min(0).view({m, 1})) - lse, logprob);
  }
  int64_t top = 0;
  for (const SampleRow& r : rows) top = std::max(top, std::min(r.top_logprobs, vocab));
  std::vector<at::Tensor> columns{token.view({m, 1}).to(at::kDouble), logprob, accepted.view({m, 1}).to(at::kDouble)};
  if (top > 0) {
    const auto [best, best_ids] = at::sort(raw, /*stable=*/true, /*dim=*/1, /*descending=*/true);
    columns.push_back(best_ids.narrow(1, 0, top).to(at::kDouble));
    columns.push_back(best.narrow(1, 0, top).to(at::kDouble) - lse);
  }
  // The one device-to-host copy of the step's choices.
  const at::Tensor host = at::cat(columns, 1).to(at::kCPU).contiguous();
  const double* h = host.data_ptr<double>();
  const int64_t width = host.size(1);
  for (int64_t i = 0; i < m; ++i) {
    const double* row = h + i * width;
    out.tokens.push_back(static_cast<int64_t>(row[0]));
    out.errors.push_back(row[0] < 0 ? first_bad_logit(z[i]) : std::string());
    out.logprobs.push_back(row[1]);
    out.accepted.push_back(row[2] != 0);
    std::vector<std::pair<int64_t, double>> alternatives;
    for (int64_t j = 0; j < std::min(rows[static_cast<size_t>(i)].top_logprobs, top); ++j)
      alternatives.emplace_back(static_cast<int64_t>(row[3 + j]), row[3 + top + j]);
    out.top.push_back(std::move(alternatives));
  }
  return out;
}

}  // namespace loom::generate
