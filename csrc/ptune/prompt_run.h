// What a `loom ptune` run needs before any rank starts (docs/design/ptuning.md): the frozen
// base, the task templates, the datasets checked line by line, the run's sequence length and
// the base's shape adopted into the recipe. The launcher checks it once; each rank plans again
// and trains (ptune/prompt_task.h).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "config/recipe.h"
#include "data/tokenizer.h"
#include "prompt_data/prompt_dataset.h"
#include "prompt_data/task_template.h"
#include "ptune/frozen_base.h"
#include "ptune/prompt_tables.h"

namespace loom::ptune {

/// Everything a prompt-learning run needs that can be checked before any rank starts.
struct PromptRunPlan {
  config::Recipe recipe;  ///< with the base's shape and the run's sequence length adopted
  FrozenBase base;
  std::vector<prompt_data::ParsedTemplate> templates;
  std::shared_ptr<data::Tokenizer> tokenizer;  ///< the base's, or the recipe's (run_tokenizer)
  std::shared_ptr<prompt_data::PromptDataset> train, valid, test;
  int64_t seq_length = 0;              ///< every micro-batch's length
  std::optional<PromptTables> restored;  ///< model.restore_path's tables (existing tasks)
};

/// Finds the base, parses the templates, reads and checks the datasets (file:line errors),
/// chooses the sequence length, adopts the base's shape and validates the recipe again.
/// Throws std::invalid_argument (model.language_model_path, model.data.max_seq_length,
/// model.restore_path, a task with records but nothing to train), config::RecipeError,
/// prompt_data::TemplateError or data::DataError: bad input, exit status 2.
/// `resume_iteration` (--iteration) chooses the checkpoint whose recorded base iteration pins the base.
PromptRunPlan plan_prompt_run(const config::Recipe& recipe, std::optional<int64_t> resume_iteration = std::nullopt);

}  // namespace loom::ptune
