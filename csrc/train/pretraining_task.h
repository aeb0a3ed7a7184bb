// `loom train`: pretraining a GPT on the recipe's indexed datasets (docs/design/conventions.md),
// a task on the one training loop (training_loop.h). Every chunk parameter trains; each step
// reads m = global_batch / (micro_batch·d) micro-batches of the pretraining sample stream (data/pretraining_sampler.h);
// validation scores the mean token loss over trainer.limit_val_batches global batches.
#pragma once
#include <memory>

#include "config/recipe.h"
#include "train/training_loop.h"

namespace loom::train {

/// Trains per the validated recipe on this rank (every rank of the world runs it with the same
/// recipe; ranks find each other through the environment, launch/env_rendezvous.h): builds the
/// data (rank 0 builds the index caches), the model chunks and the optimizer, then runs the
/// training loop (run_training_task: resume, validation, checkpoints, stop signals). The last
/// step is saved when exp_manager.checkpoint_callback_params.save_last or when it falls on the
/// every_n_steps grid. Returns 0 when done (or stopped by a signal after saving). Throws on
/// failure.
int run_training(const config::Recipe& recipe, const TrainOptions& options = {});

/// The pretraining task itself, for a task that trains on the same data: its prepare_data,
/// step_micro_batches, has_validation and validate read the recipe's pretraining data.
/// `recipe` must outlive the task.
std::unique_ptr<TrainingTask> make_pretraining_task(const config::Recipe& recipe);

}  // namespace loom::train
