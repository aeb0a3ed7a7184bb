// `loom ptune` (docs/design/ptuning.md): prompt learning as a task on the one training loop
// (train/training_loop.h). The frozen base is sliced for the run's layout; only the prompt
// parameters (on the first pipeline stage) train and are checkpointed (resume is exact); a
// step's micro-batches come from the prompt datasets in a seeded epoch order; validation scores
// loss and exact-match accuracy and keeps the best tables; the end writes the inference tables
// and scores the test data.
#pragma once
#include "config/recipe.h"
#include "train/training_loop.h"

namespace loom::ptune {

/// One rank of the run (rendezvous from the environment): plan_prompt_run (prompt_run.h) on
/// this rank, then the training loop. Returns the exit status; throws on failure (the bad-input
/// errors of plan_prompt_run, the loop's).
int run_prompt_learning(const config::Recipe& recipe, const train::TrainOptions& options);

}  // namespace loom::ptune
