#include "ptune/frozen_base.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "data/recipe_tokenizer.h"
#include "generate/model_loader.h"
#include "train/run_directory.h"
#include "train/model_setup.h"

namespace fs = std::filesystem;

namespace loom::ptune {

std::optional<int64_t> pinned_base_iteration(const config::Recipe& recipe, std::optional<int64_t> resume_iteration,
                                             std::string& why) {
  if (const auto n = recipe.model.prompt.language_model_iteration) {
    why = "model.language_model_iteration";
    return n;
  }
  why.clear();
  const train::RunDirectoryOptions dir = train::run_directory_options(recipe, "loom ptune", resume_iteration);
  try {
    // The iteration RunDirectory::resume will choose (it reports any problem with it).
    const std::optional<int64_t> n = train::resume_iteration(dir);
    if (!n) return std::nullopt;
    const generate::CheckpointInfo info = generate::read_checkpoint_info(train::checkpoints_dir(dir), n);
    const nlohmann::json& recorded = info.layout.task_record;
    if (!recorded.contains("prompt_learning") || !recorded["prompt_learning"].contains("base_iteration")) return std::nullopt;
    why = fmt::format("recorded by the checkpoint being resumed, iteration {}", *n);
    return recorded["prompt_learning"]["base_iteration"].get<int64_t>();
  } catch (const std::exception&) {
    return std::nullopt;  // no readable checkpoint to resume: the run directory decides and reports
  }
}

FrozenBase find_frozen_base(const config::Recipe& recipe, std::optional<int64_t> resume_iteration) {
  const std::string& path = recipe.model.prompt.language_model_path;
  generate::GenerateRequest request;
  request.checkpoint = path;
  std::string pinned_by;
  request.iteration = pinned_base_iteration(recipe, resume_iteration, pinned_by);
  if (recipe.model.tokenizer.library == config::TokenizerLibrary::kMegatron) {
    request.vocab_file = recipe.model.tokenizer.vocab_file;  // empty: the base run's
    request.merge_file = recipe.model.tokenizer.merge_file;
  }
  FrozenBase base;
  base.path = path;
  base.pinned = pinned_by;
  try {
    base.plan = generate::plan_generation(request);
  } catch (const std::exception& e) {
    // Missing folders, trackers and tokenizer files are bad input of this recipe's field; the
    // tokenizer is named by recipe fields here, not by generate's flags.
    std::string why = e.what();
    for (const std::string flags : {"pass --vocab-file and --merge-file", "--vocab-file is needed", "--merge-file is needed"}) {
      const auto at = why.find(flags);
      if (at != std::string::npos) why.replace(at, flags.size(), "set model.tokenizer.vocab_file and merge_file");
    }
    const std::string field = pinned_by == "model.language_model_iteration"
                                  ? fmt::format(" at model.language_model_iteration {}", *request.iteration)
                                  : pinned_by.empty() ? std::string()
                                                      : fmt::format(" at iteration {} ({})", *request.iteration, pinned_by);
    throw std::invalid_argument(fmt::format("model.language_model_path '{}'{}: {}", path, field, why));
  }
  return base;
}

void adopt_base_shape(config::Recipe& recipe, const FrozenBase& base, int64_t seq_length) {
  const model::GptConfig shape = generate::inference_config(base.plan.info.layout.model_shape, base.plan.model_options);
  auto& m = recipe.model;
  m.num_layers = shape.num_layers;
  m.hidden_size = shape.hidden_size;
  m.ffn_hidden_size = shape.ffn();
  m.num_attention_heads = shape.num_attention_heads;
  m.max_position_embeddings = shape.max_position_embeddings;
  m.layernorm_epsilon = shape.layernorm_epsilon;
  m.make_vocab_size_divisible_by = shape.make_vocab_size_divisible_by;
  // The architecture (GPT's defaults for checkpoints that record none).
  m.normalization = shape.normalization;
  m.position_embedding_type = shape.position_embedding_type;
  m.rotary_base = shape.rotary_base;
  m.rotary_percentage = shape.rotary_percentage;
  m.rope_scaling = shape.rope_scaling.enabled;
  m.rope_scaling_factor = shape.rope_scaling.factor;
  m.low_freq_factor = shape.rope_scaling.low_freq_factor;
  m.high_freq_factor = shape.rope_scaling.high_freq_factor;
  m.old_context_len = shape.rope_scaling.old_context_len;
  if (shape.kv_channels > 0) m.kv_channels = shape.kv_channels;
  m.activation = shape.activation;
  m.num_query_groups = shape.query_groups();
  m.bias = shape.bias;
  m.qkv_bias = shape.qkv_bias;
  m.share_embeddings_and_output_weights = shape.share_embeddings_and_output_weights;
  m.encoder_seq_length = seq_length;
  m.data.seq_length = seq_length;
  // The frozen base is a fixed function of its input.
  m.hidden_dropout = 0.0;
  m.attention_dropout = 0.0;
  m.ffn_dropout = 0.0;
  m.tokenizer = data::tokenizer_config(run_tokenizer(recipe, base));
}

data::TokenizerSpec run_tokenizer(const config::Recipe& recipe, const FrozenBase& base) {
  const config::TokenizerConfig& own = recipe.model.tokenizer;
  const data::TokenizerSpec& theirs = base.plan.tokenizer;
  if (own.library != config::TokenizerLibrary::kMegatron) {
    if (own.model) return data::tokenizer_spec(own);
    return theirs;
  }
  if (own.vocab_file.empty() && own.merge_file.empty()) return theirs;
  data::TokenizerSpec spec = data::tokenizer_spec(own);
  if (theirs.library == "megatron") {
    if (spec.vocab_file.empty()) spec.vocab_file = theirs.vocab_file;
    if (spec.merge_file.empty()) spec.merge_file = theirs.merge_file;
  }
  return spec;
}

std::shared_ptr<data::Tokenizer> load_run_tokenizer(const config::Recipe& recipe, const FrozenBase& base) {
  std::shared_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(run_tokenizer(recipe, base));
  const int64_t base_vocab = base.plan.info.layout.model_shape.vocab_size;
  if (static_cast<int64_t>(tokenizer->vocab_size()) != base_vocab)
    throw std::invalid_argument(fmt::format("model.tokenizer: {} has {} tokens, the base model '{}' a vocabulary of {} "
                                            "(to use the base's own tokenizer, leave model.tokenizer out or set "
                                            "model.tokenizer.vocab_file='' and merge_file='')",
                                            tokenizer->description(), tokenizer->vocab_size(), base.path, base_vocab));
  return tokenizer;
}

nlohmann::json tokenizer_record(const data::TokenizerSpec& t) {
  auto absolute = [](const std::string& path) { return path.empty() ? path : fs::weakly_canonical(path).string(); };
  return {{"library", t.library}, {"type", t.type}, {"model", absolute(t.model)},
          {"vocab_file", absolute(t.vocab_file)}, {"merge_file", absolute(t.merge_file)}};
}

std::optional<data::TokenizerSpec> recorded_tokenizer(const nlohmann::json& tables_base) {
  data::TokenizerSpec spec;
  const nlohmann::json& t = tables_base.contains("tokenizer") ? tables_base["tokenizer"] : tables_base;
  if (!t.is_object()) return std::nullopt;
  spec.library = t.value("library", std::string("megatron"));
  spec.type = t.value("type", spec.type);
  spec.model = t.value("model", std::string());
  spec.vocab_file = t.value("vocab_file", std::string());
  spec.merge_file = t.value("merge_file", std::string());
  const std::vector<std::string> files =
      spec.library == "megatron" ? std::vector{spec.vocab_file, spec.merge_file} : std::vector{spec.model};
  for (const auto& file : files)
    if (file.empty() || !fs::exists(file)) return std::nullopt;
  return spec;
}

std::vector<model::GptStage> build_frozen_chunks(const generate::FullCheckpoint& full, const model::GptConfig& config,
                                                 runtime::ProcessGroups& groups, int virtual_stages) {
  auto chunks = train::build_model_chunks(config, groups, virtual_stages, groups.device());
  for (const auto& chunk : chunks) {
    generate::fill_stage_parameters(full, chunk, groups.coords().tp, groups.layout().tensor_parallel());
    for (const auto& p : chunk.parameters()) p.tensor.requires_grad_(false);
  }
  return chunks;
}

namespace {

// FNV-1a over (name, shape, bytes) of named tensors, in the order given.
class TensorDigest {
 public:
  void add(const std::string& name, const at::Tensor& tensor) {
    mix(name.data(), name.size());
    // host: the digest reads every byte once (start and end of a run)
    const at::Tensor host = tensor.detach().to(at::kCPU).contiguous();
    for (int64_t d : host.sizes()) mix(&d, sizeof d);
    mix(host.data_ptr(), host.nbytes());
  }
  std::string hex() const { return fmt::format("{:016x}", h_); }

 private:
  void mix(const void* data, size_t n) {
    const auto* b = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ b[i]) * 1099511628211ull;
  }
  uint64_t h_ = 1469598103934665603ull;
};

}  // namespace

std::string parameters_digest(const std::vector<model::GptStage>& chunks) {
  TensorDigest d;
  for (const auto& chunk : chunks)
    for (const auto& p : chunk.parameters()) d.add(p.name, p.tensor);
  return d.hex();
}

std::string checkpoint_digest(const generate::FullCheckpoint& checkpoint) {
  TensorDigest d;
  for (const auto& [name, tensor] : checkpoint.params) d.add(name, tensor);  // std::map: name order
  return d.hex();
}

}  // namespace loom::ptune
