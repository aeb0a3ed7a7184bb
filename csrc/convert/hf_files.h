// The files of a Hugging Face model directory as `loom convert` writes and reads them:
// config.json, the weights (model.safetensors; model.safetensors.index.json with its shards;
// pytorch_model.bin, a torch.save zip of the state dict), and the GPT-2 tokenizer files.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>

namespace loom::convert {

inline constexpr const char* kHfConfigFile = "config.json";
inline constexpr const char* kHfWeightsFile = "model.safetensors";
inline constexpr const char* kHfWeightsIndexFile = "model.safetensors.index.json";
inline constexpr const char* kHfPickleFile = "pytorch_model.bin";
/// A tokenizer's chat template as transformers saves it, and where a Loom run keeps it
/// (RUN/tokenizer/chat_template.jinja, read by `loom serve`).
inline constexpr const char* kHfChatTemplateFile = "chat_template.jinja";
inline constexpr const char* kHfTokenizerConfigFile = "tokenizer_config.json";

/// "float32", "bfloat16", "float16" (config.json's dtype). Throws ConvertInputError otherwise.
std::string hf_dtype_name(c10::ScalarType type);

/// Writes <dir>/config.json.
void write_hf_config(const std::string& dir, const nlohmann::json& config);

/// Copies the GPT-2 tokenizer into <dir> as vocab.json and merges.txt, with the
/// tokenizer_config.json and special_tokens_map.json of GPT2Tokenizer (<|endoftext|> as bos,
/// eos and unk; model_max_length = `max_length`).
void write_hf_tokenizer(const std::string& dir, const std::string& vocab_file, const std::string& merge_file,
                        int64_t max_length);

/// <dir>/config.json parsed. Throws ConvertInputError naming the file when missing or not JSON.
nlohmann::json read_hf_config(const std::string& dir);

/// The chat template of the tokenizer in <dir>: chat_template.jinja, else tokenizer_config.json's
/// `chat_template` (a text, or a list of {"name", "template"} of which "default" is taken, as
/// transformers takes it); "" when there is none. Throws ConvertInputError naming the file and
/// field when tokenizer_config.json is not JSON or the field has another shape.
std::string read_hf_chat_template(const std::string& dir);

/// The state dict of <dir>: model.safetensors, else the shards listed by
/// model.safetensors.index.json, else pytorch_model.bin. `source` is set to the file read (for
/// messages). Throws ConvertInputError naming the file when none exists or one is malformed.
std::map<std::string, at::Tensor> read_hf_weights(const std::string& dir, std::string& source);

}  // namespace loom::convert
