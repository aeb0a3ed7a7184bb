#include "convert/hf_export.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <tuple>
#include <vector>

#include "convert/convert_error.h"
#include "convert/hf_gpt2.h"
#include "convert/hf_files.h"
#include "convert/hf_llama.h"
#include "convert/run_recipe.h"
#include "data/gpt2_tokenizer.h"
#include "data/recipe_tokenizer.h"
#include "generate/checkpoint_reader.h"
#include "launch/file_util.h"
#include "tensor_io/safetensors_file.h"

namespace fs = std::filesystem;

namespace loom::convert {

void refuse_occupied_output(const std::string& output_dir, bool overwrite, const std::string& flag) {
  const fs::path out(output_dir);
  if (fs::is_symlink(fs::symlink_status(out)) && !fs::exists(out))
    throw ConvertInputError(output_dir + " is a symbolic link to nothing: name a directory");
  if (!fs::exists(out)) return;
  if (!fs::is_directory(out)) throw ConvertInputError(output_dir + " exists and is not a directory");
  // Not std::filesystem's directory iteration (launch/file_util.h says why).
  const std::vector<std::string> entries = launch::list_directory(output_dir);
  if (overwrite || entries.empty()) return;
  throw ConvertInputError(fmt::format("{} is not empty (it holds '{}'): {} writes into a new or empty directory; "
                                      "pass --overwrite to replace the Hugging Face files in it",
                                      output_dir, entries.front(), flag));
}

namespace {

// A Llama-family checkpoint is exported as LlamaForCausalLM: the architecture it needs.
void check_llama_exportable(const ModelShape& s) {
  std::string bad;
  if (s.normalization != Normalization::kRmsNorm) bad += " normalization rmsnorm,";
  if (s.position_embedding_type != PositionEmbedding::kRope) bad += " position_embedding_type rope,";
  if (s.activation != Activation::kSwiglu) bad += " activation fast-swiglu,";
  if (s.bias) bad += " bias false,";
  if (s.rotary_percentage != 1.0) bad += " rotary_percentage 1.0,";
  if (bad.empty()) return;
  bad.pop_back();
  throw ConvertInputError("the checkpoint's model is neither GPT-2 (every architecture field at its default) nor a "
                          "LlamaForCausalLM, which needs" + bad);
}

// The run's tokenizer.json or SentencePiece tokenizer.model (model.tokenizer.model: the file, or
// a folder holding tokenizer.json) and the files transformers reads beside it (tokenizer.json,
// tokenizer.model, tokenizer_config.json, special_tokens_map.json), copied into the export.
void copy_tokenizer_files(const config::Recipe& recipe, const std::string& run_dir, const std::string& out) {
  const std::string field = "model.tokenizer.model";
  const std::string given = recipe.model.tokenizer.model.value_or("");
  fs::path file = given;
  if (!given.empty() && fs::is_directory(given)) file = fs::path(given) / "tokenizer.json";
  else if (!given.empty() && fs::path(given).is_relative() && fs::is_directory(fs::path(run_dir) / given))
    file = fs::path(run_dir) / given / "tokenizer.json";
  file = resolve_run_file(file.string(), run_dir, field);
  const std::string name = recipe.model.tokenizer.library == config::TokenizerLibrary::kSentencePiece
                               ? "tokenizer.model" : "tokenizer.json";
  fs::copy_file(file, fs::path(out) / name, fs::copy_options::overwrite_existing);
  for (const char* f : {"tokenizer.json", "tokenizer.model", kHfTokenizerConfigFile, "special_tokens_map.json"})
    if (f != name && fs::is_regular_file(file.parent_path() / f))
      fs::copy_file(file.parent_path() / f, fs::path(out) / f, fs::copy_options::overwrite_existing);
}

// The run's tokenizer as the export carries it: tokenizer.json (library huggingface),
// tokenizer.model (library sentencepiece) or the GPT-2 BPE files; its size must be the
// checkpoint's vocabulary.
struct ExportTokenizer {
  bool gpt2_files = true;  ///< vocab.json + merges.txt, else a tokenizer.json / tokenizer.model
  std::string vocab_file, merge_file;
  std::unique_ptr<data::Tokenizer> tokenizer;
};

ExportTokenizer export_tokenizer(const config::Recipe& recipe, const std::string& run_dir, int64_t vocab_size) {
  ExportTokenizer t;
  t.gpt2_files = recipe.model.tokenizer.library == config::TokenizerLibrary::kMegatron;
  if (!t.gpt2_files) {
    t.tokenizer = data::make_tokenizer(data::tokenizer_spec(recipe.model.tokenizer));
  } else {
    std::tie(t.vocab_file, t.merge_file) = gpt2_tokenizer_files(recipe, run_dir);
    t.tokenizer = std::make_unique<data::Gpt2Tokenizer>(t.vocab_file, t.merge_file);
  }
  if (static_cast<int64_t>(t.tokenizer->vocab_size()) != vocab_size)
    throw ConvertInputError(fmt::format("the run's tokenizer ({}) has {} entries, the checkpoint's model a vocabulary of {}",
                                        t.tokenizer->description(), t.tokenizer->vocab_size(), vocab_size));
  return t;
}

// The tokenizer files and the run's chat template (loom convert --from hf keeps it in
// RUN/tokenizer/), where transformers reads them.
void write_export_tokenizer(const ExportTokenizer& t, const config::Recipe& recipe, const std::string& run_dir,
                            const std::string& out, int64_t max_positions) {
  if (t.gpt2_files)
    write_hf_tokenizer(out, t.vocab_file, t.merge_file, max_positions);
  else
    copy_tokenizer_files(recipe, run_dir, out);
  const fs::path chat_template = fs::path(run_dir) / "tokenizer" / kHfChatTemplateFile;
  if (!run_dir.empty() && fs::is_regular_file(chat_template))
    fs::copy_file(chat_template, fs::path(out) / kHfChatTemplateFile, fs::copy_options::overwrite_existing);
}

// A Llama-family run: config.json, model.safetensors and the run's tokenizer (tokenizer.json, or
// the GPT-2 files) as a LlamaForCausalLM folder.
HfExportResult export_llama(const HfExportRequest& request, const generate::CheckpointLocation& location,
                            const config::Recipe& recipe, const generate::CheckpointInfo& info) {
  Gpt2Shape shape;
  static_cast<ModelShape&>(shape) = info.layout.model_shape;
  shape.layernorm_epsilon = recipe.model.layernorm_epsilon;
  check_llama_exportable(shape);
  const ExportTokenizer tokenizer = export_tokenizer(recipe, location.run_dir, shape.vocab_size);

  const generate::FullCheckpoint full = generate::read_full_checkpoint(location.checkpoints, info);
  tensor_io::SafetensorsContent content;
  content.tensors = loom_to_llama(full.params, shape);
  content.metadata = {{"format", "pt"}};
  HfConfigExtras extras;
  extras.attention_dropout = recipe.model.attention_dropout;
  extras.init_method_std = recipe.model.init_method_std;
  extras.dtype = hf_dtype_name(content.tensors.begin()->second.scalar_type());
  const int64_t eos = tokenizer.tokenizer->eod_id() >= 0 ? tokenizer.tokenizer->eod_id() : tokenizer.tokenizer->bos_id();
  const int64_t bos = tokenizer.tokenizer->bos_id() >= 0 ? tokenizer.tokenizer->bos_id() : eos;

  fs::create_directories(request.output_dir);
  tensor_io::write_safetensors((fs::path(request.output_dir) / kHfWeightsFile).string(), content);
  write_hf_config(request.output_dir, llama_config_json(shape, extras, bos, eos));
  write_export_tokenizer(tokenizer, recipe, location.run_dir, request.output_dir, shape.max_position_embeddings);
  HfExportResult result;
  result.iteration = info.iteration;
  for (const auto& [name, t] : content.tensors) result.parameters += t.numel();
  return result;
}

}  // namespace

HfExportResult export_hf(const HfExportRequest& request) {
  refuse_occupied_output(request.output_dir, request.overwrite, "--to hf");
  const generate::CheckpointLocation location = generate::locate_checkpoint(request.checkpoint);
  const generate::CheckpointInfo info = generate::read_checkpoint_info(location.checkpoints, request.iteration);
  generate::refuse_adapter_checkpoint(info, request.checkpoint);
  const config::Recipe recipe = load_run_recipe(location.run_dir, "the Hugging Face export (layer norm epsilon, tokenizer)");
  if (!info.layout.model_shape.is_gpt()) return export_llama(request, location, recipe, info);
  Gpt2Shape shape;
  static_cast<ModelShape&>(shape) = info.layout.model_shape;
  shape.layernorm_epsilon = recipe.model.layernorm_epsilon;
  // A GPT2LMHeadModel folder carries vocab.json + merges.txt (or, for a run imported from a
  // folder that had only tokenizer.json, that file); GPT-2 ends texts with <|endoftext|>.
  const ExportTokenizer tokenizer = export_tokenizer(recipe, location.run_dir, shape.vocab_size);
  if (tokenizer.tokenizer->eod_id() < 0)
    throw ConvertInputError(tokenizer.tokenizer->description() + " has no <|endoftext|> entry");

  const generate::FullCheckpoint full = generate::read_full_checkpoint(location.checkpoints, info);
  tensor_io::SafetensorsContent content;
  content.tensors = loom_to_hf(full.params, shape);
  content.metadata = {{"format", "pt"}};  // transformers refuses files without it
  HfConfigExtras extras;
  extras.hidden_dropout = recipe.model.hidden_dropout;
  extras.attention_dropout = recipe.model.attention_dropout;
  extras.init_method_std = recipe.model.init_method_std;
  extras.eod_id = tokenizer.tokenizer->eod_id();
  extras.dtype = hf_dtype_name(content.tensors.begin()->second.scalar_type());

  fs::create_directories(request.output_dir);
  tensor_io::write_safetensors((fs::path(request.output_dir) / kHfWeightsFile).string(), content);
  write_hf_config(request.output_dir, hf_config_json(shape, extras));
  write_export_tokenizer(tokenizer, recipe, location.run_dir, request.output_dir, shape.max_position_embeddings);

  HfExportResult result;
  result.iteration = info.iteration;
  for (const auto& [name, t] : content.tensors) result.parameters += t.numel();
  return result;
}

}  // namespace loom::convert
