#include "convert/hf_gpt2.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <optional>
#include <set>
#include <vector>

#include "convert/convert_error.h"

namespace loom::convert {
namespace {

// How a tensor's layout differs between the two sides.
enum class TensorLayout {
  kSame,        // identical
  kTransposed,  // Linear [out, in] vs Conv1D [in, out]
  kQkvWeight,   // per-head [q|k|v] rows vs [q|k|v] blocks, and transposed
  kQkvBias,     // per-head [q|k|v] vs [q|k|v] blocks
  kVocabRows,   // padded vs exact vocabulary rows
};

struct Entry {
  std::string loom, hf;
  TensorLayout layout;
  std::vector<int64_t> loom_shape;  // global, with the exact vocabulary
};

// Every parameter of the model, in one table used in both directions.
std::vector<Entry> entries(const Gpt2Shape& s) {
  const int64_t h = s.hidden_size, f = s.ffn_hidden_size;
  std::vector<Entry> out = {
      {"embedding.word_embeddings.weight", "wte.weight", TensorLayout::kVocabRows, {s.vocab_size, h}},
      {"embedding.position_embeddings.weight", "wpe.weight", TensorLayout::kSame, {s.max_position_embeddings, h}},
      {"final_layernorm.weight", "ln_f.weight", TensorLayout::kSame, {h}},
      {"final_layernorm.bias", "ln_f.bias", TensorLayout::kSame, {h}},
  };
  for (int64_t i = 0; i < s.num_layers; ++i) {
    const std::string l = fmt::format("layers.{}.", i), g = fmt::format("h.{}.", i);
    const std::vector<Entry> layer = {
        {l + "input_layernorm.weight", g + "ln_1.weight", TensorLayout::kSame, {h}},
        {l + "input_layernorm.bias", g + "ln_1.bias", TensorLayout::kSame, {h}},
        {l + "self_attention.linear_qkv.weight", g + "attn.c_attn.weight", TensorLayout::kQkvWeight, {3 * h, h}},
        {l + "self_attention.linear_qkv.bias", g + "attn.c_attn.bias", TensorLayout::kQkvBias, {3 * h}},
        {l + "self_attention.linear_proj.weight", g + "attn.c_proj.weight", TensorLayout::kTransposed, {h, h}},
        {l + "self_attention.linear_proj.bias", g + "attn.c_proj.bias", TensorLayout::kSame, {h}},
        {l + "pre_mlp_layernorm.weight", g + "ln_2.weight", TensorLayout::kSame, {h}},
        {l + "pre_mlp_layernorm.bias", g + "ln_2.bias", TensorLayout::kSame, {h}},
        {l + "mlp.linear_fc1.weight", g + "mlp.c_fc.weight", TensorLayout::kTransposed, {f, h}},
        {l + "mlp.linear_fc1.bias", g + "mlp.c_fc.bias", TensorLayout::kSame, {f}},
        {l + "mlp.linear_fc2.weight", g + "mlp.c_proj.weight", TensorLayout::kTransposed, {h, f}},
        {l + "mlp.linear_fc2.bias", g + "mlp.c_proj.bias", TensorLayout::kSame, {h}},
    };
    out.insert(out.end(), layer.begin(), layer.end());
  }
  return out;
}

std::vector<int64_t> hf_shape(const Entry& e) {
  if (e.layout == TensorLayout::kTransposed || e.layout == TensorLayout::kQkvWeight) return {e.loom_shape[1], e.loom_shape[0]};
  return e.loom_shape;
}

std::string shape_text(at::IntArrayRef s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// Loom's QKV rows (head, which, j) ↔ HF's (which, head, j): a swap of the first two of
// [a, 3, d, ...] / [3, a, d, ...].
at::Tensor swap_qkv_groups(const at::Tensor& x, int64_t first, int64_t second, int64_t d) {
  std::vector<int64_t> view = {first, second, d};
  for (int64_t i = 1; i < x.dim(); ++i) view.push_back(x.size(i));
  std::vector<int64_t> perm = {1, 0};
  for (int64_t i = 2; i < static_cast<int64_t>(view.size()); ++i) perm.push_back(i);
  return x.reshape(view).permute(perm).reshape(x.sizes());
}

double number(const nlohmann::json& config, const char* key, double fallback, const std::string& file) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  if (!config[key].is_number()) throw ConvertInputError(fmt::format("{}: {} must be a number, found {}", file, key, config[key].dump()));
  return config[key].get<double>();
}

int64_t positive(const nlohmann::json& config, const char* key, int64_t fallback, const std::string& file) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  if (!config[key].is_number_integer() || config[key].get<int64_t>() < 1)
    throw ConvertInputError(fmt::format("{}: {} must be a positive integer, found {}", file, key, config[key].dump()));
  return config[key].get<int64_t>();
}

bool flag(const nlohmann::json& config, const char* key, bool fallback, const std::string& file) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  if (!config[key].is_boolean()) throw ConvertInputError(fmt::format("{}: {} must be true or false, found {}", file, key, config[key].dump()));
  return config[key].get<bool>();
}

