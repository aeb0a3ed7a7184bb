// A GPT model chunk as one pipeline stage (or the whole model when p = 1) holds: the input
// embedding (first stage), transformer layers [first_layer, last_layer) of the global stack,
// the final norm and the output layer (tied to the word embedding, or its own column-parallel
// "output_layer.weight" with share_embeddings_and_output_weights false), plus the
// vocab-parallel loss (last stage). With rotary positions every stage derives the RoPE tables
// from the position ids (rotary.h), and with packed rows the document mask from the segment ids
// (document_mask.h): both are handed to every stage. Stages exchange the hidden tensor [s/t, b, h] under sequence parallelism,
// [s, b, h] otherwise. A pipeline stage with virtual chunks holds one GptStage per chunk
// (pipeline_stage_layouts). Recomputation follows the config (recompute.h, attention.h).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "model/dropout_context.h"
#include "model/gpt_config.h"
#include "model/lora_serving.h"
#include "model/parameter.h"
#include "model/prompt_splice.h"
#include "runtime/communicator.h"

namespace loom::model {

class GptEmbedding;
struct RotaryTables;
struct DocumentMask;
class KvCache;
class TransformerLayer;
class LayerNorm;

/// What one model chunk of a pipeline stage holds: its transformer layers and the model's ends.
struct StageChunk {
  int first_layer = 0;
  int last_layer = -1;       ///< exclusive; -1: num_layers
  bool pre_process = true;   ///< holds the embedding (first virtual stage)
  bool post_process = true;  ///< holds final LayerNorm, output layer and loss (last one)
};

/// The chunks of pipeline rank `pp_rank` for p stages with v virtual chunks each: chunk k
/// holds virtual stage k·p + pp_rank. With an even split that is layers
/// [(k·p + r)·n, (k·p + r + 1)·n), n = L/(p·v); with config's uneven first/last stage sizes the
/// ranges are rules::virtual_stage_layer_ranges' (docs/design/parallel_layout.md, "Uneven
/// stages"). Throws std::invalid_argument (the layout rule's message) for an illegal split or
/// a rank out of range.
std::vector<StageChunk> pipeline_stage_layouts(const GptConfig& config, int p, int v,
                                                int pp_rank);

/// The full untied output weight [V_padded, h] every layout starts from: N(0, init_method_std²)
/// drawn under the name "output_layer.weight", pad rows zero.
at::Tensor initial_output_weight(const GptConfig& config, int tensor_parallel);

/// The tensor dtype of params_dtype (float32, bfloat16, float16).
at::ScalarType scalar_type(Precision dtype);

struct StageInputs {
  at::Tensor tokens;        ///< [b, s] int64 (pre_process)
  /// [b, s] int64: the first stage's positions (learned embeddings, RoPE); a later stage reads
  /// them for RoPE (absent: 0..s-1 for every row). Packed rows restart them per example.
  at::Tensor position_ids;
  /// [b, s] integer, packed rows only, on every stage (docs/design/finetune.md, "Packed
  /// sequences"): the example of each position; attention stays within each example
  /// (document_mask.h). Undefined: each row is one sequence.
  at::Tensor segment_ids;
  at::Tensor hidden;        ///< [s(/t), b, h] from the previous stage (otherwise)
  at::Tensor labels;        ///< [b, s] int64 (post_process; undefined: return logits)
  PromptSplice prompt;      ///< virtual tokens for the embeddings (pre_process; prompt learning)
};

class GptStage {
 public:
  /// Builds this rank's shards of the stage's parameters on `device` (params_dtype). Calls
  /// config.validate(tp->size()); throws std::invalid_argument on a bad layout.
  GptStage(const GptConfig& config, runtime::CommunicatorPtr tp, StageChunk layout = {},
           at::Device device = at::kCPU);
  ~GptStage();
  GptStage(GptStage&&) noexcept;

  /// Returns, on a post_process stage, the per-token loss [b, s] (float32, identical on every
  /// TP rank; apply the loss mask and normalisation yourself), or with no labels this rank's
  /// logits [s, b, V_padded/t]; otherwise the hidden tensor for the next stage.
  at::Tensor forward(const StageInputs& inputs, const DropoutContext& dropout) const;

  /// Inference (cached_forward.cpp): an empty key/value cache of this stage's layers for
  /// `batch` sequences of up to `capacity` positions, in the parameters' dtype and device.
  KvCache make_kv_cache(int64_t batch, int64_t capacity) const;

