// How `loom train` and `loom ptune` end on an exception: one rule for both commands of the one
// training loop (docs/design/conventions.md, "Command line").
#pragma once
#include <exception>
#include <iostream>
#include <stdexcept>
#include <string>

#include "config/recipe.h"
#include "data/data_error.h"
#include "error_text.h"
#include "launch/local_launcher.h"
#include "launch/run_lock.h"
#include "train/checkpoint_files.h"

namespace loom::cli {

/// Records `e` for the launcher's failure report (launch::record_rank_error), prints it as
/// "loom <command>: <kind><what>" and returns the exit status: 2 for bad input (the recipe, the
/// data, a value the library refuses, the checkpoint, a run directory another run holds), 1 for
/// a runtime failure.
inline int training_failure(const std::string& command, const std::exception& e) {
  const char* kind = "error: ";
  int status = 2;
  if (dynamic_cast<const config::RecipeError*>(&e))
    kind = "invalid recipe:\n";
  else if (dynamic_cast<const data::DataError*>(&e))
    kind = "data error: ";  // bad data is bad input, like a missing data file
  else if (dynamic_cast<const std::invalid_argument*>(&e))
    kind = "error: ";
  else if (dynamic_cast<const train::CheckpointError*>(&e))
    kind = "checkpoint error: ";
  else if (dynamic_cast<const launch::RunLockError*>(&e))
    kind = "";
  else
    status = 1;
  launch::record_rank_error(error_text(e));
  std::cerr << "loom " << command << ": " << kind << error_text(e) << "\n";
  return status;
}

}  // namespace loom::cli
