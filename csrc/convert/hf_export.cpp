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

// The run's tokenizer.json (model.tokenizer.model: the file or a folder holding it) and the
// tokenizer_config.json / special_tokens_map.json beside it, copied into the export.
void copy_hf_json_tokenizer(const config::Recipe& recipe, const std::string& run_dir, const std::string& out) {
  const std::string field = "model.tokenizer.model";
  const std::string given = recipe.model.tokenizer.model.value_or("");
  fs::path json = given;
  if (!given.empty() && fs::is_directory(given)) json = fs::path(given) / "tokenizer.json";
  else if (!given.empty() && fs::path(given).is_relative() && fs::is_directory(fs::path(run_dir) / given))
    json = fs::path(run_dir) / given / "tokenizer.json";
  json = resolve_run_file(json.string(), run_dir, field);
  fs::copy_file(json, fs::path(out) / "tokenizer.json", fs::copy_options::overwrite_existing);
  for (const char* f : {kHfTokenizerConfigFile, "special_tokens_map.json"})
    if (fs::is_regular_file(json.parent_path() / f))
      fs::copy_file(json.parent_path() / f, fs::path(out) / f, fs::copy_options::overwrite_existing);
}

// A Llama-family run: config.json, model.safetensors and the run's tokenizer (tokenizer.json, or
// the GPT-2 files) as a LlamaForCausalLM folder.
HfExportResult export_llama(const HfExportRequest& request, const generate::CheckpointLocation& location,
                            const config::Recipe& recipe, const generate::CheckpointInfo& info) {
  Gpt2Shape shape;
  static_cast<ModelShape&>(shape) = info.layout.model_shape;
  shape.layernorm_epsilon = recipe.model.layernorm_epsilon;
  check_llama_exportable(shape);
  const bool hf_json = recipe.model.tokenizer.library == config::TokenizerLibrary::kHuggingFace;
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::string vocab_file, merge_file;
  if (hf_json) {
    tokenizer = data::make_tokenizer(data::tokenizer_spec(recipe.model.tokenizer));
  } else {
    std::tie(vocab_file, merge_file) = gpt2_tokenizer_files(recipe, location.run_dir);
    tokenizer = std::make_unique<data::Gpt2Tokenizer>(vocab_file, merge_file);
  }
  if (static_cast<int64_t>(tokenizer->vocab_size()) != shape.vocab_size)
    throw ConvertInputError(fmt::format("the run's tokenizer ({}) has {} entries, the checkpoint's model a vocabulary of {}",
                                        tokenizer->description(), tokenizer->vocab_size(), shape.vocab_size));

  const generate::FullCheckpoint full = generate::read_full_checkpoint(location.checkpoints, info);
  tensor_io::SafetensorsContent content;
  content.tensors = loom_to_llama(full.params, shape);
  content.metadata = {{"format", "pt"}};
  HfConfigExtras extras;
  extras.attention_dropout = recipe.model.attention_dropout;
  extras.init_method_std = recipe.model.init_method_std;
  extras.dtype = hf_dtype_name(content.tensors.begin()->second.scalar_type());
  const int64_t eos = tokenizer->eod_id() >= 0 ? tokenizer->eod_id() : tokenizer->bos_id();
  const int64_t bos = tokenizer->bos_id() >= 0 ? tokenizer->bos_id() : eos;

  fs::create_directories(request.output_dir);
  tensor_io::write_safetensors((fs::path(request.output_dir) / kHfWeightsFile).string(), content);
  write_hf_config(request.output_dir, llama_config_json(shape, extras, bos, eos));
  if (hf_json)
    copy_hf_json_tokenizer(recipe, location.run_dir, request.output_dir);
  else
    write_hf_tokenizer(request.output_dir, vocab_file, merge_file, shape.max_position_embeddings);
  const fs::path chat_template = fs::path(location.run_dir) / "tokenizer" / kHfChatTemplateFile;
  if (!location.run_dir.empty() && fs::is_regular_file(chat_template))
    fs::copy_file(chat_template, fs::path(request.output_dir) / kHfChatTemplateFile, fs::copy_options::overwrite_existing);
  HfExportResult result;
  result.iteration = info.iteration;
  for (const auto& [name, t] : content.tensors) result.parameters += t.numel();
  return result;
}

}  // namespace

HfExportResult export_hf(const HfExportRequest& request) {
  refuse_occupied_output(request.output_dir, request.overwrite, "--to hf");
  const generate::CheckpointLocation location = generate::locate_checkpoint(request.checkpoint);
  const config::Recipe recipe = load_run_recipe(location.run_dir, "the Hugging Face export (layer norm epsilon, tokenizer)");
  const generate::CheckpointInfo info = generate::read_checkpoint_info(location.checkpoints, request.iteration);
  if (!info.layout.model_shape.is_gpt()) return export_llama(request, location, recipe, info);
  const auto [vocab_file, merge_file] = gpt2_tokenizer_files(recipe, location.run_dir);
  Gpt2Shape shape;
  static_cast<ModelShape&>(shape) = info.layout.model_shape;
  shape.layernorm_epsilon = recipe.model.layernorm_epsilon;

  // GPT-2-format specific: a GPT2LMHeadModel folder carries vocab.json + merges.txt, so the export
  // reads the run's tokenizer as GPT-2 BPE (gpt2_tokenizer_files refuses other libraries).
  const data::Gpt2Tokenizer tokenizer(vocab_file, merge_file);
  if (static_cast<int64_t>(tokenizer.vocab_size()) != shape.vocab_size)
    throw ConvertInputError(fmt::format("the run's tokenizer {} has {} entries, the checkpoint's model a vocabulary of {}",
                                        vocab_file, tokenizer.vocab_size(), shape.vocab_size));
  if (tokenizer.eod_id() < 0) throw ConvertInputError(vocab_file + " has no <|endoftext|> entry");

  const generate::FullCheckpoint full = generate::read_full_checkpoint(location.checkpoints, info);
  tensor_io::SafetensorsContent content;
  content.tensors = loom_to_hf(full.params, shape);
  content.metadata = {{"format", "pt"}};  // transformers refuses files without it
  HfConfigExtras extras;
  extras.hidden_dropout = recipe.model.hidden_dropout;
  extras.attention_dropout = recipe.model.attention_dropout;
  extras.init_method_std = recipe.model.init_method_std;
  extras.eod_id = tokenizer.eod_id();
  extras.dtype = hf_dtype_name(content.tensors.begin()->second.scalar_type());

  fs::create_directories(request.output_dir);
  tensor_io::write_safetensors((fs::path(request.output_dir) / kHfWeightsFile).string(), content);
  write_hf_config(request.output_dir, hf_config_json(shape, extras));
  write_hf_tokenizer(request.output_dir, vocab_file, merge_file, shape.max_position_embeddings);
  // The run's chat template (loom convert --from hf keeps it there), where transformers reads it.
  const fs::path chat_template = fs::path(location.run_dir) / "tokenizer" / kHfChatTemplateFile;
  if (!location.run_dir.empty() && fs::is_regular_file(chat_template))
    fs::copy_file(chat_template, fs::path(request.output_dir) / kHfChatTemplateFile,
                  fs::copy_options::overwrite_existing);

  HfExportResult result;
  result.iteration = info.iteration;
  for (const auto& [name, t] : content.tensors) result.parameters += t.numel();
  return result;
}

}  // namespace loom::convert
