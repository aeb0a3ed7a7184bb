// `loom finetune RECIPE [overrides] [--nproc N] [--stop-after-steps K] [--iteration N]
// [--show-examples N]`: supervised fine-tuning of a pretrained GPT on JSON-lines SFT data, LoRA
// adapters on a frozen base or every parameter (docs/design/finetune.md, docs/design/lora.md).
// The recipe is a fine-tuning recipe with NeMo 1.x's megatron_gpt_finetuning_config keys
// (model.restore_from_path, model.peft, model.data.train_ds): a NeMo user runs fine-tuning as its
// own script and config, not as pretraining's. Everything that can be checked before a rank
// starts is: the recipe (each peft field), the base checkpoint and tokenizer, every record of the
// datasets, the layout with the base's shape. Exit status 2 for bad input,
// 1 for a runtime failure.
#include <iostream>

#include "command_registry.h"
#include "frozen_base_command.h"
#include "finetune/lora_run.h"
#include "finetune/finetune_task.h"
#include "finetune/show_examples.h"

namespace {

int finetune_command(int argc, char** argv) {
  loom::cli::FrozenBaseCommand command;
  command.name = "finetune";
  command.description = "Supervised fine-tuning of a pretrained GPT: LoRA adapters or every parameter.";
  command.recipe_example = "recipes/lora_tiny_cpu.yaml";
  command.override_example = "model.peft.lora_tuning.adapter_dim=8";
  command.kind = loom::config::RecipeKind::kFinetuning;
  command.resolve = [](const loom::config::Recipe& recipe, std::optional<int64_t> resume) {
    return loom::finetune::plan_finetune_run(recipe, resume).recipe;
  };
  command.run = loom::finetune::run_finetuning;
  command.show_examples = [](const loom::config::Recipe& recipe, int64_t n) {
    loom::finetune::show_examples(recipe, n, std::cout);
  };
  return loom::cli::run_frozen_base_command(command, argc, argv);
}

}  // namespace

LOOM_REGISTER_COMMAND("finetune", "supervised fine-tuning (LoRA or full) of a pretrained GPT (loom finetune RECIPE [overrides])",
                      finetune_command);
