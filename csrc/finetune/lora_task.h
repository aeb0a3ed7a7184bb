// `loom finetune`: LoRA fine-tuning of a frozen pretrained GPT (docs/design/lora.md), a task on
// the one training loop (train/training_task.h). The base (model.restore_from_path) is read
// whole and sliced for this run's layout, its parameters frozen; adapters (model.peft) on the
// chosen linears are the only trainable parameters. The data is the recipe's pretraining data
// for now, taken from the pretraining task (train/pretraining_task.h), so that another data
// source can replace it without touching the rest. Checkpoints hold the adapters only and name
// their base (finetune/lora_run.h, LoraRecord); a resume on another base is refused. At the end
// the base is checked bit-identical to what was loaded.
#pragma once
#include "config/recipe.h"
#include "train/training_loop.h"

namespace loom::finetune {

/// Trains the adapters per the validated fine-tuning recipe on this rank (every rank runs it
/// with the same recipe). Returns 0 when done (or stopped by a signal after saving). Throws on
/// failure (std::invalid_argument for a bad base: exit status 2).
int run_lora_finetuning(const config::Recipe& recipe, const train::TrainOptions& options = {});

}  // namespace loom::finetune
