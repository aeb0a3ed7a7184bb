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

/// The state dict of <dir>: model.safetensors, else the shards listed by
/// model.safetensors.index.json, else pytorch_model.bin. `source` is set to the file read (for
/// messages). Throws ConvertInputError naming the file when none exists or one is malformed.
std::map<std::string, at::Tensor> read_hf_weights(const std::string& dir, std::string& source);

}  // namespace loom::convert
