// A whole checkpointed model rebuilt for inference under any tensor-parallel size t: the
// global tensors of checkpoint_reader.h are sliced for this rank exactly as GptStage slices
// its initial weights (model::shard along each parameter's partition dimension), so a
// checkpoint written at any (t, p, v) loads at any t that divides the heads and the FFN.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <set>
#include <string>

#include "generate/checkpoint_reader.h"
#include "model/gpt_config.h"
#include "model/gpt_stage.h"
#include "runtime/communicator.h"

namespace loom::generate {

/// Model fields metadata.json does not record; from the run's recipe when there is one.
struct InferenceModelOptions {
  double layernorm_epsilon = 1e-5;
  int64_t make_vocab_size_divisible_by = 128;
};

/// The config of the checkpoint's model for inference: its recorded shape
/// (CheckpointLayout::model_shape, sequences up to max_position_embeddings), the options'
/// LayerNorm epsilon and vocabulary padding, float32 parameters, no dropout, no sequence
/// parallelism, no recomputation.
model::GptConfig inference_config(const ModelShape& model_shape, const InferenceModelOptions& options = {});

/// Fills every parameter of `stage` (any pipeline stage of any layout) with its slice for tensor
/// rank `tp_rank` of `tp_size`, taken from the checkpoint's global tensors (converted to the
/// stage's dtype and device); the last stage's copy of the tied word embedding comes from the
/// embedding. Returns the names of the checkpoint parameters used. Throws
/// train::CheckpointError naming the parameter when the checkpoint lacks one or holds one of
/// another global shape.
std::set<std::string> fill_stage_parameters(const FullCheckpoint& checkpoint,
                                            const model::GptStage& stage, int tp_rank, int tp_size);

/// Builds stage `layout` of `config` on `device` for tensor rank `tp_rank` of `tp_size` and fills
/// every parameter from `checkpoint` (fill_stage_parameters). No initial values are drawn
/// (model::SkipInitialValues): none would survive the fill. `used`, when given, receives the
/// names of the checkpoint parameters used. Throws as GptStage's constructor and
/// fill_stage_parameters do.
model::GptStage load_stage(const FullCheckpoint& checkpoint, const model::GptConfig& config,
                           runtime::CommunicatorPtr tp, model::StageChunk layout, at::Device device,
                           int tp_rank, int tp_size, std::set<std::string>* used = nullptr);

/// Builds the whole model (one stage, layers 0..L-1) for TP group `tp` and fills every
/// parameter with its slice of the checkpoint (converted to float32). The word embedding's
/// rows past vocab_size are re-padded with zeros to this t's padded vocabulary. Throws
/// std::invalid_argument when the model does not fit t (heads or FFN not divisible), and
/// train::CheckpointError naming the parameter when the checkpoint lacks one, has one the
/// model does not, or holds one of another global shape.
model::GptStage load_inference_model(const FullCheckpoint& checkpoint,
                                     const model::GptConfig& config, runtime::CommunicatorPtr tp,
                                     at::Device device = at::kCPU);

}  // namespace loom::generate
