#include "convert/hf_import.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "config/recipe.h"
#include "convert/checkpoint_writer.h"
#include "convert/convert_error.h"
#include "convert/hf_files.h"
#include "convert/hf_gpt2.h"
#include "convert/hf_llama.h"
#include "data/data_error.h"
#include "data/gpt2_tokenizer.h"
#include "data/hf_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "model/init.h"
#include "train/checkpoint_files.h"
#include "train/model_setup.h"
#include "train/training_state.h"

namespace fs = std::filesystem;

namespace loom::convert {
namespace {

// The recipe config.yaml starts from without --recipe: fine-tuning at a small constant rate;
// the data (model.data.data_prefix, a placeholder here) is the user's to set.
constexpr const char* kMinimalRecipe = R"(run:
  name: hf_import
trainer:
  accelerator: cpu
  precision: 32
  max_steps: 1000
  log_every_n_steps: 10
  val_check_interval: 100
  limit_val_batches: 4
exp_manager:
  resume_if_exists: true
  checkpoint_callback_params:
    every_n_steps: 100
model:
  micro_batch_size: 1
  global_batch_size: {global_batch}
  encoder_seq_length: {seq}
  num_layers: 1
  hidden_size: 8
  num_attention_heads: 1
  hidden_dropout: {hidden_dropout}
  attention_dropout: {attention_dropout}
  init_method_std: {init_std}
  data:
    data_prefix: [1.0, SET_model.data.data_prefix]
  tokenizer:
{tokenizer}
  optim:
    name: adamw
    lr: 1.0e-5
    weight_decay: 0.01
    sched:
      name: CosineAnnealing
      warmup_steps: 0
      constant_steps: 0
      min_lr: 1.0e-6
)";

double json_number(const nlohmann::json& c, const char* key, double fallback) {
  return c.contains(key) && c[key].is_number() ? c[key].get<double>() : fallback;
}

// The tokenizer an imported run uses: the GPT-2 BPE files (library megatron), a byte-level BPE
// tokenizer.json (library huggingface; Llama 3, Qwen2, SmolLM folders), or a SentencePiece
// tokenizer.model (library sentencepiece; Llama 2, Mistral 7B, TinyLlama, whose tokenizer.json
// uses byte fallback), copied into RUN/tokenizer/ with the files beside it.
enum class TokenizerKind { kGpt2Files, kHfJson, kSentencePiece };

struct ImportTokenizer {
  TokenizerKind kind = TokenizerKind::kGpt2Files;
  std::vector<std::string> files;  // names in the HF folder, copied as they are; the tokenizer's first
  std::string vocab, merges, model;  // absolute paths in RUN/tokenizer/
};

// The files that travel with a tokenizer.json or tokenizer.model (transformers reads them).
constexpr const char* kTokenizerCompanions[] = {"tokenizer.json", "tokenizer.model", kHfTokenizerConfigFile,
                                                "special_tokens_map.json"};

// Whether Loom's byte-level BPE reader takes `json` (else the reason, for an error).
std::optional<std::string> byte_level_refusal(const fs::path& json) {
  try {
    data::HfTokenizer tokenizer(json.string());
    return std::nullopt;
  } catch (const data::DataError& e) {
    return std::string(e.what());
  }
}

ImportTokenizer find_tokenizer(const fs::path& hf, const fs::path& run, bool llama) {
  ImportTokenizer t;
  const fs::path dir = fs::absolute(run / "tokenizer").lexically_normal();
  auto with_companions = [&](const char* first) {
    t.files = {first};
    for (const char* f : kTokenizerCompanions)
      if (f != std::string(first) && fs::is_regular_file(hf / f)) t.files.push_back(f);
  };
  // A Llama folder carries tokenizer.json (and, SentencePiece-based, tokenizer.model); a GPT-2
  // folder its vocab.json and merges.txt, or only tokenizer.json when transformers 5's
  // save_pretrained wrote it. Tokens added to a GPT-2 tokenizer (chat markers) are in its
  // tokenizer.json only, so a tokenizer.json with more entries than vocab.json is the tokenizer.
  const bool gpt2_files = fs::is_regular_file(hf / "vocab.json") && fs::is_regular_file(hf / "merges.txt");
  const bool added_tokens = !llama && gpt2_files && fs::is_regular_file(hf / "tokenizer.json") &&
                            !byte_level_refusal(hf / "tokenizer.json") &&
                            data::HfTokenizer((hf / "tokenizer.json").string()).vocab_size() >
                                data::Gpt2Tokenizer((hf / "vocab.json").string(), (hf / "merges.txt").string()).vocab_size();
  if (llama || !gpt2_files || added_tokens) {
    const bool json = fs::is_regular_file(hf / "tokenizer.json"), sp = fs::is_regular_file(hf / "tokenizer.model");
    const std::optional<std::string> refused = json ? byte_level_refusal(hf / "tokenizer.json") : std::nullopt;
    if (json && !refused) {
      t.kind = TokenizerKind::kHfJson;
      t.model = (dir / "tokenizer.json").string();
      with_companions("tokenizer.json");
      return t;
    }
    if (sp) {
      t.kind = TokenizerKind::kSentencePiece;
      t.model = (dir / "tokenizer.model").string();
      with_companions("tokenizer.model");
      return t;
    }
    if (refused) throw ConvertInputError(*refused + " (and no tokenizer.model beside it to read with SentencePiece)");
  }
  for (const char* file : {"vocab.json", "merges.txt"})
    if (!fs::is_regular_file(hf / file))
      throw ConvertInputError((hf / file).string() +
                              (llama ? " does not exist: the import needs the tokenizer beside config.json (tokenizer.json, "
                                       "tokenizer.model, or the GPT-2 files vocab.json and merges.txt)"
                                     : " does not exist: the import needs the GPT-2 tokenizer files (vocab.json, "
                                       "merges.txt) or tokenizer.json beside config.json"));
  t.vocab = (dir / "vocab.json").string();
  t.merges = (dir / "merges.txt").string();
  t.files = {"vocab.json", "merges.txt"};
  return t;
}

std::vector<std::string> tokenizer_fields(const ImportTokenizer& t) {
  switch (t.kind) {
    case TokenizerKind::kHfJson:
      return {"model.tokenizer.library=huggingface", "model.tokenizer.model=" + t.model};
    case TokenizerKind::kSentencePiece:
      return {"model.tokenizer.library=sentencepiece", "model.tokenizer.model=" + t.model};
    case TokenizerKind::kGpt2Files:
      break;
  }
  return {"model.tokenizer.library=megatron", "model.tokenizer.vocab_file=" + t.vocab, "model.tokenizer.merge_file=" + t.merges};
}

// The recipe's model.tokenizer section (indented under it) for the same choice.
std::string tokenizer_yaml(const ImportTokenizer& t) {
  switch (t.kind) {
    case TokenizerKind::kHfJson:
      return fmt::format("    library: huggingface\n    model: {}", t.model);
    case TokenizerKind::kSentencePiece:
      return fmt::format("    library: sentencepiece\n    model: {}", t.model);
    case TokenizerKind::kGpt2Files:
      break;
  }
  return fmt::format("    library: megatron\n    vocab_file: {}\n    merge_file: {}", t.vocab, t.merges);
}

// The architecture fields of a non-GPT model (the recipe defaults are GPT's).
std::vector<std::string> architecture_fields(const ModelShape& s) {
  if (s.is_gpt()) return {};
  std::vector<std::string> out = {
      fmt::format("model.normalization={}", recipe_name(s.normalization)),
      fmt::format("model.position_embedding_type={}", recipe_name(s.position_embedding_type)),
      fmt::format("model.rotary_base={}", s.rotary_base),
      fmt::format("model.activation={}", recipe_name(s.activation)),
      fmt::format("model.num_query_groups={}", s.query_groups()),
      fmt::format("model.bias={}", s.bias ? "true" : "false"),
      fmt::format("model.qkv_bias={}", s.qkv_bias ? "true" : "false"),
      fmt::format("model.share_embeddings_and_output_weights={}", s.share_embeddings_and_output_weights ? "true" : "false")};
  if (s.kv_channels > 0) out.push_back(fmt::format("model.kv_channels={}", s.kv_channels));
  if (s.rope_scaling.enabled) {
    const RopeScaling& r = s.rope_scaling;
    for (const std::string& f :
         {std::string("model.rope_scaling=true"), fmt::format("model.rope_scaling_factor={}", r.factor),
          fmt::format("model.low_freq_factor={}", r.low_freq_factor),
          fmt::format("model.high_freq_factor={}", r.high_freq_factor),
          fmt::format("model.old_context_len={}", r.old_context_len)})
      out.push_back(f);
  }
  return out;
}

config::Recipe output_recipe(const HfImportRequest& request, const nlohmann::json& hf_config, const Gpt2Shape& shape,
                             const Layout& layout, const ImportTokenizer& tokenizer) {
  const std::string run = fs::absolute(request.output_run).lexically_normal().string();
  std::vector<std::string> fields = {
      fmt::format("model.num_layers={}", shape.num_layers),
      fmt::format("model.hidden_size={}", shape.hidden_size),
      fmt::format("model.ffn_hidden_size={}", shape.ffn_hidden_size),
      fmt::format("model.num_attention_heads={}", shape.num_attention_heads),
      fmt::format("model.max_position_embeddings={}", shape.max_position_embeddings),
      fmt::format("model.layernorm_epsilon={}", shape.layernorm_epsilon),
  };
  for (const auto& f : tokenizer_fields(tokenizer)) fields.push_back(f);
  for (const auto& f : architecture_fields(shape)) fields.push_back(f);
  config::Recipe base;
  try {
    if (request.recipe.empty()) {
      std::string text = kMinimalRecipe;
      auto put = [&](const std::string& key, const std::string& value) {
        text.replace(text.find("{" + key + "}"), key.size() + 2, value);
      };
      put("global_batch", std::to_string(layout.dp));
      put("tokenizer", tokenizer_yaml(tokenizer));
      put("seq", std::to_string(shape.max_position_embeddings));
      // GPT-2's dropouts; a Llama config has attention_dropout (0) and no hidden dropout.
      put("hidden_dropout", fmt::format("{}", json_number(hf_config, "resid_pdrop", shape.is_gpt() ? 0.1 : 0.0)));
      put("attention_dropout",
          fmt::format("{}", json_number(hf_config, shape.is_gpt() ? "attn_pdrop" : "attention_dropout", shape.is_gpt() ? 0.1 : 0.0)));
      put("init_std", fmt::format("{}", json_number(hf_config, "initializer_range", 0.02)));
      base = config::load_recipe_from_string(text, "<loom convert's fine-tuning recipe>", request.overrides);
    } else {
      base = config::load_recipe(request.recipe, request.overrides);
    }
    if (base.model.encoder_seq_length > shape.max_position_embeddings)
      throw ConvertInputError(fmt::format("{}: model.encoder_seq_length {} exceeds the model's n_positions {}",
                                          request.recipe.empty() ? "the recipe" : request.recipe,
                                          base.model.encoder_seq_length, shape.max_position_embeddings));
    std::vector<std::string> all = request.overrides;
    for (const auto& o : layout_overrides(layout, base, run)) all.push_back(o);
    for (const auto& o : fields) all.push_back(o);
    return request.recipe.empty()
               ? config::load_recipe_from_string(config::to_yaml(base), "<loom convert's fine-tuning recipe>", all)
               : config::load_recipe(request.recipe, all);
  } catch (const config::RecipeError& e) {
    throw ConvertInputError(std::string("the recipe of the imported run does not fit the model or the layout:\n") + e.what());
  }
}

}  // namespace

