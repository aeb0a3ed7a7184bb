// Range and consistency rules of a recipe, run by load_recipe before any rank starts.
//
// Per field: sizes and step counts >= 1 (limit_val_batches, warmup/constant steps, seed,
// num_workers >= 0), model and layout sizes at most 2^31-1 (the model and the planner hold
// them in 32 bits), encoder_seq_length >= 2, and the token totals max_steps x
// global_batch_size x encoder_seq_length (and limit_val_batches x ...) within 64 bits, dropouts and label smoothing in [0, 1), betas in [0, 1), lr, eps,
// init_method_std, layernorm_epsilon, collective_timeout_s > 0, min_lr in [0, lr],
// weight_decay and gradient_clip_val >= 0, splits_string "a,b,c" (1-3 weights >= 0, sum > 0),
// max_time "DD:HH:MM:SS", data_prefix weights > 0 and non-empty paths.
// Across fields: the layout rules of rules/layout_rules.h, the one place that decides what is
//   legal (Megatron-LM's argument checks and Megatron-Core's uneven stages, interleaving, the
//   batch split, recomputation and fused attention; docs/design/parallel_layout.md), and the
//   Llama-family fields' rules (rules::architecture_violations: num_query_groups dividing the
//   heads and a multiple of t, rotary_percentage in (0, 1], an even rotated width under rope,
//   rope_scaling's limits), then
//   data.seq_length == encoder_seq_length and cluster.gpus_per_node == devices on GPU.
//   (NeMo's own recipes write recompute method block with num_layers 0, which is accepted as
//   "none"; a method without granularity is ignored with a warning.)
// Warnings (not errors): sequence_parallel with t == 1 is turned off, as Megatron does (SP over
//   one rank is the identity); warmup_steps + constant_steps > sched.max_steps.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "config/recipe.h"

namespace loom::config {

struct Finding {
  std::string path;     ///< field the finding is about, e.g. "model.num_attention_heads"
  std::string message;  ///< "expected ..., found ..."
  bool warning = false;
};

/// Applies the rules above to a recipe with defaults and derived values filled. Fields listed
/// in `skip` already had errors: rules involving them are not evaluated (no cascades).
/// Prompt-learning recipes (docs/design/ptuning.md) also get their own rules (tasks named in
/// new_tasks/existing_tasks exist, restore_path with existing tasks, encoder sizes, init text
/// for text-initialised prompt tuning, train_ds given); rules about the model's shape wait
/// until `model_shape_known` (the ptune command fills the shape from the base checkpoint and
/// validates again).
std::vector<Finding> validate_recipe(const Recipe& r, const std::set<std::string>& skip = {},
                                     bool model_shape_known = false);

}  // namespace loom::config
