#include "train/training_state.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/pipeline_split.h"
#include "rules/layout_rules.h"

namespace loom::train {

CheckpointLayout checkpoint_layout(const Layout& layout, const model::GptConfig& config) {
  CheckpointLayout l;
  l.parallel.tp = layout.tp;
  l.parallel.pp = layout.pp;
  l.parallel.vp = layout.vp;
  l.parallel.dp = layout.dp;
  l.model_shape = config;
  const rules::PipelineSplit split = model::pipeline_split(config, layout.pp, layout.vp);
  l.stage_layers = rules::stage_layer_counts(split);
  // The model's own split (config.layout holds the recipe's uneven stages).
  if (split.first_stage_layers) l.parallel.first_stage_layers = static_cast<int>(*split.first_stage_layers);
  if (split.last_stage_layers) l.parallel.last_stage_layers = static_cast<int>(*split.last_stage_layers);
  return l;
}

namespace {
model::ParamList saved_params(const TrainingParts& parts) {
  if (parts.params) return *parts.params;
  model::ParamList out;
  for (const auto& chunk : *parts.chunks)
    for (const auto& p : chunk.parameters()) out.push_back(p);
  return out;
}
}  // namespace

RankCheckpoint capture_training_state(const TrainingParts& parts, const TrainingPosition& position,
                                      int tp_rank, int t) {
  RankCheckpoint state;
  for (const auto& p : saved_params(parts)) {
    state.model[p.name] = p.tensor.detach();
    std::vector<int64_t> shape = p.tensor.sizes().vec(), offset(shape.size(), 0);
    if (p.tensor_parallel()) {
      offset[p.partition_dim] = shape[p.partition_dim] * tp_rank;
      shape[p.partition_dim] *= t;
    }
    state.shard_info[p.name] = {{"global_shape", shape}, {"offset", offset}};
  }
  auto opt_state = parts.optimizer->state_dict();  // collective (distributed optimizer)
  state.optimizer = opt_state.tensors;
  state.values = {{"optimizer", opt_state.values},
                  {"scheduler", parts.scheduler->state_dict()},
                  {"scaler", parts.scaler ? parts.scaler->state_dict() : nlohmann::json()},
                  {"iteration", position.iteration},
                  {"consumed_samples", position.consumed_samples}};
  return state;
}

TrainingPosition restore_training_state(const RankCheckpoint& state, const TrainingParts& parts) {
  const auto iteration = state.values.value("iteration", int64_t(-1));
  // Check every parameter before changing any.
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  for (const auto& p : saved_params(parts)) {
    auto it = state.model.find(p.name);
    if (it == state.model.end())
      throw CheckpointError(fmt::format("checkpoint iteration {} has no parameter {}", iteration, p.name));
    if (it->second.sizes() != p.tensor.sizes())
      throw CheckpointError(fmt::format("checkpoint parameter {} has shape {}, the model {}", p.name,
                                        fmt::join(it->second.sizes(), "x"), fmt::join(p.tensor.sizes(), "x")));
    copies.emplace_back(p.tensor, it->second);
  }
  {
    at::NoGradGuard no_grad;
    for (auto& [param, saved] : copies) param.copy_(saved);  // host → the run's device
  }
  optim::OptimizerState opt;
  opt.tensors = state.optimizer;
  opt.values = state.values.at("optimizer");
  parts.optimizer->load_state_dict(opt);
  parts.scheduler->load_state_dict(state.values.at("scheduler"));
  if (parts.scaler && !state.values.at("scaler").is_null())
    parts.scaler->load_state_dict(state.values.at("scaler"));
  TrainingPosition position;
  position.iteration = state.values.at("iteration").get<int64_t>();
  position.consumed_samples = state.values.at("consumed_samples").get<int64_t>();
  return position;
}

}  // namespace loom::train
