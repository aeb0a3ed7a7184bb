// `loom finetune`: supervised fine-tuning of a pretrained GPT (docs/design/finetune.md), a task
// on the one training loop (train/training_task.h). The base (model.restore_from_path) is read
// whole and sliced for this run's layout. model.peft.peft_scheme chooses what trains:
// - lora: adapters on the chosen linears (docs/design/lora.md), the base frozen; checkpoints
//   hold the adapters only and name their base (finetune/lora_run.h, LoraRecord); at the end the
//   base is checked bit-identical to what was loaded;
// - none: every base parameter (full-parameter SFT); checkpoints are whole-model checkpoints and
//   the run directory's config.yaml is the base run's pretraining recipe with this run's
//   directory and layout, so that generate, serve, eval, convert and train read the run as any
//   pretraining run (the fine-tuning recipe itself is kept as finetune_config.yaml).
// The data is JSON-lines SFT records (finetune/sft_dataset.h) in rows of one example or, with
// packed_sequence, several (finetune/sft_rows.h).
#pragma once
#include "config/recipe.h"
#include "train/training_loop.h"

namespace loom::finetune {

/// Trains per the validated fine-tuning recipe on this rank (every rank runs it with the same
/// recipe). Returns 0 when done (or stopped by a signal after saving). Throws on failure
/// (std::invalid_argument or data::DataError for bad input: exit status 2).
int run_finetuning(const config::Recipe& recipe, const train::TrainOptions& options = {});

}  // namespace loom::finetune
