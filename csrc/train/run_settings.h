// A validated recipe translated once into the settings of the training run's parts: the
// optimizer, the learning-rate schedule and the datasets (the parallel layout of a step is
// config::recipe_layout, a loom::Layout; the rank's start, train::rank_session_request).
// Each part then reads its own settings, never the raw recipe.
#pragma once
#include <cstdint>
#include <string>

#include "config/recipe.h"
#include "rules/layout.h"
#include "data/gpt_data_factory.h"
#include "train/optim/lr_schedule.h"
#include "train/optim/optimizer.h"

namespace loom::train {

/// model.optim (AdamW betas, eps, weight decay; distributed or not; gradient buckets of
/// ddp_bucket_size elements and overlap_grad_sync) and trainer.gradient_clip_val.
optim::OptimizerOptions optimizer_options(const config::Recipe& recipe);

/// model.optim.lr and model.optim.sched; sched.max_steps defaults to trainer.max_steps. A
/// schedule whose warm-up and constant phases outlast the run keeps its own horizon (the run
/// simply ends before the decay; the recipe loader warned).
optim::LrScheduleConfig lr_schedule_config(const config::Recipe& recipe);

/// model.data for `train_samples` and `valid_samples` samples; index caches go to
/// model.data.index_mapping_dir or, when null, `default_cache_dir`.
data::GptDataConfig gpt_data_config(const config::Recipe& recipe, int64_t train_samples,
                                    int64_t valid_samples, const std::string& default_cache_dir);

}  // namespace loom::train
