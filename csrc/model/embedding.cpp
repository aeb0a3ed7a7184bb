#include "model/embedding.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "model/init.h"
#include "model/mappings.h"

namespace loom::model {

at::Tensor GptEmbedding::initial_word_weight(const GptConfig& config, int tensor_parallel) {
  const int64_t padded = config.padded_vocab_size(tensor_parallel);
  at::Tensor real = full_normal(config.seed, "embedding.word_embeddings.weight",
                                {config.vocab_size, config.hidden_size}, config.init_method_std);
  if (padded == config.vocab_size) return real;
  return at::cat({real, at::zeros({padded - config.vocab_size, config.hidden_size}, real.options())});
}

GptEmbedding::GptEmbedding(const GptConfig& config, runtime::CommunicatorPtr tp,
                           const at::TensorOptions& options)
    : config_(config), tp_(std::move(tp)) {
  word_ = make_parameter(shard(initial_word_weight(config, tp_->size()), 0, tp_->rank(), tp_->size()),
                         options);
  // Rotary positions act inside attention (rotary.h): no position table then.
  if (config.position_embedding_type == PositionEmbedding::kLearnedAbsolute)
    position_ = make_parameter(
        full_normal(config.seed, "embedding.position_embeddings.weight",
                    {config.max_position_embeddings, config.hidden_size}, config.init_method_std),
        options);
}

at::Tensor GptEmbedding::forward(const at::Tensor& tokens, const at::Tensor& position_ids,
                                 const DropoutContext& dropout, const PromptSplice& prompt) const {
  if (tokens.dim() != 2 || position_ids.sizes() != tokens.sizes())
    throw std::invalid_argument("GptEmbedding: expected tokens and position_ids [b, s], found " +
                                c10::str(tokens.sizes()) + " and " +
                                c10::str(position_ids.sizes()));
  // Reading the range back from a device would stall the step on every micro-batch, so ids on
  // a device are trusted: the trainer's data were checked against the vocabulary when the
  // datasets were opened (data::GptDataConfig::vocab_size) and generation checks its prompt.
  if (tokens.numel() > 0 && tokens.is_cpu()) {
    const int64_t lo = tokens.min().item<int64_t>(), hi = tokens.max().item<int64_t>();
    if (lo < 0 || hi >= config_.vocab_size)
      throw std::invalid_argument("GptEmbedding: token ids must lie in [0, " +
                                  std::to_string(config_.vocab_size) + "), found [" +
                                  std::to_string(lo) + ", " + std::to_string(hi) + "]");
    const int64_t plo = position_ids.min().item<int64_t>(), phi = position_ids.max().item<int64_t>();
    if (plo < 0 || phi >= config_.max_position_embeddings)
      throw std::invalid_argument("GptEmbedding: position ids must lie in [0, " +
                                  std::to_string(config_.max_position_embeddings) + "), found [" +
                                  std::to_string(plo) + ", " + std::to_string(phi) + "]");
  }
  const int64_t b = tokens.size(0), s = tokens.size(1);
  const int t = tp_->size();
  const bool sp = config_.layout.sequence_parallel;
  if (sp && s % t != 0)
    throw std::invalid_argument("GptEmbedding: sequence parallelism needs the sequence length " +
                                std::to_string(s) + " divisible by the tensor-parallel size " +
                                std::to_string(t));

  // Word embedding: this rank's rows, zero for ids owned by other ranks.
  const int64_t v_local = word_.size(0);
  const int64_t start = tp_->rank() * v_local;
  at::Tensor tokens_sb = tokens.t();  // [s, b]
  at::Tensor foreign = (tokens_sb < start).logical_or(tokens_sb >= start + v_local);
  at::Tensor local_ids = (tokens_sb - start).masked_fill(foreign, 0);
  at::Tensor word = at::embedding(word_, local_ids);  // [s, b, h]
  if (t > 1) word = word.masked_fill(foreign.unsqueeze(-1), 0.0);
  if (prompt.active()) {
    // Splice into the whole reduced activation, identically on every tensor rank, so that
    // replicated prompt parameters get the same gradient everywhere; then keep this rank's
    // sequence shard (the split's backward all-gathers).
    word = reduce_from_tensor_model_parallel_region(word, tp_);
    word = at::index_put(word, {prompt.seq_index, prompt.batch_index},
                         prompt.vectors.to(word.scalar_type()));
    if (sp) word = scatter_to_sequence_parallel_region(word, tp_);
  } else {
    word = sp ? reduce_scatter_to_sequence_parallel_region(word, tp_)
              : reduce_from_tensor_model_parallel_region(word, tp_);
  }

  // Positions of the tokens this rank holds.
  const int64_t s_local = sp ? s / t : s;
  const int64_t seq_offset = sp ? tp_->rank() * s_local : 0;
  at::Tensor pos_ids = position_ids.t().narrow(0, seq_offset, s_local);
  at::Tensor emb = position_.defined() ? word + at::embedding(position_, pos_ids) : word;

  auto spec = dropout.hidden(config_.hidden_dropout, 0, ops::kDropoutSiteEmbedding, s, seq_offset,
                             b, config_.hidden_size);
  return spec.p > 0.0 ? ops::dropout(emb, spec) : emb;
}

void GptEmbedding::collect(ParamList& out) const {
  Param w{"embedding.word_embeddings.weight", word_, 0};
  // Tied to the output layer (its gradient summed with the last stage's copy) unless the model
  // has its own output weight.
  w.word_embedding = config_.share_embeddings_and_output_weights;
  out.push_back(w);
  if (!position_.defined()) return;
  Param p{"embedding.position_embeddings.weight", position_, -1};
  p.sequence_parallel = config_.layout.sequence_parallel;
  out.push_back(p);
}

}  // namespace loom::model
