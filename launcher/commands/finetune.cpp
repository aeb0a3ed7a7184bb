// `loom finetune RECIPE [overrides] [--nproc N] [--stop-after-steps K] [--iteration N]`: LoRA
// fine-tuning of a frozen pretrained GPT (docs/design/lora.md). The recipe is a fine-tuning
// recipe with NeMo 1.x's megatron_gpt_finetuning_config keys (model.restore_from_path,
// model.peft): a NeMo user runs fine-tuning as its own script and config, not as pretraining's.
// Everything that can be checked before a rank starts is: the recipe (each peft field), the
// base checkpoint and tokenizer, the layout with the base's shape. Exit status 2 for bad input,
// 1 for a runtime failure.
#include "command_registry.h"
#include "frozen_base_command.h"
#include "finetune/lora_run.h"
#include "finetune/lora_task.h"

namespace {

int finetune_command(int argc, char** argv) {
  loom::cli::FrozenBaseCommand command;
  command.name = "finetune";
  command.description = "Fine-tune a pretrained GPT with LoRA adapters (the base frozen).";
  command.recipe_example = "recipes/lora_tiny_cpu.yaml";
  command.override_example = "model.peft.lora_tuning.adapter_dim=8";
  command.kind = loom::config::RecipeKind::kFinetuning;
  command.resolve = [](const loom::config::Recipe& recipe, std::optional<int64_t> resume) {
    return loom::finetune::plan_lora_run(recipe, resume).recipe;
  };
  command.run = loom::finetune::run_lora_finetuning;
  return loom::cli::run_frozen_base_command(command, argc, argv);
}

}  // namespace

LOOM_REGISTER_COMMAND("finetune", "LoRA fine-tuning of a frozen pretrained GPT (loom finetune RECIPE [overrides])",
                      finetune_command);
