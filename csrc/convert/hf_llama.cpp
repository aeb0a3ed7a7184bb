#include "convert/hf_llama.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>
#include <set>
#include <vector>

#include "convert/convert_error.h"

namespace loom::convert {
namespace {

// How a Loom tensor is made of HF tensors.
enum class Kind {
  kSame,       // one tensor, identical
  kVocabRows,  // one tensor, Loom's with padded vocabulary rows
  kQkv,        // q_proj, k_proj, v_proj (weights or Qwen2's biases) regrouped per query group
  kGateUp,     // gate_proj, up_proj interleaved row by row
};

struct Entry {
  std::string loom;
  std::vector<std::string> hf;       // the HF tensors, in the order Kind combines them
  Kind kind;
  std::vector<std::vector<int64_t>> hf_shapes;
};

std::vector<Entry> entries(const Gpt2Shape& s) {
  const int64_t h = s.hidden_size, f = s.ffn(), d = s.head_dim();
  const int64_t a = s.num_attention_heads, g = s.query_groups();
  std::vector<Entry> out = {
      {"embedding.word_embeddings.weight", {"model.embed_tokens.weight"}, Kind::kVocabRows, {{s.vocab_size, h}}},
      {"final_layernorm.weight", {"model.norm.weight"}, Kind::kSame, {{h}}},
  };
  if (!s.share_embeddings_and_output_weights)
    out.push_back({"output_layer.weight", {"lm_head.weight"}, Kind::kVocabRows, {{s.vocab_size, h}}});
  for (int64_t i = 0; i < s.num_layers; ++i) {
    const std::string l = fmt::format("layers.{}.", i), m = fmt::format("model.layers.{}.", i);
    const std::vector<Entry> layer = {
        {l + "input_layernorm.weight", {m + "input_layernorm.weight"}, Kind::kSame, {{h}}},
        {l + "self_attention.linear_qkv.weight",
         {m + "self_attn.q_proj.weight", m + "self_attn.k_proj.weight", m + "self_attn.v_proj.weight"},
         Kind::kQkv,
         {{a * d, h}, {g * d, h}, {g * d, h}}},
        {l + "self_attention.linear_proj.weight", {m + "self_attn.o_proj.weight"}, Kind::kSame, {{h, a * d}}},
        {l + "pre_mlp_layernorm.weight", {m + "post_attention_layernorm.weight"}, Kind::kSame, {{h}}},
        {l + "mlp.linear_fc1.weight", {m + "mlp.gate_proj.weight", m + "mlp.up_proj.weight"}, Kind::kGateUp,
         {{f, h}, {f, h}}},
        {l + "mlp.linear_fc2.weight", {m + "mlp.down_proj.weight"}, Kind::kSame, {{h, f}}},
    };
    out.insert(out.end(), layer.begin(), layer.end());
    if (s.qkv_bias)
      out.push_back({l + "self_attention.linear_qkv.bias",
                     {m + "self_attn.q_proj.bias", m + "self_attn.k_proj.bias", m + "self_attn.v_proj.bias"},
                     Kind::kQkv,
                     {{a * d}, {g * d}, {g * d}}});
  }
  return out;
}

std::vector<int64_t> loom_shape(const Entry& e) {
  std::vector<int64_t> out = e.hf_shapes[0];
  if (e.kind == Kind::kQkv) out[0] += e.hf_shapes[1][0] + e.hf_shapes[2][0];
  if (e.kind == Kind::kGateUp) out[0] *= 2;
  return out;
}

// x with its first dimension of `rows` rows and the rest of x's dimensions (a weight's
// columns, none for a bias).
std::vector<int64_t> with_rows(const at::Tensor& x, int64_t rows) {
  std::vector<int64_t> out = x.sizes().vec();
  out[0] = rows;
  return out;
}

std::string shape_text(at::IntArrayRef s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

double number(const nlohmann::json& c, const char* key, double fallback, const std::string& file) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  if (!c[key].is_number()) throw ConvertInputError(fmt::format("{}: {} must be a number, found {}", file, key, c[key].dump()));
  return c[key].get<double>();
}

int64_t positive(const nlohmann::json& c, const char* key, std::optional<int64_t> fallback, const std::string& file) {
  if (!c.contains(key) || c[key].is_null()) {
    if (!fallback) throw ConvertInputError(fmt::format("{}: no {}", file, key));
    return *fallback;
  }
  if (!c[key].is_number_integer() || c[key].get<int64_t>() < 1)
    throw ConvertInputError(fmt::format("{}: {} must be a positive integer, found {}", file, key, c[key].dump()));
  return c[key].get<int64_t>();
}

bool flag(const nlohmann::json& c, const char* key, bool fallback, const std::string& file) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  if (!c[key].is_boolean()) throw ConvertInputError(fmt::format("{}: {} must be true or false, found {}", file, key, c[key].dump()));
  return c[key].get<bool>();
}

}  // namespace

