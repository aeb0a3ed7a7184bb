#include "convert/reshard.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <map>
#include <set>

#include "config/derived.h"
#include "convert/checkpoint_writer.h"
#include "convert/convert_error.h"
#include "convert/run_recipe.h"
#include "generate/checkpoint_reader.h"
#include "train/checkpoint_files.h"
#include "train/model_setup.h"
#include "train/run_settings.h"
#include "train/training_state.h"

namespace fs = std::filesystem;

namespace loom::convert {
namespace {

constexpr const char* kWordEmbedding = "embedding.word_embeddings.weight";
constexpr const char* kTiedCopy = "output_layer.weight";
// The tensors saved per parameter: the parameter, then its optimizer state (optim/optimizer.h).
constexpr const char* kKinds[] = {"", "main/", "exp_avg/", "exp_avg_sq/"};

std::vector<int64_t> ints(const nlohmann::json& j, const std::string& what) {
  if (!j.is_array()) throw train::CheckpointError(what + " is not a list of integers");
  std::vector<int64_t> out;
  for (const auto& x : j) {
    if (!x.is_number_integer()) throw train::CheckpointError(what + " is not a list of integers");
    out.push_back(x.get<int64_t>());
  }
  return out;
}

// One output shard tensor being filled from source blocks.
struct Target {
  at::Tensor tensor;
  std::vector<int64_t> offset;        // where it sits in the output's global tensor
  std::vector<int64_t> source_shape;  // the source's global shape (set by the first block)
  std::set<std::vector<int64_t>> placed;  // source offsets copied (replicas share one)
  int64_t covered = 0;
};

// Copies the part of source block `block` (at `offset` of a global tensor `global`) that lies in
// `target`'s box; `shape` is the target's shard shape.
void place(Target& target, const std::vector<int64_t>& shape, const at::Tensor& block, const std::vector<int64_t>& offset,
           const std::vector<int64_t>& global, const std::string& what) {
  if (block.dim() != static_cast<int64_t>(shape.size()) || offset.size() != shape.size() || global.size() != shape.size())
    throw train::CheckpointError(fmt::format("{}: a {}-d block for a {}-d parameter", what, block.dim(), shape.size()));
  if (target.source_shape.empty()) {
    target.source_shape = global;
  } else if (target.source_shape != global) {
    throw train::CheckpointError(fmt::format("{}: global shape [{}] differs from another shard's [{}]", what,
                                             fmt::join(global, ", "), fmt::join(target.source_shape, ", ")));
  }
  if (!target.placed.insert(offset).second) return;  // a replica of a block already placed
  if (!target.tensor.defined()) target.tensor = at::zeros(shape, block.options());
  at::Tensor dst = target.tensor, src = block;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t lo = std::max(offset[i], target.offset[i]);
    const int64_t hi = std::min(offset[i] + block.size(i), target.offset[i] + shape[i]);
    if (lo >= hi) return;
    dst = dst.narrow(i, lo - target.offset[i], hi - lo);
    src = src.narrow(i, lo - offset[i], hi - lo);
  }
  dst.copy_(src);
  target.covered += src.numel();
}

// Elements of the target's box inside the source's global tensor (the rest, new pad rows, stays 0).
int64_t expected_cover(const Target& target, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i)
    n *= std::max<int64_t>(0, std::min(target.offset[i] + shape[i], target.source_shape[i]) - target.offset[i]);
  return n;
}

std::vector<int64_t> shard_shape(const ParamSpec& spec, int t) {
  std::vector<int64_t> s = spec.global_shape;
  if (spec.partition_dim >= 0) s[spec.partition_dim] /= t;
  return s;
}

}  // namespace

