#include "model/gpt_stage.h"

#include <optional>

#include <ATen/ATen.h>

#include <stdexcept>

#include "model/activation_memory.h"
#include "model/cross_entropy.h"
#include "model/document_mask.h"
#include "model/embedding.h"
#include "model/init.h"
#include "model/layer_norm.h"
#include "model/mappings.h"
#include "model/parallel_linear.h"
#include "model/pipeline_split.h"
#include "model/recompute.h"
#include "model/rotary.h"
#include "model/transformer_layer.h"
#include "rules/layout_rules.h"

namespace loom::model {

at::ScalarType scalar_type(Precision d) {
  switch (d) {
    case Precision::kFp32: return at::kFloat;
    case Precision::kBf16: return at::kBFloat16;
    case Precision::kFp16: return at::kHalf;
  }
  return at::kFloat;
}

rules::PipelineSplit pipeline_split(const GptConfig& config, int64_t p, int64_t v) {
  Layout layout = config.layout;
  layout.pp = static_cast<int>(p);
  layout.vp = static_cast<int>(v);
  return layout.split(config.num_layers);
}

std::vector<StageChunk> pipeline_stage_layouts(const GptConfig& config, int p, int v,
                                                int pp_rank) {
  const rules::PipelineSplit split = pipeline_split(config, p, v);
  rules::throw_if_any(rules::pipeline_violations(split), "pipeline_stage_layouts:");
  if (pp_rank < 0 || pp_rank >= p)
    throw std::invalid_argument("pipeline_stage_layouts: expected 0 <= rank < p = " + std::to_string(p) +
                                ", found rank " + std::to_string(pp_rank));
  const auto ranges = rules::virtual_stage_layer_ranges(split);
  std::vector<StageChunk> out;
  for (int k = 0; k < v; ++k) {
    const int virtual_stage = k * p + pp_rank;
    StageChunk l;
    l.first_layer = static_cast<int>(ranges[virtual_stage].first);
    l.last_layer = static_cast<int>(ranges[virtual_stage].last);
    l.pre_process = virtual_stage == 0;
    l.post_process = virtual_stage == p * v - 1;
    out.push_back(l);
  }
  return out;
}

GptStage::GptStage(const GptConfig& config, runtime::CommunicatorPtr tp, StageChunk layout,
                   at::Device device)
    : config_(config), tp_(std::move(tp)), layout_(layout) {
  config_.validate(tp_->size());
  // Sequence parallelism splits nothing over one rank: normalised here, once, so the layers
  // built from config_ read the field as it is (the recipe loader does the same for recipes).
  config_.layout.sequence_parallel = config_.layout.sequence_parallel && tp_->size() > 1;
  if (layout_.last_layer < 0) layout_.last_layer = config_.num_layers;
  if (layout_.first_layer < 0 || layout_.first_layer > layout_.last_layer ||
      layout_.last_layer > config_.num_layers)
    throw std::invalid_argument("GptStage: layer range [" + std::to_string(layout_.first_layer) +
                                ", " + std::to_string(layout_.last_layer) +
                                ") does not fit num_layers " + std::to_string(config_.num_layers));
  const auto options = at::TensorOptions().dtype(scalar_type(config_.params_dtype)).device(device);
  // On the meta device only shapes are wanted: skip drawing the full initial weights.
  std::optional<ShapesOnlyInit> shapes_only;
  if (device.is_meta()) shapes_only.emplace();
  if (layout_.pre_process) embedding_ = std::make_unique<GptEmbedding>(config_, tp_, options);
  for (int i = layout_.first_layer; i < layout_.last_layer; ++i)
    layers_.push_back(std::make_shared<TransformerLayer>(config_, i, tp_, options));
  if (layout_.post_process) {
    final_ln_ = std::make_unique<LayerNorm>("final_layernorm", config_.hidden_size,
                                            config_.layernorm_epsilon,
                                            config_.layout.sequence_parallel, options,
                                            config_.normalization, config_.bias,
                                            config_.persist_layer_norm);
    if (!tied_output())  // the model's own output weight, column-parallel over the vocabulary
      output_word_ = make_parameter(shard(initial_output_weight(config_, tp_->size()), 0, tp_->rank(), tp_->size()),
                                    options);
    else if (!layout_.pre_process)  // initialised exactly like the first stage's word embedding
      output_word_ = make_parameter(shard(GptEmbedding::initial_word_weight(config_, tp_->size()),
                                          0, tp_->rank(), tp_->size()),
                                    options);
  }
  // The read hook's parts, in parameters() order: embedding, each layer, the head.
  ParamList scratch;
  if (embedding_) embedding_->collect(scratch);
  part_end_.push_back(scratch.size());
  for (const auto& layer : layers_) {
    layer->collect(scratch);
    part_end_.push_back(scratch.size());
  }
  part_end_.push_back(parameters().size());
}

at::Tensor initial_output_weight(const GptConfig& config, int tensor_parallel) {
  const int64_t padded = config.padded_vocab_size(tensor_parallel);
  at::Tensor real = full_normal(config.seed, "output_layer.weight", {config.vocab_size, config.hidden_size},
                                config.init_method_std);
  if (padded == config.vocab_size) return real;
  return at::cat({real, at::zeros({padded - config.vocab_size, config.hidden_size}, real.options())});
}

GptStage::~GptStage() = default;
GptStage::GptStage(GptStage&&) noexcept = default;

int64_t GptStage::padded_vocab_size() const { return config_.padded_vocab_size(tp_->size()); }

void GptStage::before_reading(size_t part) const {
  if (read_hook_) read_hook_(part == 0 ? 0 : part_end_[part - 1], part_end_[part]);
}

at::Tensor GptStage::run_layers(at::Tensor x, const DropoutContext& dropout, const RotaryTables& rotary,
                                const DocumentMask& document) const {
  const int n = static_cast<int>(layers_.size());
  const RecomputeSettings& recompute = config_.layout.recompute;
  if (!recompute.full()) {
    for (int i = 0; i < n; ++i) {
      before_reading(1 + i);
      x = layers_[i]->forward(x, dropout, rotary, document);
    }
    return x;
  }
  const int k = recompute.num_layers_or_one();
  auto chunk_fn = [this, dropout, rotary, document](int begin, int end) -> ChunkForward {
    return [this, dropout, rotary, document, begin, end](const at::Tensor& input) {
      at::Tensor h = input;
      for (int i = begin; i < end; ++i) {
        before_reading(1 + i);
        h = layers_[i]->forward(h, dropout, rotary, document);
      }
      return h;
    };
  };
  if (recompute.method_or_uniform() == RecomputeMethod::kUniform) {
    // Chunks of k layers; the last chunk is shorter when k does not divide the stage's layers.
    for (int begin = 0; begin < n; begin += k) {
      const int end = std::min(n, begin + k);
      ActivationScope scope(layers_[begin]->layer());
      x = checkpoint(chunk_fn(begin, end), x);
    }
  } else {
    // Block: the first k layers of the stage are recomputed one by one, the rest are not.
    for (int i = 0; i < n; ++i) {
      if (i < k) {
        ActivationScope scope(layers_[i]->layer());
        x = checkpoint(chunk_fn(i, i + 1), x);
      } else {
        before_reading(1 + i);
        x = layers_[i]->forward(x, dropout, rotary, document);
      }
    }
  }
  return x;
}

at::Tensor GptStage::forward(const StageInputs& in, const DropoutContext& dropout) const {
  const int t = tp_->size();
  const bool sp = config_.layout.sequence_parallel;
  at::Tensor x;
  if (layout_.pre_process) {
    if (!in.tokens.defined() || !in.position_ids.defined())
      throw std::invalid_argument("GptStage::forward: the first stage needs tokens and position_ids [b, s]");
    if (sp && in.tokens.size(1) % t != 0)
      throw std::invalid_argument("GptStage::forward: sequence_parallel needs the sequence length " +
                                  std::to_string(in.tokens.size(1)) +
                                  " divisible by tensor_model_parallel_size " + std::to_string(t));
    before_reading(0);
    x = embedding_->forward(in.tokens, in.position_ids, dropout, in.prompt);
  } else {
    if (!in.hidden.defined() || in.hidden.dim() != 3 || in.hidden.size(2) != config_.hidden_size)
      throw std::invalid_argument("GptStage::forward: a later stage needs the hidden tensor [s" +
                                  std::string(sp ? "/t" : "") + ", b, " +
                                  std::to_string(config_.hidden_size) + "] of the previous stage");
    x = in.hidden;
  }
  const int64_t s = sp ? x.size(0) * t : x.size(0);
  x = run_layers(x, dropout, stage_rotary(in.position_ids, x),
                 stage_document_mask(in.segment_ids, x.size(1), s, x.scalar_type()));
  if (!layout_.post_process) return x;

  if (layout_.pre_process && tied_output()) before_reading(0);  // the output layer is the word embedding
  before_reading(part_end_.size() - 1);
  x = final_ln_->forward(x);
  const at::Tensor& word = output_weight();
  at::Tensor logits = sp ? linear_with_sequence_parallel_gather(x, word, std::nullopt, tp_)
                         : at::linear(copy_to_tensor_model_parallel_region(x, tp_), word);
  if (!in.labels.defined()) return logits;  // [s, b, V_padded/t]
  if (in.labels.dim() != 2 || in.labels.size(1) != logits.size(0) ||
      in.labels.size(0) != logits.size(1))
    throw std::invalid_argument("GptStage::forward: labels must be [b, s] = [" +
                                std::to_string(logits.size(1)) + ", " +
                                std::to_string(logits.size(0)) + "], found " +
                                c10::str(in.labels.sizes()));
  at::Tensor loss = vocab_parallel_cross_entropy(logits, in.labels.t(), tp_, config_.vocab_size,
                                                 config_.label_smoothing);
  return loss.t();  // [b, s]
}

bool GptStage::tied_output() const { return config_.share_embeddings_and_output_weights; }

const at::Tensor& GptStage::output_weight() const {
  return layout_.pre_process && tied_output() ? embedding_->word_weight() : output_word_;
}

RotaryTables GptStage::stage_rotary(const at::Tensor& position_ids, const at::Tensor& hidden) const {
  if (config_.position_embedding_type != PositionEmbedding::kRope) return {};
  at::Tensor ids = position_ids;
  if (!ids.defined()) {
    // A later pipeline stage that was not handed the ids: the trainer's positions 0..s-1.
    const int64_t s = hidden.size(0) * (config_.layout.sequence_parallel ? tp_->size() : 1);
    ids = at::arange(s, at::TensorOptions().dtype(at::kLong).device(hidden.device()))
              .unsqueeze(0)
              .expand({hidden.size(1), s});
  }
  return rotary_tables(ids, config_, hidden.scalar_type());
}

DocumentMask GptStage::stage_document_mask(const at::Tensor& segment_ids, int64_t b, int64_t s,
                                           at::ScalarType dtype) const {
  if (!segment_ids.defined()) return {};
  if (segment_ids.dim() != 2 || segment_ids.size(0) != b || segment_ids.size(1) != s)
    throw std::invalid_argument("GptStage::forward: segment_ids must be [b, s] = [" + std::to_string(b) + ", " +
                                std::to_string(s) + "], found " + c10::str(segment_ids.sizes()));
  return document_mask(segment_ids, config_.use_flash_attention, dtype);
}

ParamList GptStage::parameters() const {
  ParamList out;
  if (embedding_) embedding_->collect(out);
  for (const auto& layer : layers_) layer->collect(out);
  if (final_ln_) final_ln_->collect(out);
  if (output_word_.defined()) {
    Param w{"output_layer.weight", output_word_, 0};
    // The last stage's copy of the tied embedding, or the model's own output layer.
    w.word_embedding = w.shared_duplicate = tied_output();
    out.push_back(w);
  }
  return out;
}

}  // namespace loom::model
