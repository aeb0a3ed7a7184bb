// The bridge between training recipes (csrc/config) and the planner: a recipe gives the model
// shape, batch, precision and cluster to plan for, its own layout to compare against, and is
// the base a planned layout is applied to (as dotted overrides) to become a runnable recipe.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "config/recipe.h"
#include "planner/layout.h"
#include "planner/model_shape.h"
#include "planner/training_setup.h"

namespace loom::planner {

/// What a recipe says about the plan.
struct RecipePlanInput {
  ModelShape shape;        ///< num_layers, hidden, heads, ffn, encoder_seq_length; V = the
                           ///< tokenizer's vocabulary (recipe_vocab_size) padded to
                           ///< make_vocab_size_divisible_by
  TrainingSetup setup;     ///< global_batch_size, precision (32 → fp32, bf16, 16 → fp16)
  int num_nodes = 1;       ///< trainer.num_nodes
  int devices = 1;         ///< trainer.devices (ranks per node)
  bool cpu = false;        ///< trainer.accelerator == cpu
  std::string gpu;         ///< cluster.gpu, "" when unset
  Layout layout;           ///< the recipe's own layout
};

/// The unpadded vocabulary of the recipe's model.tokenizer: its vocab_size() when its files can
/// be read (any library), else GPT-2's 50257 for a megatron GPT2BPETokenizer whose files are not
/// on this machine (a plan may be made far from the data). Throws std::invalid_argument naming
/// model.tokenizer for a SentencePiece or tokenizer.json file that is missing or does not load.
int64_t recipe_vocab_size(const config::Recipe& recipe);

/// Extracts the plan inputs of a loaded recipe. The vocabulary is `vocab_size` as trained
/// (padded; `loom plan --vocab-size`) when given, else the tokenizer's (recipe_vocab_size).
RecipePlanInput plan_input_from_recipe(const config::Recipe& recipe,
                                       std::optional<int64_t> vocab_size = std::nullopt);

/// Dotted overrides that put `layout` into a recipe (parallel sizes, micro-batch, SP,
/// activations_checkpoint_*, use_distributed_optimizer; a base optimizer distributed_fused_adam
/// becomes fused_adam when the layout does not shard).
std::vector<std::string> layout_overrides(const Layout& layout, const config::Recipe& base);

}  // namespace loom::planner
