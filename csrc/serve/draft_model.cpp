#include "serve/draft_model.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <numeric>
#include <stdexcept>

#include "generate/sampling_batch.h"

namespace loom::serve {

namespace {

constexpr int64_t kDraftBlock = 16;

model::KvCache draft_cache(const model::GptStage& m, int64_t rows, int64_t blocks_per_row) {
  const model::ParamList params = m.parameters();
  if (params.empty()) throw std::invalid_argument("--draft-checkpoint: the draft model is empty");
  const at::Tensor& any = params.front().tensor;
  const auto& c = m.config();
  return model::KvCache::paged(0, m.num_local_layers(), rows, rows * blocks_per_row, kDraftBlock, c.query_groups(),
                               c.head_dim(), at::TensorOptions().dtype(any.scalar_type()).device(any.device()));
}

}  // namespace

DraftModel::DraftModel(const model::GptStage& model, int64_t rows, int64_t context, int64_t target_vocab)
    : model_(model),
      blocks_per_row_((std::min(context, model.config().max_position_embeddings) + kDraftBlock - 1) / kDraftBlock),
      cache_(draft_cache(model, rows, blocks_per_row_)),
      computed_(static_cast<size_t>(rows), 0) {
  if (model.config().vocab_size != target_vocab)
    throw std::invalid_argument(fmt::format("--draft-checkpoint: the draft model's vocabulary has {} tokens, the "
                                            "served model's {}: a draft must share the tokenizer",
                                            model.config().vocab_size, target_vocab));
  if (!model.layout().pre_process || !model.layout().post_process)
    throw std::invalid_argument("--draft-checkpoint: the draft model must be whole (one stage)");
}

void DraftModel::keep(int64_t row, int64_t positions) {
  int64_t& c = computed_.at(static_cast<size_t>(row));
  c = std::min(c, positions);
}

void DraftModel::draft(std::vector<DraftJob>& jobs) {
  at::NoGradGuard no_grad;
  const int64_t vocab = model_.config().vocab_size;
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(model_.parameters().front().tensor.device());
  int64_t round = 0;
  while (true) {
    // This round's flat batch: the context the draft has not seen (round 0) or the last draft.
    std::vector<DraftJob*> active;
    std::vector<int64_t> rows, counts, flat, out;
    for (DraftJob& j : jobs) {
      if (round >= j.k) continue;
      int64_t& done = computed_.at(static_cast<size_t>(j.row));
      std::vector<int64_t> sequence = *j.context;
      sequence.insert(sequence.end(), j.tokens.begin(), j.tokens.end());
      // A draft past the draft model's own context: stop drafting this request.
      if (static_cast<int64_t>(sequence.size()) > blocks_per_row_ * kDraftBlock ||
          static_cast<int64_t>(sequence.size()) > model_.config().max_position_embeddings) {
        j.k = round;
        continue;
      }
      done = std::min(done, static_cast<int64_t>(sequence.size()) - 1);  // the last token always runs
      std::vector<int64_t> blocks(static_cast<size_t>(blocks_per_row_));
      std::iota(blocks.begin(), blocks.end(), j.row * blocks_per_row_);
      cache_.set_row(j.row, blocks, done);
      rows.push_back(j.row);
      counts.push_back(static_cast<int64_t>(sequence.size()) - done);
      flat.insert(flat.end(), sequence.begin() + done, sequence.end());
      out.push_back(static_cast<int64_t>(flat.size()) - 1);
      done = static_cast<int64_t>(sequence.size());
      active.push_back(&j);
    }
    if (active.empty()) break;
    cache_.select_flat(rows, counts);
    const at::Tensor input = at::tensor(flat, long_options).view({1, static_cast<int64_t>(flat.size())});
    const at::Tensor logits =
        model_.forward_cached(input, cache_, {}, at::tensor(out, long_options)).select(1, 0).narrow(-1, 0, vocab);
    cache_.select_rows({});
    // Each request's next draft from q = its sampling distribution of the draft's logits.
    std::vector<generate::SampleRow> sample;
    std::vector<std::vector<int64_t>> penalized(active.size());
    for (size_t i = 0; i < active.size(); ++i) {
      DraftJob& j = *active[i];
      penalized[i] = *j.context;
      penalized[i].insert(penalized[i].end(), j.tokens.begin(), j.tokens.end());
      generate::SampleRow r;
      r.options = j.options;
      r.penalized = &penalized[i];
      r.banned_token = round < j.banned_until ? j.banned_token : -1;
      r.uniform = j.options.greedy ? 0.0 : j.uniform(round);
      r.logprob = false;  // a draft's token only
      sample.push_back(r);
    }
    const generate::SampledRows chosen = generate::sample_rows(logits, sample);
    const at::Tensor q = generate::sampling_probabilities(logits, sample);
    for (size_t i = 0; i < active.size(); ++i) {
      DraftJob& j = *active[i];
      if (!chosen.errors[i].empty()) {  // a non-finite draft logit: no more drafts (the target decides)
        j.k = round;
        continue;
      }
      j.tokens.push_back(chosen.tokens[i]);
      j.probs.push_back(q[static_cast<int64_t>(i)]);
    }
    ++round;
  }
  // The last draft was never run: the draft holds the context and drafts [0, k - 1).
  for (DraftJob& j : jobs) {
    int64_t& done = computed_.at(static_cast<size_t>(j.row));
    done = std::min(done, static_cast<int64_t>(j.context->size() + j.tokens.size()) - 1);
    if (j.tokens.empty()) done = std::min(done, static_cast<int64_t>(j.context->size()) - 1);
    j.k = static_cast<int64_t>(j.tokens.size());
  }
}

}  // namespace loom::serve
