#include "finetune/lora_run.h"

#include <fmt/format.h>

#include <filesystem>
#include <numeric>

#include "convert/hf_files.h"
#include "data/data_error.h"
#include "generate/checkpoint_reader.h"
#include "generate/generate_run.h"
#include "train/run_directory.h"

namespace fs = std::filesystem;

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

// The chat template of chat records: train_ds.chat_template, else the base run's own (as loom serve
// finds it); null when neither exists. Records its file in the plan.
std::shared_ptr<const serve::ChatTemplate> chat_template(FinetuneRunPlan& plan) {
  const auto& given = plan.recipe.model.data.sft_train.chat_template;
  const std::string& run_dir = plan.base.plan.location.run_dir;
  const std::string own = run_dir.empty() ? "" : run_dir + "/tokenizer/" + convert::kHfChatTemplateFile;
  const std::string path = given ? *given : (!own.empty() && fs::is_regular_file(own) ? own : "");
  if (path.empty()) return nullptr;
  plan.chat_template_file = path;
  auto token = [&](int32_t id) { return id >= 0 ? plan.tokenizer->decode({id}) : std::string(); };
  try {
    return serve::read_chat_template(path, token(plan.tokenizer->bos_id()), token(plan.tokenizer->eod_id()));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(given ? "model.data.train_ds.chat_template: " : "") + e.what());
  }
}

std::shared_ptr<SftDataset> read_dataset(const char* field, const std::vector<std::string>& files,
                                         const SftLayout& layout, const data::Tokenizer& tokenizer) {
  if (files.empty()) return nullptr;
  try {
    return std::make_shared<SftDataset>(files, layout, tokenizer);
  } catch (const data::DataError& e) {
    throw data::DataError(std::string(field) + ": " + e.what());
  }
}

}  // namespace

FinetuneRunPlan plan_finetune_run(const config::Recipe& recipe, std::optional<int64_t> resume_iteration) {
  FinetuneRunPlan plan;
  plan.recipe = recipe;
  auto& r = plan.recipe;
  plan.lora = r.model.peft.peft_scheme == "lora";
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
  plan.tokenizer = ptune::load_run_tokenizer(r, plan.base);  // its size must be the base's vocabulary

  // The datasets, laid out as train_ds says.
  const auto& t = r.model.data.sft_train;
  const int64_t positions = plan.base.plan.info.layout.model_shape.max_position_embeddings;
  const int64_t max_seq = t.max_seq_length.value_or(positions);
  if (max_seq > positions)
    throw std::invalid_argument(fmt::format("model.data.train_ds.max_seq_length: expected at most the base's "
                                            "max_position_embeddings {} (model.restore_from_path '{}'), found {}",
                                            positions, path, max_seq));
  SftLayout layout;
  layout.prompt_template = parse_sft_template(t, max_seq);
  layout.chat_template = chat_template(plan);
  layout.add_bos = t.add_bos;
  layout.add_eos = t.add_eos;
  layout.max_seq_length = max_seq;
  plan.train = read_dataset("model.data.train_ds.file_names", t.file_names, layout, *plan.tokenizer);
  plan.valid = read_dataset("model.data.validation_ds.file_names", r.model.data.sft_validation.file_names, layout,
                            *plan.tokenizer);
  if (plan.train->size() == 0)
    throw data::DataError("model.data.train_ds.file_names: no training examples (" + plan.train->summary() + ")");

  // One sequence length for the run: rows of the longest example (rounded for speed and for
  // sequence parallelism's split), or, packed, of max_seq_length's inputs.
  const int64_t tp = r.model.tensor_model_parallel_size;
  const bool sp = r.model.sequence_parallel;
  int64_t longest = t.packed_sequence ? max_seq - 1 : plan.train->longest_input();
  if (plan.valid) longest = std::max(longest, plan.valid->longest_input());
  try {
    plan.seq_length =
        prompt_data::round_sequence_length(longest, max_seq, sp ? std::lcm<int64_t>(8, tp) : 8, sp ? tp : 1);
  } catch (const data::DataError& e) {
    throw data::DataError(std::string("model.data.train_ds.max_seq_length: ") + e.what());
  }
  if (t.packed_sequence) {
    std::vector<int64_t> lengths;
    for (int64_t i = 0; i < plan.train->size(); ++i) lengths.push_back((*plan.train)[i].size() - 1);
    plan.packing = prompt_data::first_fit_decreasing(lengths, plan.seq_length);
  }
  ptune::adopt_base_shape(r, plan.base, plan.seq_length);
  config::validate_adopted_shape(r);
  return plan;
}

}  // namespace loom::finetune
