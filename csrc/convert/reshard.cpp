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

// The source run opened and the destination checked: everything the stage loop reads.
struct Conversion {
  generate::CheckpointLocation location;
  generate::CheckpointInfo info;
  config::Recipe recipe;  // the source's recipe at the new layout
  model::GptConfig source_config, config;
  train::CheckpointLayout out_layout;
  fs::path out_run;
  std::string out_checkpoints;
  std::map<std::string, int> source_stage;  // which source pipeline rank holds each parameter
  bool source_has_copy = false;             // the source's last stage saves the tied copy

  std::string source_name(const ParamSpec& spec) const {
    return spec.tied_copy && !source_has_copy ? std::string(kWordEmbedding) : spec.name;
  }
};

void check_output_run(const fs::path& out_run, const std::string& output_flag, const std::string& source_run,
                      const std::string& out_checkpoints) {
  if (fs::exists(out_run) && fs::equivalent(out_run, fs::absolute(source_run)))
    throw ConvertInputError("--output " + output_flag + " is the source run: write the new layout to another run directory");
  if (!train::list_iterations(out_checkpoints).empty() || fs::exists(fs::path(out_checkpoints) / train::kTrackerFile))
    throw ConvertInputError(out_checkpoints + " holds checkpoints already: convert into a new run directory");
}

config::Recipe recipe_at_layout(const config::Recipe& source, const Layout& to, const std::string& run_dir,
                                const fs::path& out_run) {
  try {
    return config::load_recipe_from_string(config::to_yaml(source), (fs::path(run_dir) / "config.yaml").string(),
                                           layout_overrides(to, source, out_run.string()));
  } catch (const config::RecipeError& e) {
    throw ConvertInputError(fmt::format("the run's recipe does not fit t={} p={} v={} d={}:\n{}", to.tp, to.pp, to.vp, to.dp, e.what()));
  }
}

Conversion open_conversion(const ReshardRequest& request, ReshardResult& result) {
  Conversion c;
  c.location = generate::locate_checkpoint(request.checkpoint);
  c.info = generate::read_checkpoint_info(c.location.checkpoints, request.iteration);
  generate::refuse_adapter_checkpoint(c.info, request.checkpoint);
  const config::Recipe source_recipe =
      load_run_recipe(c.location.run_dir, "the layout conversion (the recipe is rewritten for the new layout)");
  result.iteration = c.info.iteration;
  const auto& l = c.info.layout;
  // The source's recipe (which source_config is built from) gives the optimizer and the uneven
  // stages; the checkpoint gives the sizes it was written at.
  result.from = config::recipe_layout(source_recipe);
  result.from.tp = l.parallel.tp;
  result.from.pp = l.parallel.pp;
  result.from.vp = l.parallel.vp;
  result.from.dp = l.parallel.dp;
  result.to = resolve_layout(request.layout, result.from);

  c.out_run = fs::absolute(request.output_run).lexically_normal();
  c.out_checkpoints = (c.out_run / "checkpoints").string();
  check_output_run(c.out_run, request.output_run, c.location.run_dir, c.out_checkpoints);
  c.recipe = recipe_at_layout(source_recipe, result.to, c.location.run_dir, c.out_run);

  const int64_t vocab = l.model_shape.vocab_size;
  c.source_config = train::gpt_config_from_recipe(source_recipe, vocab);
  c.config = train::gpt_config_from_recipe(c.recipe, vocab);
  c.out_layout = train::checkpoint_layout(config::recipe_layout(c.recipe), c.config);
  if (c.out_layout.model_json() != l.model_json())
    throw ConvertInputError(fmt::format("{}/config.yaml describes a model of shape {}, the checkpoint holds {}", c.location.run_dir,
                                        c.out_layout.model_json().dump(), l.model_json().dump()));
  const Layout& from = result.from;
  for (int pp = 0; pp < from.pp; ++pp)
    for (const auto& spec : stage_param_specs(c.source_config, from.tp, from.pp, from.vp, pp)) c.source_stage[spec.name] = pp;
  c.source_has_copy = c.source_stage.count(kTiedCopy) > 0;
  return c;
}

// One output pipeline stage: its parameters, and per output tensor-parallel rank the tensors
// being filled (targets[tp][kind + name]).
struct StageTargets {
  std::vector<ParamSpec> specs;
  std::vector<std::map<std::string, Target>> targets;
  std::set<int> source_stages;  // the source pipeline ranks holding its parameters
};