bool is_llama_config(const nlohmann::json& config) {
  return config.is_object() && config.contains("model_type") &&
         (config["model_type"] == "llama" || config["model_type"] == "mistral" || config["model_type"] == "qwen2");
}

std::map<std::string, at::Tensor> loom_to_llama(const std::map<std::string, at::Tensor>& loom, const Gpt2Shape& s) {
  const int64_t d = s.head_dim(), g = s.query_groups(), per_group = s.num_attention_heads / g, h = s.hidden_size;
  std::map<std::string, at::Tensor> out;
  for (const Entry& e : entries(s)) {
    auto it = loom.find(e.loom);
    if (it == loom.end()) throw ConvertInputError("the checkpoint has no parameter " + e.loom);
    const at::Tensor& x = it->second;
    const std::vector<int64_t> want = loom_shape(e);
    const bool ok = e.kind == Kind::kVocabRows ? x.dim() == 2 && x.size(0) >= want[0] && x.size(1) == want[1]
                                                : x.sizes().vec() == want;
    if (!ok)
      throw ConvertInputError(fmt::format("checkpoint parameter {} has shape {}, expected {}{}", e.loom, shape_text(x.sizes()),
                                          shape_text(want), e.kind == Kind::kVocabRows ? " (or more rows: vocabulary padding)" : ""));
    switch (e.kind) {
      case Kind::kSame: out[e.hf[0]] = x.contiguous(); break;
      case Kind::kVocabRows: out[e.hf[0]] = x.narrow(0, 0, s.vocab_size).contiguous(); break;
      case Kind::kQkv: {  // a weight [rows, h] or a bias [rows]
        const at::Tensor groups = x.reshape({g, (per_group + 2) * d, -1});
        out[e.hf[0]] = groups.narrow(1, 0, per_group * d).reshape(with_rows(x, g * per_group * d)).contiguous();
        out[e.hf[1]] = groups.narrow(1, per_group * d, d).reshape(with_rows(x, g * d)).contiguous();
        out[e.hf[2]] = groups.narrow(1, (per_group + 1) * d, d).reshape(with_rows(x, g * d)).contiguous();
        break;
      }
      case Kind::kGateUp: {
        const at::Tensor rows = x.view({x.size(0) / 2, 2, h});
        out[e.hf[0]] = rows.select(1, 0).contiguous();
        out[e.hf[1]] = rows.select(1, 1).contiguous();
        break;
      }
    }
  }
  return out;
}

