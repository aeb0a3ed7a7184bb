// The exit status a command's rank ends with on an exception (docs/design/conventions.md,
// "Command line"): 2 for Loom's bad-input errors, 1 for a runtime failure. One list, shared by
// the commands that load a checkpoint (generate, eval, serve).
#pragma once
#include <exception>

#include "config/recipe.h"
#include "data/data_error.h"
#include "generate/generate_run.h"
#include "train/checkpoint_files.h"

namespace loom::cli {

/// 2 when `e` is a checkpoint, data, recipe or generation-input error (a bad file, field or
/// flag), else 1.
inline int input_error_status(const std::exception& e) {
  const bool input = dynamic_cast<const generate::GenerateInputError*>(&e) ||
                     dynamic_cast<const train::CheckpointError*>(&e) ||
                     dynamic_cast<const data::DataError*>(&e) || dynamic_cast<const config::RecipeError*>(&e);
  return input ? 2 : 1;
}

}  // namespace loom::cli