HfImportResult import_hf(const HfImportRequest& request) {
  const fs::path hf(request.hf_dir);
  const std::string config_file = (hf / kHfConfigFile).string();
  const nlohmann::json hf_config = read_hf_config(request.hf_dir);
  const bool llama = is_llama_config(hf_config);
  const Gpt2Shape shape = llama ? llama_shape_from_config(hf_config, config_file) : gpt2_shape_from_config(hf_config, config_file);
  const Layout layout = resolve_layout(request.layout, Layout{});
  const fs::path run(request.output_run);
  const ImportTokenizer import_tokenizer = find_tokenizer(hf, run, llama);
  // The tokenizer's chat template (`loom serve`'s /v1/chat/completions), read before anything
  // is written.
  const std::string chat_template = read_hf_chat_template(request.hf_dir);
  {
    const std::string file = (hf / import_tokenizer.files.front()).string();
    std::unique_ptr<data::Tokenizer> tokenizer;
    switch (import_tokenizer.kind) {
      case TokenizerKind::kHfJson:
        tokenizer = std::make_unique<data::HfTokenizer>(file);
        break;
      case TokenizerKind::kSentencePiece:
        tokenizer = std::make_unique<data::SentencePieceTokenizer>(file);
        break;
      case TokenizerKind::kGpt2Files:
        tokenizer = std::make_unique<data::Gpt2Tokenizer>(file, (hf / "merges.txt").string());
    }
    if (static_cast<int64_t>(tokenizer->vocab_size()) != shape.vocab_size)
      throw ConvertInputError(fmt::format("{}: vocab_size {} differs from the {} entries of {}", config_file, shape.vocab_size,
                                          tokenizer->vocab_size(), file));
  }

  const std::string checkpoints = (run / "checkpoints").string();
  if (!train::list_iterations(checkpoints).empty() || fs::exists(fs::path(checkpoints) / train::kTrackerFile))
    throw ConvertInputError(checkpoints + " holds checkpoints already: import into a new run directory");
  // The weights next (their size is the file's): every size in config.json is checked against
  // them before a model of those sizes is described or built.
  HfImportResult result;
  auto hf_tensors = read_hf_weights(request.hf_dir, result.weights_file);
  if (llama)
    check_llama_config_against_tensors(shape, hf_tensors, config_file, result.weights_file);
  else
    check_config_against_tensors(shape, hf_tensors, config_file, result.weights_file);
  fs::create_directories(run / "tokenizer");
  const config::Recipe recipe = output_recipe(request, hf_config, shape, layout, import_tokenizer);
  model::GptConfig config = train::gpt_config_from_recipe(recipe, shape.vocab_size);

  result.layout = layout;
  const std::map<std::string, at::Tensor> params =
      llama ? llama_to_loom(hf_tensors, shape, config.padded_vocab_size(layout.tp), result.weights_file)
            : hf_to_loom(hf_tensors, shape, config.padded_vocab_size(layout.tp), result.weights_file);
  hf_tensors.clear();  // one copy of the weights in memory from here on

  CheckpointWriter writer(checkpoints, 0, train::checkpoint_layout(layout, config));
  write_fresh_ranks(writer, layout, config, params);
  for (const auto& file : import_tokenizer.files)
    fs::copy_file(hf / file, run / "tokenizer" / file, fs::copy_options::overwrite_existing);
  if (!chat_template.empty())
    train::write_text_atomically((run / "tokenizer" / kHfChatTemplateFile).string(), chat_template);
  writer.commit();
  train::write_text_atomically((run / "config.yaml").string(), config::to_yaml(recipe));
  return result;
}

}  // namespace loom::convert
