// What a training rank saves and restores (train/checkpoint.h has the files): its model
// chunks' parameters with where each shard sits in the global tensor, the optimizer's
// whole-parameter state, the scheduler, the loss scaler and the data position. Tensors are
// saved as host copies and loaded onto whatever device the run has, so a checkpoint written
// on GPUs resumes on CPU ranks and the other way round.
#pragma once
#include <cstdint>
#include <vector>

#include "model/gpt_config.h"
#include "model/gpt_stage.h"
#include "train/checkpoint.h"
#include "train/optim/loss_scaler.h"
#include "train/optim/lr_schedule.h"
#include "train/optim/optimizer.h"
#include "train/run_settings.h"

namespace loom::train {

/// The optimizer step a run has reached and the samples it has consumed.
struct TrainingPosition {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
};

/// The parts of one rank's training state (non-owning).
struct TrainingParts {
  const std::vector<model::GptStage>* chunks = nullptr;
  optim::Optimizer* optimizer = nullptr;
  optim::LrScheduler* scheduler = nullptr;
  optim::LossScaler* scaler = nullptr;  ///< null without fp16
  /// The parameters saved and restored instead of every parameter of `chunks` (prompt learning
  /// saves only its prompt parameters; the frozen base is never written).
  const model::ParamList* params = nullptr;
};

/// The layout and model shape a checkpoint of this run records (and a resume must match).
CheckpointLayout checkpoint_layout(const Layout& layout, const model::GptConfig& config);

/// This rank's state at `position`. Collective over the data-parallel group (the distributed
/// optimizer gathers its shards). `tp_rank` of `t`: where each tensor-parallel shard sits.
RankCheckpoint capture_training_state(const TrainingParts& parts, const TrainingPosition& position,
                                      int tp_rank, int t);

/// Copies `state` into the parts and returns its position. Throws CheckpointError naming the
/// parameter when one is missing or has another shape (nothing is changed then for the model),
/// std::runtime_error naming the entry for bad optimizer/scheduler/scaler state.
TrainingPosition restore_training_state(const RankCheckpoint& state, const TrainingParts& parts);

}  // namespace loom::train
