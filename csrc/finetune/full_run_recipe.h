// The config.yaml of a full-parameter fine-tuning run (docs/design/finetune.md, "Full
// fine-tuning"): its checkpoints are whole models, so the run directory records the base run's
// recipe (a pretraining recipe: the model's fields and tokenizer that generate, serve, eval,
// convert and train read from a run) with this run's directory, layout and batch.
#pragma once
#include <optional>

#include "config/recipe.h"
#include "finetune/lora_run.h"

namespace loom::finetune {

/// The base run's config.yaml with its tokenizer files as absolute paths (the base's resolved
/// tokenizer), run.name, run.results_dir and exp_manager.explicit_log_dir naming this run, and
/// this run's parallel sizes, batch sizes and trainer settings; nullopt when the base has no run
/// directory with a config.yaml (a bare checkpoints folder). Throws std::invalid_argument naming
/// the file when it does not load.
std::optional<config::Recipe> full_run_recipe(const FinetuneRunPlan& plan);

}  // namespace loom::finetune