  /// Inference, on any stage built without sequence parallelism: runs n new positions of each
  /// of the cache's selected rows (kv_cache.h; rows may have different lengths) without
  /// autograd or dropout, appends their keys and values to `cache` (then advances it by n).
  /// A first stage takes tokens [b, n] (positions from the cache), a later stage the previous
  /// stage's hidden [n, b, h]; a last stage returns this rank's logits [n, b, V_padded/t], equal
  /// (up to rounding) to the rows of forward() over each row's whole sequence so far, another
  /// stage the hidden [n, b, h] for the next. An active `prompt` splices virtual tokens among
  /// the n new positions (prompt_splice.h; its seq_index counts from 0 at the first new
  /// position). A defined `output_rows` (int64 [m] on the stage's device, indices into the n
  /// new positions) makes a last stage return the logits of those positions only, [m, b,
  /// V_padded/t] (the serving engine needs a chunk's last position, not all n). An active
  /// `served` adds the served LoRA adapters' updates to their tokens of the n·b new positions
  /// (lora_serving.h; inactive: the base model alone, unchanged). Throws
  /// std::invalid_argument for a bad input shape, sequence parallelism at t > 1, or positions
  /// past max_position_embeddings.
  at::Tensor forward_cached(const at::Tensor& input, KvCache& cache, const PromptSplice& prompt = {},
                            const at::Tensor& output_rows = {}, const LoraBatch& served = {}) const;

  /// This stage's parameters with their parallel attributes, in a fixed order.
  ParamList parameters() const;

  /// Called by forward() just before it reads a part of this stage's parameters, with the
  /// part's range [first, end) in parameters() order: the embedding, then each transformer
  /// layer (again when full recomputation reruns it in backward), then the final LayerNorm with
  /// the output layer (preceded by the embedding's range again when the output layer is this
  /// stage's word embedding). The distributed optimizer's overlapped parameter all-gather is
  /// waited for here, per bucket (train/param_gather_wait.h; Megatron-Core's forward pre-hooks).
  /// Empty (the default): nothing is called. Not called by forward_cached().
  using ParamReadHook = std::function<void(size_t first, size_t end)>;
  void set_param_read_hook(ParamReadHook hook) { read_hook_ = std::move(hook); }
  const ParamReadHook& param_read_hook() const { return read_hook_; }
  const GptConfig& config() const { return config_; }
  const StageChunk& layout() const { return layout_; }
  int64_t padded_vocab_size() const;
  int num_local_layers() const { return static_cast<int>(layers_.size()); }

 private:
  at::Tensor run_layers(at::Tensor x, const DropoutContext& dropout, const RotaryTables& rotary,
                        const DocumentMask& document) const;
  /// The document mask of `segment_ids` (undefined: inactive) for a batch of `b` rows of `s`
  /// positions, with the SDPA bias in `dtype` under use_flash_attention; throws
  /// std::invalid_argument naming segment_ids for another shape.
  DocumentMask stage_document_mask(const at::Tensor& segment_ids, int64_t b, int64_t s, at::ScalarType dtype) const;
  /// RoPE tables of the whole sequence for the layers (inactive with learned positions):
  /// from `position_ids` [b, s], or 0..s-1 when undefined (s from `hidden` [s(/t), b, h]).
  RotaryTables stage_rotary(const at::Tensor& position_ids, const at::Tensor& hidden) const;
  bool tied_output() const;                ///< share_embeddings_and_output_weights
  const at::Tensor& output_weight() const;  ///< this rank's output layer [V_padded/t, h]
  /// Runs the read hook for part `part`: 0 the embedding, 1 + k local layer k, then the head.
  void before_reading(size_t part) const;

  GptConfig config_;
  runtime::CommunicatorPtr tp_;
  StageChunk layout_;
  std::unique_ptr<GptEmbedding> embedding_;
  std::vector<std::shared_ptr<TransformerLayer>> layers_;
  std::unique_ptr<LayerNorm> final_ln_;
  /// The untied output layer, or the last stage's own copy of the tied embedding when it has
  /// no embedding.
  at::Tensor output_word_;
  std::vector<size_t> part_end_;  ///< end of each part's range in parameters() (before_reading)
  ParamReadHook read_hook_;
};

}  // namespace loom::model
