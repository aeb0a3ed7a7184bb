#include "finetune/lora_run.h"

#include <fmt/format.h>

#include "generate/checkpoint_reader.h"
#include "generate/generate_run.h"
#include "train/run_directory.h"

namespace loom::finetune {

nlohmann::json LoraRecord::to_json() const {
  return {{"base_checkpoints", base_checkpoints},
          {"base_iteration", base_iteration},
          {"base_digest", base_digest},
          {"adapter_dim", lora.dim},
          {"alpha", lora.alpha},
          {"adapter_dropout", lora.dropout},
          {"target_modules", lora_target_names(lora.targets)}};
}

LoraRecord LoraRecord::from_json(const nlohmann::json& j, const std::string& what) {
  LoraRecord r;
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key))
      throw std::invalid_argument(fmt::format("{}: its LoRA record (layout.model.lora) has no {}", what, key));
    return j[key];
  };
  try {
    r.base_checkpoints = field("base_checkpoints").get<std::string>();
    r.base_iteration = field("base_iteration").get<int64_t>();
    r.base_digest = field("base_digest").get<std::string>();
    r.lora.dim = field("adapter_dim").get<int64_t>();
    r.lora.alpha = field("alpha").get<double>();
    r.lora.dropout = field("adapter_dropout").get<double>();
    r.lora.targets = parse_lora_targets(field("target_modules").get<std::vector<std::string>>());
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(fmt::format("{}: malformed LoRA record (layout.model.lora): {}", what, e.what()));
  }
  if (!r.lora.enabled()) throw std::invalid_argument(what + ": its LoRA record names no adapters");
  return r;
}

namespace {

// The base iteration a resumed run's checkpoint recorded (the run directory's one rule picks
// the checkpoint), so that a base run that trained on meanwhile does not change the function
// being adapted; nullopt: the base's latest.
std::optional<int64_t> recorded_base_iteration(const config::Recipe& recipe, std::optional<int64_t> resume_iteration) {
  const train::RunDirectoryOptions dir = train::run_directory_options(recipe, "loom finetune", resume_iteration);
  try {
    const std::optional<int64_t> n = train::resume_iteration(dir);
    if (!n) return std::nullopt;
    const auto info = generate::read_checkpoint_info(train::checkpoints_dir(dir), n);
    const nlohmann::json& recorded = info.layout.task_record;
    if (!recorded.contains(kLoraRecordKey) || !recorded[kLoraRecordKey].contains("base_iteration")) return std::nullopt;
    return recorded[kLoraRecordKey]["base_iteration"].get<int64_t>();
  } catch (const std::exception&) {
    return std::nullopt;  // nothing readable to resume: the run directory decides and reports
  }
}

}  // namespace

LoraRunPlan plan_lora_run(const config::Recipe& recipe, std::optional<int64_t> resume_iteration) {
  LoraRunPlan plan;
  plan.recipe = recipe;
  auto& r = plan.recipe;
  const std::string& path = r.model.restore_from_path;
  generate::GenerateRequest request;
  request.checkpoint = path;
  request.iteration = recorded_base_iteration(r, resume_iteration);
  if (r.model.tokenizer.library == config::TokenizerLibrary::kMegatron) {
    request.vocab_file = r.model.tokenizer.vocab_file;  // empty: the base run's
    request.merge_file = r.model.tokenizer.merge_file;
  }
  plan.base.path = path;
  if (request.iteration) plan.base.pinned = fmt::format("recorded by the checkpoint being resumed");
  try {
    plan.base.plan = generate::plan_generation(request);
  } catch (const std::exception& e) {
    throw std::invalid_argument(fmt::format("model.restore_from_path '{}': {}", path, e.what()));
  }
  const int64_t positions = plan.base.plan.info.layout.model_shape.max_position_embeddings;
  if (r.model.data.seq_length > positions)
    throw std::invalid_argument(fmt::format("model.data.seq_length: expected at most the base's max_position_embeddings "
                                            "{} (model.restore_from_path '{}'), found {}",
                                            positions, path, r.model.data.seq_length));
  ptune::adopt_base_shape(r, plan.base, r.model.data.seq_length);
  ptune::load_run_tokenizer(r, plan.base);  // its size must be the base's vocabulary
  config::validate_adopted_shape(r);
  return plan;
}

}  // namespace loom::finetune
