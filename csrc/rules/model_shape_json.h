// The model shape as a checkpoint records it: the "model" object of metadata.json's "layout"
// (docs/design/formats.md, "Checkpoints"). One writer and one reader for the trainer's
// checkpoints, every command that reads one (generate, serve, eval, ptune, convert) and the
// planner's `plan infer --checkpoint`. Torch-free.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <string>

#include "rules/model_shape.h"

namespace loom {

/// {"num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size",
/// "max_position_embeddings"}, integers, the keys checkpoints have always carried:
/// ffn_hidden_size is resolved (ModelShape::ffn(), never 0) and vocab_size is the tokenizer's
/// (unpadded). seq_length and make_vocab_size_divisible_by are not recorded. A shape with a
/// non-GPT architecture (ModelShape::is_gpt false) also gets "normalization",
/// "position_embedding_type", "activation" (recipe spellings), "rotary_base",
/// "rotary_percentage", "num_query_groups" (resolved, never 0), "bias", "qkv_bias" and
/// "share_embeddings_and_output_weights", "kv_channels" when set and "rope_scaling" ({"factor",
/// "low_freq_factor", "high_freq_factor", "old_context_len"}) when on; a GPT shape's object is
/// unchanged.
nlohmann::json model_shape_to_json(const ModelShape& shape);

/// The shape model_shape_to_json wrote, read back from `model` (other keys are left alone: a
/// task may record more beside them). Not recorded, so: seq_length = max_position_embeddings
/// (a checkpoint's model runs up to its position table) and make_vocab_size_divisible_by 1
/// (the ModelShape default; a caller that knows the recipe's sets it). Absent architecture keys
/// read as GPT's defaults (checkpoints written before they existed). Not validated
/// (ModelShape::validate). Throws std::invalid_argument naming `file` and the key when `model`
/// is not an object or a key is missing or not an integer ("FILE: layout.model: expected an
/// integer \"hidden_size\", found none").
ModelShape model_shape_from_json(const nlohmann::json& model, const std::string& file);

}  // namespace loom