ReshardResult reshard_checkpoint(const ReshardRequest& request) {
  const generate::CheckpointLocation location = generate::locate_checkpoint(request.checkpoint);
  const config::Recipe source_recipe =
      load_run_recipe(location.run_dir, "the layout conversion (the recipe is rewritten for the new layout)");
  const generate::CheckpointInfo info = generate::read_checkpoint_info(location.checkpoints, request.iteration);
  ReshardResult result;
  result.iteration = info.iteration;
  result.from = {info.layout.tensor_parallel, info.layout.pipeline_parallel, info.layout.virtual_stages,
                 info.layout.data_parallel, config::uses_distributed_optimizer(source_recipe)};
  // The source's uneven stages, as its recipe (which source_config is built from) gives them.
  const Layout source_recipe_layout = recipe_layout(source_recipe);
  result.from.first_stage_layers = source_recipe_layout.first_stage_layers;
  result.from.last_stage_layers = source_recipe_layout.last_stage_layers;
  result.to = resolve_layout(request.layout, result.from);
  const Layout& from = result.from;
  const Layout& to = result.to;

  const fs::path out_run = fs::absolute(request.output_run).lexically_normal();
  if (fs::exists(out_run) && fs::equivalent(out_run, fs::absolute(location.run_dir)))
    throw ConvertInputError("--output " + request.output_run + " is the source run: write the new layout to another run directory");
  const std::string out_checkpoints = (out_run / "checkpoints").string();
  if (!train::list_iterations(out_checkpoints).empty() || fs::exists(fs::path(out_checkpoints) / train::kTrackerFile))
    throw ConvertInputError(out_checkpoints + " holds checkpoints already: convert into a new run directory");

  config::Recipe recipe;
  try {
    recipe = config::load_recipe_from_string(config::to_yaml(source_recipe), (fs::path(location.run_dir) / "config.yaml").string(),
                                             layout_overrides(to, source_recipe, out_run.string()));
  } catch (const config::RecipeError& e) {
    throw ConvertInputError(fmt::format("the run's recipe does not fit t={} p={} v={} d={}:\n{}", to.t, to.p, to.v, to.d, e.what()));
  }
  const nlohmann::json& shape = info.layout.model_shape;
  if (!shape.contains("vocab_size") || !shape["vocab_size"].is_number_integer())
    throw train::CheckpointError("checkpoint iteration " + std::to_string(info.iteration) + ": metadata.json has no layout.model.vocab_size");
  const int64_t vocab = shape["vocab_size"].get<int64_t>();
  const model::GptConfig source_config = train::gpt_config_from_recipe(source_recipe, vocab);
  const model::GptConfig config = train::gpt_config_from_recipe(recipe, vocab);
  const train::CheckpointLayout out_layout = train::checkpoint_layout(train::run_shape(recipe), config);
  if (out_layout.model_shape != shape)
    throw ConvertInputError(fmt::format("{}/config.yaml describes a model of shape {}, the checkpoint holds {}", location.run_dir,
                                        out_layout.model_shape.dump(), shape.dump()));

  // Which source pipeline rank holds each parameter.
  std::map<std::string, int> source_stage;
  for (int pp = 0; pp < from.p; ++pp)
    for (const auto& spec : stage_param_specs(source_config, from.t, from.p, from.v, pp)) source_stage[spec.name] = pp;
  const bool source_has_copy = source_stage.count(kTiedCopy) > 0;
  auto source_name = [&](const ParamSpec& spec) {
    return spec.tied_copy && !source_has_copy ? std::string(kWordEmbedding) : spec.name;
  };

  nlohmann::json values;
  std::set<std::string> source_names_seen, consumed;
  CheckpointWriter writer(out_checkpoints, info.iteration, out_layout);
  for (int pp = 0; pp < to.p; ++pp) {
    const std::vector<ParamSpec> specs = stage_param_specs(config, to.t, to.p, to.v, pp);
    // targets[tp][kind + name]
    std::vector<std::map<std::string, Target>> targets(to.t);
    std::set<int> stages;
    for (const auto& spec : specs) {
      const auto it = source_stage.find(source_name(spec));
      if (it == source_stage.end())
        throw ConvertInputError("the source model has no parameter " + source_name(spec));
      stages.insert(it->second);
      for (int tp = 0; tp < to.t; ++tp) {
        const nlohmann::json record = shard_record(spec, tp, to.t);
        for (const char* kind : kKinds) targets[tp][kind + spec.name].offset = record["offset"].get<std::vector<int64_t>>();
      }
    }
    for (int src_pp : stages) {
      for (int src_tp = 0; src_tp < from.t; ++src_tp) {
        const std::string rel = train::model_parallel_dir_name(src_tp, src_pp, from.p) + "/" + train::kShardFileName;
        const std::string file = (fs::path(location.checkpoints) / train::iteration_dir_name(info.iteration) / rel).string();
        const train::RankCheckpoint shard = train::read_checkpoint_shard(location.checkpoints, info.iteration, rel, info.metadata);
        ++result.files_read;
        if (values.is_null()) {
          values = shard.values;
          if (!values.is_object() || !values.contains("consumed_samples") || !values.contains("optimizer"))
            throw ConvertInputError(file + " is not a training checkpoint (no optimizer state or data position)");
        }
        for (const auto& [name, tensor] : shard.model) source_names_seen.insert(name);
        for (const auto& spec : specs) {
          const std::string src = source_name(spec);
          if (source_stage.at(src) != src_pp) continue;
          if (!shard.shard_info.contains(src))
            throw train::CheckpointError(file + ": no shard record (global_shape/offset) of " + src);
          const auto& record = shard.shard_info[src];
          const std::string what = file + ": " + src;
          const auto offset = ints(record.value("offset", nlohmann::json()), what + " offset");
          const auto global = ints(record.value("global_shape", nlohmann::json()), what + " global_shape");
          for (const char* kind : kKinds) {
            const std::string key = kind + src;
            const auto& pool = *kind ? shard.optimizer : shard.model;
            const auto found = pool.find(key);
            if (found == pool.end())
              throw ConvertInputError(fmt::format("{}: no {} tensor '{}'", file, *kind ? "optimizer" : "model", key));
            for (int tp = 0; tp < to.t; ++tp)
              place(targets[tp][kind + spec.name], shard_shape(spec, to.t), found->second, offset, global, what);
          }
          consumed.insert(src);
        }
      }
    }
    for (int tp = 0; tp < to.t; ++tp) {
      train::RankCheckpoint state;
      for (const auto& spec : specs) {
        for (const char* kind : kKinds) {
          Target& target = targets[tp][kind + spec.name];
          const auto want = shard_shape(spec, to.t);
          if (!target.tensor.defined() || target.covered != expected_cover(target, want))
            throw train::CheckpointError(fmt::format("checkpoint iteration {}: the shards of {}{} do not cover its part [{}] at "
                                                     "offset [{}] of the new layout",
                                                     info.iteration, kind, source_name(spec), fmt::join(want, ", "),
                                                     fmt::join(target.offset, ", ")));
          if (*kind) {
            state.optimizer[kind + spec.name] = target.tensor;
          } else {
            state.model[spec.name] = target.tensor;
            state.shard_info[spec.name] = shard_record(spec, tp, to.t);
          }
        }
      }
      state.values = values;
      writer.write_rank(tp, pp, state);
    }
  }
  for (const auto& name : source_names_seen)
    if (!consumed.count(name) && name != kTiedCopy)
      throw ConvertInputError("the checkpoint holds parameter " + name + " that the model of its recipe does not have");
  writer.commit();
  train::write_text_atomically((out_run / "config.yaml").string(), config::to_yaml(recipe));
  return result;
}

}  // namespace loom::convert
