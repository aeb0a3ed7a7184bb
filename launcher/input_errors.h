// The exit status a command's rank ends with on an exception (docs/design/conventions.md,
// "Command line"): 2 for Loom's bad-input errors, 1 for a runtime failure. One list, shared by
// the commands that load a checkpoint (generate, eval, serve, convert); run_rank_body ends
// their ranks with it.
#pragma once
#include <fmt/format.h>

#include <exception>
#include <iostream>
#include <stdexcept>
#include <string>

#include "config/recipe.h"
#include "data/data_error.h"
#include "eval/eval_error.h"
#include "error_text.h"
#include "generate/generate_run.h"
#include "launch/env_rendezvous.h"
#include "launch/local_launcher.h"
#include "train/checkpoint_files.h"

namespace loom::cli {

/// 2 when `e` is a checkpoint, data, recipe, generation-input or eval-input error (a bad file,
/// field or flag), else 1.
inline int input_error_status(const std::exception& e) {
  const bool input = dynamic_cast<const generate::GenerateInputError*>(&e) ||
                     dynamic_cast<const eval::EvalInputError*>(&e) ||
                     dynamic_cast<const train::CheckpointError*>(&e) ||
                     dynamic_cast<const data::DataError*>(&e) || dynamic_cast<const config::RecipeError*>(&e);
  return input ? 2 : 1;
}

/// What a rank of `loom <command>` prefixes its lines with: "loom <command>: ", and the rank
/// ("[rank r] ") when the job has several.
inline std::string rank_prefix(const std::string& command, const launch::RendezvousInfo& info) {
  return info.world_size > 1 ? fmt::format("loom {}: [rank {}] ", command, info.rank) : "loom " + command + ": ";
}

/// Runs one rank's `body` (returning the rank's exit status). An exception from it is recorded
/// for the launcher's failure report (launch::record_rank_error), printed as
/// "<prefix>error: <what>" and becomes the status: 2 for bad input (std::invalid_argument, such
/// as a flag the library refuses or a world of the wrong size, and input_error_status's list),
/// else 1.
template <class Body>
int run_rank_body(const std::string& prefix, Body&& body) {
  auto fail = [&](int status, const std::string& what) {
    launch::record_rank_error(what);
    std::cerr << prefix << "error: " << what << std::endl;
    return status;
  };
  try {
    return body();
  } catch (const std::invalid_argument& e) {
    return fail(2, error_text(e));
  } catch (const std::exception& e) {
    return fail(input_error_status(e), error_text(e));
  }
}

}  // namespace loom::cli