StageTargets stage_targets(const Conversion& c, const Layout& to, int pp) {
  StageTargets st;
  st.specs = stage_param_specs(c.config, to.tp, to.pp, to.vp, pp);
  st.targets.resize(to.tp);
  for (const auto& spec : st.specs) {
    const auto it = c.source_stage.find(c.source_name(spec));
    if (it == c.source_stage.end()) throw ConvertInputError("the source model has no parameter " + c.source_name(spec));
    st.source_stages.insert(it->second);
    for (int tp = 0; tp < to.tp; ++tp) {
      const nlohmann::json record = shard_record(spec, tp, to.tp);
      for (const char* kind : kKinds) st.targets[tp][kind + spec.name].offset = record["offset"].get<std::vector<int64_t>>();
    }
  }
  return st;
}

// Copies what one source shard file holds of the stage's parameters (and their optimizer
// state) into every output tensor-parallel rank's targets; returns the source names it used.
std::set<std::string> place_shard(const Conversion& c, const train::RankCheckpoint& shard, int src_pp,
                                  const std::string& file, const Layout& to, StageTargets& st) {
  std::set<std::string> used;
  for (const auto& spec : st.specs) {
    const std::string src = c.source_name(spec);
    if (c.source_stage.at(src) != src_pp) continue;
    if (!shard.shard_info.contains(src)) throw train::CheckpointError(file + ": no shard record (global_shape/offset) of " + src);
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
      for (int tp = 0; tp < to.tp; ++tp)
        place(st.targets[tp][kind + spec.name], shard_shape(spec, to.tp), found->second, offset, global, what);
    }
    used.insert(src);
  }
  return used;
}

// The output rank (tp, pp)'s checkpoint, once every target is fully covered.
train::RankCheckpoint output_rank(const Conversion& c, const Layout& to, int tp, StageTargets& st,
                                  const nlohmann::json& values) {
  train::RankCheckpoint state;
  for (const auto& spec : st.specs) {
    for (const char* kind : kKinds) {
      Target& target = st.targets[tp][kind + spec.name];
      const auto want = shard_shape(spec, to.tp);
      if (!target.tensor.defined() || target.covered != expected_cover(target, want))
        throw train::CheckpointError(fmt::format("checkpoint iteration {}: the shards of {}{} do not cover its part [{}] at "
                                                 "offset [{}] of the new layout",
                                                 c.info.iteration, kind, c.source_name(spec), fmt::join(want, ", "),
                                                 fmt::join(target.offset, ", ")));
      if (*kind) {
        state.optimizer[kind + spec.name] = target.tensor;
      } else {
        state.model[spec.name] = target.tensor;
        state.shard_info[spec.name] = shard_record(spec, tp, to.tp);
      }
    }
  }
  state.values = values;
  return state;
}

}  // namespace

ReshardResult reshard_checkpoint(const ReshardRequest& request) {
  ReshardResult result;
  const Conversion c = open_conversion(request, result);
  const Layout& from = result.from;
  const Layout& to = result.to;
  nlohmann::json values;  // the training position and optimizer scalars, from the first shard
  std::set<std::string> source_names_seen, consumed;
  CheckpointWriter writer(c.out_checkpoints, c.info.iteration, c.out_layout);
  int64_t files_to_read = 0;  // a source stage's shards are read once per output stage needing them
  for (int pp = 0; pp < to.pp; ++pp) files_to_read += int64_t(stage_targets(c, to, pp).source_stages.size()) * from.tp;
  for (int pp = 0; pp < to.pp; ++pp) {
    StageTargets st = stage_targets(c, to, pp);
    for (int src_pp : st.source_stages) {
      for (int src_tp = 0; src_tp < from.tp; ++src_tp) {
        const std::string rel = train::model_parallel_dir_name(src_tp, src_pp, from.pp) + "/" + train::kShardFileName;
        const std::string file = (fs::path(c.location.checkpoints) / train::iteration_dir_name(c.info.iteration) / rel).string();
        const train::RankCheckpoint shard = train::read_checkpoint_shard(c.location.checkpoints, c.info.iteration, rel, c.info.metadata);
        ++result.files_read;
        if (request.on_progress) request.on_progress(result.files_read, files_to_read);
        if (values.is_null()) {
          values = shard.values;
          if (!values.is_object() || !values.contains("consumed_samples") || !values.contains("optimizer"))
            throw ConvertInputError(file + " is not a training checkpoint (no optimizer state or data position)");
        }
        for (const auto& [name, tensor] : shard.model) source_names_seen.insert(name);
        consumed.merge(place_shard(c, shard, src_pp, file, to, st));
      }
    }
    for (int tp = 0; tp < to.tp; ++tp) writer.write_rank(tp, pp, output_rank(c, to, tp, st, values));
  }
  for (const auto& name : source_names_seen)
    if (!consumed.count(name) && name != kTiedCopy)
      throw ConvertInputError("the checkpoint holds parameter " + name + " that the model of its recipe does not have");
  writer.commit();
  train::write_text_atomically((c.out_run / "config.yaml").string(), config::to_yaml(c.recipe));
  return result;
}

}  // namespace loom::convert