// A state-dict key without the GPT2LMHeadModel prefix (a GPT2Model's state dict has none).
std::string without_model_prefix(const std::string& key) {
  return key.rfind("transformer.", 0) == 0 ? key.substr(12) : key;
}

}  // namespace

std::map<std::string, at::Tensor> loom_to_hf(const std::map<std::string, at::Tensor>& loom, const Gpt2Shape& shape) {
  const int64_t a = shape.num_attention_heads, d = shape.hidden_size / a;
  std::map<std::string, at::Tensor> out;
  for (const Entry& e : entries(shape)) {
    auto it = loom.find(e.loom);
    if (it == loom.end()) throw ConvertInputError("the checkpoint has no parameter " + e.loom);
    at::Tensor x = it->second;
    const bool rows_ok = e.layout == TensorLayout::kVocabRows ? x.dim() == 2 && x.size(0) >= e.loom_shape[0] &&
                                                             x.size(1) == e.loom_shape[1]
                                                       : x.sizes().vec() == e.loom_shape;
    if (!rows_ok)
      throw ConvertInputError(fmt::format("checkpoint parameter {} has shape {}, expected {}{}", e.loom,
                                          shape_text(x.sizes()), shape_text(e.loom_shape),
                                          e.layout == TensorLayout::kVocabRows ? " (or more rows: vocabulary padding)" : ""));
    switch (e.layout) {
      case TensorLayout::kSame: break;
      case TensorLayout::kTransposed: x = x.t(); break;
      case TensorLayout::kQkvWeight: x = swap_qkv_groups(x, a, 3, d).t(); break;
      case TensorLayout::kQkvBias: x = swap_qkv_groups(x, a, 3, d); break;
      case TensorLayout::kVocabRows: x = x.narrow(0, 0, shape.vocab_size); break;
    }
    out["transformer." + e.hf] = x.contiguous();
  }
  return out;
}

