#include "convert/hf_export.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>
#include <vector>

#include "convert/convert_error.h"
#include "convert/hf_gpt2.h"
#include "convert/hf_files.h"
#include "convert/run_recipe.h"
#include "data/gpt2_tokenizer.h"
#include "generate/checkpoint_reader.h"
#include "launch/file_util.h"
#include "tensor_io/safetensors_file.h"

namespace fs = std::filesystem;

namespace loom::convert {
namespace {

// An export never replaces a model without being told to (checked before anything is read).
void refuse_occupied_output(const HfExportRequest& request) {
  const fs::path out(request.output_dir);
  if (fs::is_symlink(fs::symlink_status(out)) && !fs::exists(out))
    throw ConvertInputError(request.output_dir + " is a symbolic link to nothing: name a directory");
  if (!fs::exists(out)) return;
  if (!fs::is_directory(out)) throw ConvertInputError(request.output_dir + " exists and is not a directory");
  // Not std::filesystem's directory iteration (launch/file_util.h says why).
  const std::vector<std::string> entries = launch::list_directory(request.output_dir);
  if (request.overwrite || entries.empty()) return;
  throw ConvertInputError(fmt::format("{} is not empty (it holds '{}'): --to hf writes into a new or empty directory; "
                                      "pass --overwrite to replace the Hugging Face files in it",
                                      request.output_dir, entries.front()));
}

}  // namespace

HfExportResult export_hf(const HfExportRequest& request) {
  refuse_occupied_output(request);
  const generate::CheckpointLocation location = generate::locate_checkpoint(request.checkpoint);
  const config::Recipe recipe = load_run_recipe(location.run_dir, "the Hugging Face export (layer norm epsilon, tokenizer)");
  const auto [vocab_file, merge_file] = gpt2_tokenizer_files(recipe, location.run_dir);
  const generate::CheckpointInfo info = generate::read_checkpoint_info(location.checkpoints, request.iteration);
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
