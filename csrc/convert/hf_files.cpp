#include "convert/hf_files.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "convert/convert_error.h"
#include "tensor_io/safetensors_file.h"
#include "train/checkpoint_files.h"

namespace fs = std::filesystem;

namespace loom::convert {
namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConvertInputError(path.string() + ": cannot open the file");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

nlohmann::json read_json(const fs::path& path) {
  const std::string text = read_text(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ConvertInputError(path.string() + ": not valid JSON: " + e.what());
  }
}

std::map<std::string, at::Tensor> read_safetensors_tensors(const fs::path& path) {
  try {
    return tensor_io::read_safetensors(path.string()).tensors;
  } catch (const std::invalid_argument& e) {
    throw ConvertInputError(e.what());
  }
}

// pytorch_model.bin: torch.save's zip of a pickled {name: tensor} (an OrderedDict).
std::map<std::string, at::Tensor> read_pickle_state_dict(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConvertInputError(path.string() + ": cannot open the file");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue top;
  try {
    top = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    throw ConvertInputError(path.string() + ": not a torch.save file of a state dict: " + e.what());
  }
  if (!top.isGenericDict()) throw ConvertInputError(path.string() + ": not a state dict (a dictionary of tensors)");
  std::map<std::string, at::Tensor> out;
  for (const auto& e : top.toGenericDict()) {
    if (!e.key().isString()) throw ConvertInputError(path.string() + ": a state dict key is not a string");
    if (!e.value().isTensor())
      throw ConvertInputError(path.string() + ": entry " + e.key().toStringRef() + " is not a tensor");
    out[e.key().toStringRef()] = e.value().toTensor();
  }
  return out;
}

}  // namespace

std::string hf_dtype_name(c10::ScalarType type) {
  switch (type) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: throw ConvertInputError(std::string("parameters of dtype ") + c10::toString(type) + " have no Hugging Face dtype name");
  }
}

void write_hf_config(const std::string& dir, const nlohmann::json& config) {
  train::write_text_atomically((fs::path(dir) / kHfConfigFile).string(), config.dump(2) + "\n");
}

void write_hf_tokenizer(const std::string& dir, const std::string& vocab_file, const std::string& merge_file,
                        int64_t max_length) {
  train::write_text_atomically((fs::path(dir) / "vocab.json").string(), read_text(vocab_file));
  train::write_text_atomically((fs::path(dir) / "merges.txt").string(), read_text(merge_file));
  const std::string eot = "<|endoftext|>";
  const nlohmann::json special = {{"bos_token", eot}, {"eos_token", eot}, {"unk_token", eot}};
  nlohmann::json config = special;
  config["tokenizer_class"] = "GPT2Tokenizer";
  config["model_max_length"] = max_length;
  config["add_prefix_space"] = false;
  config["add_bos_token"] = false;
  train::write_text_atomically((fs::path(dir) / "tokenizer_config.json").string(), config.dump(2) + "\n");
  train::write_text_atomically((fs::path(dir) / "special_tokens_map.json").string(), special.dump(2) + "\n");
}

std::string read_hf_chat_template(const std::string& dir) {
  const fs::path file = fs::path(dir) / kHfChatTemplateFile;
  if (fs::is_regular_file(file)) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const fs::path config_file = fs::path(dir) / kHfTokenizerConfigFile;
  if (!fs::is_regular_file(config_file)) return "";
  const nlohmann::json config = read_json(config_file);
  if (!config.is_object() || !config.contains("chat_template") || config["chat_template"].is_null()) return "";
  const nlohmann::json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array())
    for (const auto& named : t)
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string())
        return named["template"].get<std::string>();
  throw ConvertInputError(config_file.string() +
                          ": chat_template: expected a text or a list of {\"name\", \"template\"} holding one "
                          "named \"default\"");
}

nlohmann::json read_hf_config(const std::string& dir) {
  const fs::path path = fs::path(dir) / kHfConfigFile;
  if (!fs::is_regular_file(path))
    throw ConvertInputError(path.string() + " does not exist: expected a Hugging Face model directory (save_pretrained)");
  return read_json(path);
}

std::map<std::string, at::Tensor> read_hf_weights(const std::string& dir, std::string& source) {
  const fs::path d(dir);
  if (fs::is_regular_file(d / kHfWeightsFile)) {
    source = (d / kHfWeightsFile).string();
    return read_safetensors_tensors(d / kHfWeightsFile);
  }
  if (fs::is_regular_file(d / kHfWeightsIndexFile)) {
    source = (d / kHfWeightsIndexFile).string();
    const nlohmann::json index = read_json(d / kHfWeightsIndexFile);
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      throw ConvertInputError(source + ": no \"weight_map\" object");
    std::set<std::string> files;
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        throw ConvertInputError(source + ": weight_map entry " + name + " is not a plain file name");
      files.insert(file.get<std::string>());
    }
    std::map<std::string, at::Tensor> out;
    for (const auto& file : files) {
      for (auto& [name, t] : read_safetensors_tensors(d / file)) {
        if (!out.emplace(name, t).second)
          throw ConvertInputError(fmt::format("{}: tensor {} appears in two shards", source, name));
      }
    }
    return out;
  }
  if (fs::is_regular_file(d / kHfPickleFile)) {
    source = (d / kHfPickleFile).string();
    return read_pickle_state_dict(d / kHfPickleFile);
  }
  throw ConvertInputError(fmt::format("{} holds no weights: expected {}, {} or {}", dir, kHfWeightsFile,
                                      kHfWeightsIndexFile, kHfPickleFile));
}

}  // namespace loom::convert