std::map<std::string, at::Tensor> hf_to_loom(const std::map<std::string, at::Tensor>& hf, const Gpt2Shape& shape,
                                             int64_t padded_vocab, const std::string& file) {
  const int64_t a = shape.num_attention_heads, d = shape.hidden_size / a;
  // Keys without the GPT2LMHeadModel prefix (a GPT2Model's state dict has none).
  std::map<std::string, at::Tensor> bare;
  std::optional<at::Tensor> lm_head;
  for (const auto& [key, value] : hf) {
    if (key == "lm_head.weight") {
      lm_head = value;
      continue;
    }
    const std::string name = without_model_prefix(key);
    const bool mask_buffer = name.size() > 10 && (name.substr(name.size() - 10) == ".attn.bias" ||
                                                  (name.size() > 17 && name.substr(name.size() - 17) == ".attn.masked_bias"));
    if (mask_buffer) continue;  // the causal mask, a buffer older transformers saved
    if (!bare.emplace(name, value).second) throw ConvertInputError(fmt::format("{}: tensor {} appears twice", file, key));
  }
  std::map<std::string, at::Tensor> out;
  std::set<std::string> used;
  for (const Entry& e : entries(shape)) {
    auto it = bare.find(e.hf);
    if (it == bare.end())
      throw ConvertInputError(fmt::format("{}: no tensor transformer.{} (expected shape {})", file, e.hf, shape_text(hf_shape(e))));
    used.insert(e.hf);
    at::Tensor x = it->second;
    if (x.sizes().vec() != hf_shape(e))
      throw ConvertInputError(fmt::format("{}: tensor transformer.{} has shape {}, expected {} for the model of config.json",
                                          file, e.hf, shape_text(x.sizes()), shape_text(hf_shape(e))));
    if (!at::isFloatingType(x.scalar_type()))
      throw ConvertInputError(fmt::format("{}: tensor transformer.{} is {}, expected a floating-point dtype", file, e.hf,
                                          c10::toString(x.scalar_type())));
    switch (e.layout) {
      case TensorLayout::kSame: break;
      case TensorLayout::kTransposed: x = x.t(); break;
      case TensorLayout::kQkvWeight: x = swap_qkv_groups(x.t(), 3, a, d); break;
      case TensorLayout::kQkvBias: x = swap_qkv_groups(x, 3, a, d); break;
      case TensorLayout::kVocabRows:
        if (lm_head && !(lm_head->sizes() == x.sizes() && at::equal(*lm_head, x)))
          throw ConvertInputError(fmt::format("{}: lm_head.weight differs from transformer.wte.weight: Loom's GPT ties the "
                                              "output layer to the word embedding (tie_word_embeddings must be true)", file));
        if (padded_vocab > shape.vocab_size)
          x = at::cat({x, at::zeros({padded_vocab - shape.vocab_size, x.size(1)}, x.options())});
        break;
    }
    out[e.loom] = x.contiguous();
  }
  for (const auto& [name, value] : bare)
    if (!used.count(name))
      throw ConvertInputError(fmt::format("{}: tensor {} is not part of a GPT-2 model of {} layers", file, name, shape.num_layers));
  return out;
}

nlohmann::json hf_config_json(const Gpt2Shape& s, const HfConfigExtras& x) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", s.vocab_size},
          {"n_positions", s.max_position_embeddings},
          {"n_embd", s.hidden_size},
          {"n_layer", s.num_layers},
          {"n_head", s.num_attention_heads},
          {"n_inner", s.ffn_hidden_size},
          {"activation_function", "gelu_new"},
          {"resid_pdrop", x.hidden_dropout},
          {"embd_pdrop", x.hidden_dropout},
          {"attn_pdrop", x.attention_dropout},
          {"layer_norm_epsilon", s.layernorm_epsilon},
          {"initializer_range", x.init_method_std},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"add_cross_attention", false},
          {"tie_word_embeddings", true},
          {"use_cache", true},
          {"bos_token_id", x.eod_id},
          {"eos_token_id", x.eod_id},
          {"dtype", x.dtype}};
}