std::map<std::string, at::Tensor> llama_to_loom(const std::map<std::string, at::Tensor>& hf, const Gpt2Shape& s,
                                                int64_t padded_vocab, const std::string& file) {
  const int64_t d = s.head_dim(), g = s.query_groups(), per_group = s.num_attention_heads / g, h = s.hidden_size;
  std::map<std::string, at::Tensor> bare;
  std::optional<at::Tensor> tied_head;
  for (const auto& [key, value] : hf) {
    if (key.size() > 20 && key.substr(key.size() - 20) == ".rotary_emb.inv_freq") continue;  // a buffer, not a weight
    if (key == "lm_head.weight" && s.share_embeddings_and_output_weights) {
      tied_head = value;
      continue;
    }
    bare.emplace(key, value);
  }
  std::map<std::string, at::Tensor> out;
  std::set<std::string> used;
  for (const Entry& e : entries(s)) {
    std::vector<at::Tensor> parts;
    for (size_t i = 0; i < e.hf.size(); ++i) {
      auto it = bare.find(e.hf[i]);
      if (it == bare.end())
        throw ConvertInputError(fmt::format("{}: no tensor {} (expected shape {})", file, e.hf[i], shape_text(e.hf_shapes[i])));
      used.insert(e.hf[i]);
      if (it->second.sizes().vec() != e.hf_shapes[i])
        throw ConvertInputError(fmt::format("{}: tensor {} has shape {}, expected {} for the model of config.json", file,
                                            e.hf[i], shape_text(it->second.sizes()), shape_text(e.hf_shapes[i])));
      if (!at::isFloatingType(it->second.scalar_type()))
        throw ConvertInputError(fmt::format("{}: tensor {} is {}, expected a floating-point dtype", file, e.hf[i],
                                            c10::toString(it->second.scalar_type())));
      parts.push_back(it->second);
    }
    at::Tensor x;
    switch (e.kind) {
      case Kind::kSame: x = parts[0]; break;
      case Kind::kVocabRows:
        x = parts[0];
        if (e.loom == "embedding.word_embeddings.weight" && tied_head &&
            !(tied_head->sizes() == x.sizes() && at::equal(*tied_head, x)))
          throw ConvertInputError(fmt::format("{}: lm_head.weight differs from model.embed_tokens.weight although "
                                              "tie_word_embeddings is true", file));
        if (padded_vocab > s.vocab_size) x = at::cat({x, at::zeros({padded_vocab - s.vocab_size, h}, x.options())});
        break;
      case Kind::kQkv:  // weights [rows, h] or biases [rows]
        x = at::cat({parts[0].reshape({g, per_group * d, -1}), parts[1].reshape({g, d, -1}), parts[2].reshape({g, d, -1})}, 1)
                .reshape(with_rows(parts[0], -1));
        break;
      case Kind::kGateUp: x = at::stack({parts[0], parts[1]}, 1).reshape({-1, h}); break;
    }
    out[e.loom] = x.contiguous();
  }
  for (const auto& [name, value] : bare)
    if (!used.count(name))
      throw ConvertInputError(fmt::format("{}: tensor {} is not part of a Llama model of {} layers as config.json describes "
                                          "it (biases and other extras are not supported)", file, name, s.num_layers));
  return out;
}

nlohmann::json llama_config_json(const Gpt2Shape& s, const HfConfigExtras& x, int64_t bos_id, int64_t eos_id) {
  nlohmann::json c = {{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"vocab_size", s.vocab_size},
                      {"hidden_size", s.hidden_size},
                      {"intermediate_size", s.ffn()},
                      {"num_hidden_layers", s.num_layers},
                      {"num_attention_heads", s.num_attention_heads},
                      {"num_key_value_heads", s.query_groups()},
                      {"head_dim", s.head_dim()},
                      {"hidden_act", "silu"},
                      {"max_position_embeddings", s.max_position_embeddings},
                      {"rms_norm_eps", s.layernorm_epsilon},
                      {"rope_parameters", {{"rope_theta", s.rotary_base}, {"rope_type", "default"}}},
                      {"rope_theta", s.rotary_base},
                      {"attention_bias", false},
                      {"mlp_bias", false},
                      {"attention_dropout", x.attention_dropout},
                      {"initializer_range", x.init_method_std},
                      {"pretraining_tp", 1},
                      {"tie_word_embeddings", s.share_embeddings_and_output_weights},
                      {"use_cache", true},
                      {"bos_token_id", bos_id},
                      {"eos_token_id", eos_id},
                      {"dtype", x.dtype}};
  if (s.rope_scaling.enabled) {
    const RopeScaling& r = s.rope_scaling;
    const nlohmann::json llama3 = {{"rope_type", "llama3"},         {"factor", r.factor},
                                   {"low_freq_factor", r.low_freq_factor}, {"high_freq_factor", r.high_freq_factor},
                                   {"original_max_position_embeddings", r.old_context_len}};
    c["rope_scaling"] = llama3;  // transformers 4 (and 5, which reads it first)
    c["rope_parameters"] = llama3;
    c["rope_parameters"]["rope_theta"] = s.rotary_base;
  }
  if (!s.qkv_bias) return c;
  // Qwen2: the same model with Q/K/V biases; sliding-window attention off (all layers full).
  for (const char* llama_only : {"attention_bias", "mlp_bias", "pretraining_tp"}) c.erase(llama_only);
  c["architectures"] = {"Qwen2ForCausalLM"};
  c["model_type"] = "qwen2";
  c["use_sliding_window"] = false;
  c["sliding_window"] = nullptr;
  c["max_window_layers"] = s.num_layers;
  return c;
}

