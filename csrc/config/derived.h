// Values derived from a validated recipe: world and data-parallel sizes, micro-batch count,
// vocabulary padding, analytic parameter count, run directory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config/recipe.h"
#include "rules/layout.h"
#include "rules/model_shape.h"

namespace loom::config {

/// Vocabulary size of the GPT-2 BPE tokenizer (50,000 merges + 256 bytes + <|endoftext|>).
inline constexpr int64_t kGpt2VocabSize = 50257;

/// The recipe's model shape (model.num_layers, hidden_size, num_attention_heads,
/// ffn_hidden_size, encoder_seq_length, max_position_embeddings, make_vocab_size_divisible_by)
/// with the tokenizer's `vocab_size`: the one translation every command uses.
ModelShape recipe_model_shape(const Recipe& r, int64_t vocab_size);

/// The recipe's parallel layout: the model.*_parallel_size fields (v = 1 for null), d = world /
/// (t·p), the batch sizes, sequence parallelism (off at t = 1), the recompute settings as
/// written, the distributed optimizer and the uneven end stages. A size beyond int's range
/// (which the recipe check rejects) is given as 0.
Layout recipe_layout(const Recipe& r);

/// world = trainer.num_nodes * trainer.devices.
int64_t world_size(const Recipe& r);
/// d = world / (t * p) (Megatron's data-parallel size; validation guarantees divisibility).
int64_t data_parallel_size(const Recipe& r);
/// m = global_batch_size / (micro_batch_size * d): micro-batches per step on each pipeline.
int64_t num_microbatches(const Recipe& r);
/// v: virtual_pipeline_model_parallel_size, 1 when null.
int64_t virtual_pipeline_size(const Recipe& r);
/// Layers held by one model chunk: num_layers / (p * v).
int64_t layers_per_chunk(const Recipe& r);

/// Loom's vocabulary padding: rounds `vocab_size` up to a multiple of lcm(divisible_by, t), so
/// that every TP rank holds an equal shard. Megatron (`_vocab_size_with_padding`) pads to
/// divisible_by·t instead (50257 → 51200 at t=8); with lcm the padded size, and so checkpoints
/// and parameter counts, do not change with t for power-of-two t ≤ divisible_by (50257 → 50304
/// for t = 1..128). The model masks the pad logits (docs/design/parallel_layout.md, "Vocab padding"), so the
/// function it computes is the same under either rule; model::GptConfig pads the same way.
/// Throws std::invalid_argument if any argument is < 1.
int64_t padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tensor_parallel_size);
/// padded_vocab_size with the recipe's make_vocab_size_divisible_by and t.
int64_t padded_vocab_size(const Recipe& r, int64_t vocab_size = kGpt2VocabSize);

/// True when the optimizer state is sharded over DP ranks (use_distributed_optimizer, which
/// load_recipe also sets for optim.name distributed_fused_adam).
bool uses_distributed_optimizer(const Recipe& r);

/// trainer.max_time "DD:HH:MM:SS" (any number of day digits, as Lightning's Timer takes it) in
/// seconds; nullopt when the text is not in that form.
std::optional<int64_t> parse_max_time(const std::string& text);

/// The run directory: exp_manager.explicit_log_dir if set, else
/// <exp_manager.exp_dir or "runs">/<exp_manager.name>.
std::string run_directory(const Recipe& r);

}  // namespace loom::config