void check_config_against_tensors(const Gpt2Shape& s, const std::map<std::string, at::Tensor>& hf,
                                  const std::string& config_file, const std::string& weights_file) {
  auto find = [&](const std::string& bare) -> const at::Tensor* {
    for (const std::string& key : {"transformer." + bare, bare}) {
      auto it = hf.find(key);
      if (it != hf.end()) return &it->second;
    }
    return nullptr;
  };
  auto expect_dim = [&](const char* field, int64_t value, const std::string& tensor, int64_t dim) {
    const at::Tensor* t = find(tensor);
    if (!t)
      throw ConvertInputError(fmt::format("{}: no tensor transformer.{}, which gives the size of {} ({} in {})",
                                          weights_file, tensor, field, value, config_file));
    if (t->dim() <= dim) return;  // hf_to_loom names a misshapen tensor
    if (t->size(dim) != value)
      throw ConvertInputError(fmt::format("{}: {} is {}, but transformer.{} in {} has size {} in dimension {}", config_file,
                                          field, value, tensor, weights_file, t->size(dim), dim));
  };
  expect_dim("vocab_size", s.vocab_size, "wte.weight", 0);
  expect_dim("n_embd", s.hidden_size, "wte.weight", 1);
  expect_dim("n_positions", s.max_position_embeddings, "wpe.weight", 0);
  expect_dim("n_inner", s.ffn_hidden_size, "h.0.mlp.c_fc.weight", 1);
  // The layer indices present: "h.<i>." with or without the "transformer." prefix.
  std::set<int64_t> layers;
  for (const auto& [key, value] : hf) {
    const std::string name = without_model_prefix(key);
    if (name.rfind("h.", 0) != 0) continue;
    const size_t dot = name.find('.', 2);
    const std::string index = name.substr(2, dot == std::string::npos ? std::string::npos : dot - 2);
    if (!index.empty() && index.size() <= 9 && index.find_first_not_of("0123456789") == std::string::npos)
      layers.insert(std::stoll(index));
  }
  if (static_cast<int64_t>(layers.size()) != s.num_layers)
    throw ConvertInputError(fmt::format("{}: n_layer is {}, but {} holds the tensors of {} layer(s)", config_file,
                                        s.num_layers, weights_file, layers.size()));
}

Gpt2Shape gpt2_shape_from_config(const nlohmann::json& c, const std::string& file) {
  if (!c.is_object()) throw ConvertInputError(file + ": not a JSON object");
  // Missing fields take GPT2Config's defaults, as transformers does.
  const std::string model_type = c.value("model_type", std::string("gpt2"));
  if (model_type != "gpt2")
    throw ConvertInputError(fmt::format("{}: model_type is \"{}\"; loom convert reads GPT-2 models (model_type \"gpt2\")", file, model_type));
  const std::string act = c.contains("activation_function") && c["activation_function"].is_string()
                              ? c["activation_function"].get<std::string>()
                              : std::string("gelu_new");
  // Loom's GeLU is the tanh approximation; HF computes it as gelu_new, gelu_pytorch_tanh or the
  // python variant of the latter, which agree to float32 rounding.
  if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_python_tanh")
    throw ConvertInputError(fmt::format("{}: activation_function \"{}\" cannot be represented: Loom's MLP uses the tanh GeLU "
                                        "(gelu_new, gelu_pytorch_tanh)", file, act));
  if (!flag(c, "tie_word_embeddings", true, file))
    throw ConvertInputError(file + ": tie_word_embeddings is false; Loom's GPT ties the output layer to the word embedding");
  if (!flag(c, "scale_attn_weights", true, file))
    throw ConvertInputError(file + ": scale_attn_weights is false; Loom scales attention scores by 1/sqrt(head_dim)");
  if (flag(c, "scale_attn_by_inverse_layer_idx", false, file))
    throw ConvertInputError(file + ": scale_attn_by_inverse_layer_idx is true; Loom's attention has no per-layer scaling");
  if (flag(c, "add_cross_attention", false, file))
    throw ConvertInputError(file + ": add_cross_attention is true; Loom's GPT is decoder-only without cross-attention");
  Gpt2Shape s;
  s.num_layers = positive(c, "n_layer", 12, file);
  s.hidden_size = positive(c, "n_embd", 768, file);
  s.num_attention_heads = positive(c, "n_head", 12, file);
  s.ffn_hidden_size = positive(c, "n_inner", 4 * s.hidden_size, file);
  s.vocab_size = positive(c, "vocab_size", 50257, file);
  s.max_position_embeddings = positive(c, "n_positions", 1024, file);
  s.layernorm_epsilon = number(c, "layer_norm_epsilon", 1e-5, file);
  if (s.hidden_size % s.num_attention_heads != 0)
    throw ConvertInputError(fmt::format("{}: n_embd {} is not divisible by n_head {}", file, s.hidden_size, s.num_attention_heads));
  if (!(s.layernorm_epsilon > 0)) throw ConvertInputError(file + ": layer_norm_epsilon must be > 0");
  return s;
}

}  // namespace loom::convert