Gpt2Shape llama_shape_from_config(const nlohmann::json& c, const std::string& file) {
  if (!is_llama_config(c)) throw ConvertInputError(file + ": model_type is not \"llama\", \"mistral\" or \"qwen2\"");
  const bool qwen2 = c["model_type"] == "qwen2";
  if (qwen2 && flag(c, "use_sliding_window", false, file))
    throw ConvertInputError(file + ": use_sliding_window is true; Loom's attention is full causal attention (sliding-window "
                                   "attention is not implemented)");
  if (qwen2 && c.contains("layer_types") && c["layer_types"].is_array())
    for (const auto& type : c["layer_types"])
      if (type != "full_attention")
        throw ConvertInputError(fmt::format("{}: layer_types holds {}; Loom's attention is full causal attention in every "
                                            "layer", file, type.dump()));
  const std::string act = c.contains("hidden_act") && c["hidden_act"].is_string() ? c["hidden_act"].get<std::string>() : "silu";
  if (act != "silu")
    throw ConvertInputError(fmt::format("{}: hidden_act \"{}\" cannot be represented: Loom's gated MLP is SwiGLU (silu)", file, act));
  if (flag(c, "attention_bias", false, file))
    throw ConvertInputError(file + ": attention_bias is true; Loom's Llama has no linear biases (model.bias false)");
  if (flag(c, "mlp_bias", false, file))
    throw ConvertInputError(file + ": mlp_bias is true; Loom's Llama has no linear biases (model.bias false)");
  if (c.contains("pretraining_tp") && !c["pretraining_tp"].is_null() && c["pretraining_tp"] != 1)
    throw ConvertInputError(fmt::format("{}: pretraining_tp must be 1, found {}", file, c["pretraining_tp"].dump()));
  // RoPE: transformers 5 writes rope_parameters, older versions rope_theta and rope_scaling
  // (which transformers 5 still reads, over rope_parameters: so here too).
  double theta = number(c, "rope_theta", 10000.0, file);
  RopeScaling scaling;
  auto read_rope = [&](const nlohmann::json& p, const char* field) {
    if (p.is_null()) return;
    if (!p.is_object()) throw ConvertInputError(fmt::format("{}: {} must be an object, found {}", file, field, p.dump()));
    const std::string type = p.contains("rope_type") && p["rope_type"].is_string() ? p["rope_type"].get<std::string>()
                             : p.contains("type") && p["type"].is_string()    ? p["type"].get<std::string>()
                                                                               : "default";
    if (type != "default" && type != "llama3")
      throw ConvertInputError(fmt::format("{}: {}.rope_type \"{}\" is not supported: Loom implements plain RoPE and "
                                          "Llama 3.1's scaling (rope_type llama3)", file, field, type));
    if (p.contains("rope_theta")) theta = number(p, "rope_theta", theta, file);
    scaling = RopeScaling{};
    if (type != "llama3") return;
    auto required = [&](const char* key) {
      if (!p.contains(key) || !p[key].is_number())
        throw ConvertInputError(fmt::format("{}: {}.{} must be a number for rope_type llama3, found {}", file, field, key,
                                            p.contains(key) ? p[key].dump() : "none"));
      return p[key].get<double>();
    };
    scaling = {true, required("factor"), required("low_freq_factor"), required("high_freq_factor"),
               static_cast<int64_t>(required("original_max_position_embeddings"))};
  };
  if (c.contains("rope_parameters")) read_rope(c["rope_parameters"], "rope_parameters");
  if (c.contains("rope_scaling")) read_rope(c["rope_scaling"], "rope_scaling");
  Gpt2Shape s;
  s.normalization = Normalization::kRmsNorm;
  s.position_embedding_type = PositionEmbedding::kRope;
  s.activation = Activation::kSwiglu;
  s.bias = false;
  s.qkv_bias = qwen2;  // Qwen2's Q, K and V projections always have biases
  s.rotary_base = theta;
  s.rope_scaling = scaling;
  s.num_layers = positive(c, "num_hidden_layers", std::nullopt, file);
  s.hidden_size = positive(c, "hidden_size", std::nullopt, file);
  s.num_attention_heads = positive(c, "num_attention_heads", std::nullopt, file);
  s.num_query_groups = positive(c, "num_key_value_heads", s.num_attention_heads, file);
  s.ffn_hidden_size = positive(c, "intermediate_size", std::nullopt, file);
  s.vocab_size = positive(c, "vocab_size", std::nullopt, file);
  s.max_position_embeddings = positive(c, "max_position_embeddings", 2048, file);
  s.seq_length = s.max_position_embeddings;
  s.layernorm_epsilon = number(c, "rms_norm_eps", 1e-6, file);
  s.share_embeddings_and_output_weights = flag(c, "tie_word_embeddings", false, file);
  // head_dim (Megatron's kv_channels): recorded when it is not hidden_size / num_attention_heads.
  const bool head_dim_given = c.contains("head_dim") && !c["head_dim"].is_null();
  if (!head_dim_given && s.hidden_size % s.num_attention_heads != 0)
    throw ConvertInputError(fmt::format("{}: hidden_size {} is not divisible by num_attention_heads {} (and no head_dim)",
                                        file, s.hidden_size, s.num_attention_heads));
  const int64_t head_dim = positive(c, "head_dim", s.hidden_size / s.num_attention_heads, file);
  if (head_dim * s.num_attention_heads != s.hidden_size) s.kv_channels = head_dim;
  if (s.num_attention_heads % s.num_query_groups != 0)
    throw ConvertInputError(fmt::format("{}: num_key_value_heads {} does not divide num_attention_heads {}", file,
                                        s.num_query_groups, s.num_attention_heads));
  // Mistral: Llama's model with a sliding attention window; one at least the context (or none,
  // as Mistral 7B v0.2+ and Mistral-NeMo write) is full causal attention.
  // transformers' MistralConfig defaults the window to 4096 when the key is missing.
  if (c["model_type"] == "mistral" && !(c.contains("sliding_window") && c["sliding_window"].is_null())) {
    const nlohmann::json given = c.contains("sliding_window") ? c["sliding_window"] : nlohmann::json(4096);
    if (!given.is_number_integer())
      throw ConvertInputError(fmt::format("{}: sliding_window must be an integer or null, found {}", file, given.dump()));
    const int64_t window = given.get<int64_t>();
    if (window < s.max_position_embeddings)
      throw ConvertInputError(fmt::format("{}: sliding_window {} is shorter than max_position_embeddings {}: Loom's attention "
                                          "is full causal attention (sliding-window attention is not implemented)",
                                          file, window, s.max_position_embeddings));
  }
  if (s.head_dim() % 2 != 0) throw ConvertInputError(fmt::format("{}: RoPE needs an even head dimension, found {}", file, s.head_dim()));
  if (!(s.layernorm_epsilon > 0)) throw ConvertInputError(file + ": rms_norm_eps must be > 0");
  if (!(s.rotary_base > 0)) throw ConvertInputError(file + ": rope_theta must be > 0");
  const RopeScaling& r = s.rope_scaling;
  if (r.enabled && !(r.factor > 0 && r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor && r.old_context_len >= 1))
    throw ConvertInputError(fmt::format("{}: rope scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
                                        "original_max_position_embeddings >= 1, found {}, {}, {}, {}", file, r.factor,
                                        r.low_freq_factor, r.high_freq_factor, r.old_context_len));
  return s;
}

