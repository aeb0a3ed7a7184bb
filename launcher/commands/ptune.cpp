// `loom ptune RECIPE [overrides] [--nproc N] [--stop-after-steps K] [--iteration N]`: p-tuning or
// prompt tuning of a frozen GPT (docs/design/ptuning.md). The recipe is a prompt-learning
// recipe (NeMo's megatron_gpt_prompt_learning_config keys). Everything that can be checked
// before a rank starts is: the recipe, the base checkpoint, every template rule, every record
// of the datasets (file:line), the sequence length and the layout with the base's shape. Exit
// status 2 for bad input, 1 for a runtime failure.
#include "command_registry.h"
#include "frozen_base_command.h"
#include "ptune/prompt_run.h"
#include "ptune/prompt_task.h"

namespace {

int ptune_command(int argc, char** argv) {
  loom::cli::FrozenBaseCommand command;
  command.name = "ptune";
  command.description = "Tune virtual-token prompts of a frozen GPT (p-tuning, prompt tuning).";
  command.recipe_example = "recipes/ptune_tiny_cpu.yaml";
  command.override_example = "trainer.max_steps=100";
  command.kind = loom::config::RecipeKind::kPromptLearning;
  command.resolve = [](const loom::config::Recipe& recipe, std::optional<int64_t> resume) {
    return loom::ptune::plan_prompt_run(recipe, resume).recipe;
  };
  command.run = loom::ptune::run_prompt_learning;
  return loom::cli::run_frozen_base_command(command, argc, argv);
}

}  // namespace

LOOM_REGISTER_COMMAND("ptune", "p-tuning / prompt tuning of a frozen GPT (loom ptune RECIPE [overrides])", ptune_command);
