#include "planner/recipe_input.h"

#include <filesystem>
#include <stdexcept>

#include "config/derived.h"
#include "data/recipe_tokenizer.h"

namespace loom::planner {

int64_t recipe_vocab_size(const config::Recipe& r) {
  const config::TokenizerConfig& t = r.model.tokenizer;
  if (t.library == config::TokenizerLibrary::kMegatron) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(t.vocab_file, ec) || !std::filesystem::is_regular_file(t.merge_file, ec))
      return config::kGpt2VocabSize;
  }
  try {
    return data::recipe_vocab_size(t);
  } catch (const std::exception& e) {
    throw std::invalid_argument(
        std::string("model.tokenizer: the planner needs the tokenizer's vocabulary size (or give --vocab-size): ") +
        e.what());
  }
}

RecipePlanInput plan_input_from_recipe(const config::Recipe& r, std::optional<int64_t> vocab_size) {
  RecipePlanInput in;
  const auto& m = r.model;
  in.shape = config::recipe_model_shape(r, vocab_size ? *vocab_size : recipe_vocab_size(r));
  // The planner holds V as trained (ModelShape::vocab_size of planner shapes): padded for t = 1.
  in.shape.vocab_size = in.shape.padded_vocab_size(1);
  in.setup.global_batch = int(m.global_batch_size);
  in.setup.precision = r.trainer.precision;
  in.setup.overlap_dp_comm = r.model.optim.overlap_grad_sync;
  in.setup.overlap_param_gather = r.model.optim.overlap_param_sync;
  in.setup.dp_bucket_params = double(r.model.optim.ddp_bucket_size.value_or(0));
  in.setup.fused_attention = m.use_flash_attention;
  in.setup.attention_dropout = m.attention_dropout > 0;
  in.num_nodes = int(r.trainer.num_nodes);
  in.devices = int(r.trainer.devices);
  in.cpu = r.trainer.accelerator == config::Accelerator::kCpu;
  in.gpu = r.cluster.gpu.value_or("");
  in.layout = config::recipe_layout(r);
  return in;
}

std::vector<std::string> layout_overrides(const Layout& L, const config::Recipe& base) {
  const bool full = L.recompute.granularity == RecomputeGranularity::kFull;
  std::vector<std::string> o = {
      "model.tensor_model_parallel_size=" + std::to_string(L.tp),
      "model.pipeline_model_parallel_size=" + std::to_string(L.pp),
      "model.virtual_pipeline_model_parallel_size=" + (L.vp > 1 ? std::to_string(L.vp) : std::string("null")),
      "model.micro_batch_size=" + std::to_string(L.micro_batch),
      std::string("model.sequence_parallel=") + (L.sequence_parallel ? "true" : "false"),
      std::string("model.activations_checkpoint_granularity=") +
          recipe_name(L.recompute.granularity),
      std::string("model.activations_checkpoint_method=") + (full ? recipe_name(L.recompute.method) : "null"),
      "model.activations_checkpoint_num_layers=" + (full ? std::to_string(L.recompute.num_layers.value_or(0)) : std::string("null")),
      std::string("model.use_distributed_optimizer=") + (L.distributed_optimizer ? "true" : "false"),
      "model.num_layers_in_first_pipeline_stage=" +
          (L.first_stage_layers ? std::to_string(*L.first_stage_layers) : std::string("null")),
      "model.num_layers_in_last_pipeline_stage=" +
          (L.last_stage_layers ? std::to_string(*L.last_stage_layers) : std::string("null")),
  };
  const bool base_distributed = base.model.optim.name == config::OptimizerName::kDistributedFusedAdam;
  // distributed_fused_adam implies sharding: without it, the same AdamW unsharded.
  if (!L.distributed_optimizer && base_distributed) o.push_back("model.optim.name=fused_adam");
  return o;
}

}  // namespace loom::planner