void check_llama_config_against_tensors(const Gpt2Shape& s, const std::map<std::string, at::Tensor>& hf,
                                        const std::string& config_file, const std::string& weights_file) {
  auto expect_dim = [&](const char* field, int64_t value, const std::string& tensor, int64_t dim) {
    auto it = hf.find(tensor);
    if (it == hf.end())
      throw ConvertInputError(fmt::format("{}: no tensor {}, which gives the size of {} ({} in {})", weights_file, tensor,
                                          field, value, config_file));
    if (it->second.dim() <= dim) return;  // llama_to_loom names a misshapen tensor
    if (it->second.size(dim) != value)
      throw ConvertInputError(fmt::format("{}: {} is {}, but {} in {} has size {} in dimension {}", config_file, field, value,
                                          tensor, weights_file, it->second.size(dim), dim));
  };
  expect_dim("vocab_size", s.vocab_size, "model.embed_tokens.weight", 0);
  expect_dim("hidden_size", s.hidden_size, "model.embed_tokens.weight", 1);
  expect_dim("intermediate_size", s.ffn(), "model.layers.0.mlp.gate_proj.weight", 0);
  std::set<int64_t> layers;
  const std::string prefix = "model.layers.";
  for (const auto& [key, value] : hf) {
    if (key.rfind(prefix, 0) != 0) continue;
    const size_t dot = key.find('.', prefix.size());
    const std::string index = key.substr(prefix.size(), dot == std::string::npos ? std::string::npos : dot - prefix.size());
    if (!index.empty() && index.size() <= 9 && index.find_first_not_of("0123456789") == std::string::npos)
      layers.insert(std::stoll(index));
  }
  if (static_cast<int64_t>(layers.size()) != s.num_layers)
    throw ConvertInputError(fmt::format("{}: num_hidden_layers is {}, but {} holds the tensors of {} layer(s)", config_file,
                                        s.num_layers, weights_file, layers.size()));
}

}  // namespace loom::convert
