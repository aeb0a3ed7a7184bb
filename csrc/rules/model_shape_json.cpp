#include "rules/model_shape_json.h"

#include <nlohmann/json.hpp>

#include <initializer_list>
#include <stdexcept>

namespace loom {

nlohmann::json model_shape_to_json(const ModelShape& shape) {
  nlohmann::json out = {{"num_layers", shape.num_layers},
                        {"hidden_size", shape.hidden_size},
                        {"ffn_hidden_size", shape.ffn()},
                        {"num_attention_heads", shape.num_attention_heads},
                        {"vocab_size", shape.vocab_size},
                        {"max_position_embeddings", shape.max_position_embeddings}};
  if (shape.is_gpt()) return out;  // a GPT checkpoint's metadata stays what it always was
  out["normalization"] = recipe_name(shape.normalization);
  out["position_embedding_type"] = recipe_name(shape.position_embedding_type);
  out["rotary_base"] = shape.rotary_base;
  out["rotary_percentage"] = shape.rotary_percentage;
  out["activation"] = recipe_name(shape.activation);
  out["num_query_groups"] = shape.query_groups();
  out["bias"] = shape.bias;
  out["qkv_bias"] = shape.qkv_bias;
  if (shape.kv_channels > 0) out["kv_channels"] = shape.kv_channels;
  if (shape.rope_scaling.enabled)
    out["rope_scaling"] = {{"factor", shape.rope_scaling.factor},
                           {"low_freq_factor", shape.rope_scaling.low_freq_factor},
                           {"high_freq_factor", shape.rope_scaling.high_freq_factor},
                           {"old_context_len", shape.rope_scaling.old_context_len}};
  out["share_embeddings_and_output_weights"] = shape.share_embeddings_and_output_weights;
  return out;
}

namespace {

// An optional architecture key: absent -> `fallback` (the GPT default); present -> one of the
// spellings `names` gives for the enum's values.
template <class E>
E enum_field(const nlohmann::json& model, const char* key, E fallback, std::initializer_list<E> values,
             const std::string& file) {
  const auto it = model.find(key);
  if (it == model.end()) return fallback;
  std::string known;
  for (E v : values) {
    if (it->is_string() && it->get<std::string>() == recipe_name(v)) return v;
    known += std::string(known.empty() ? "" : ", ") + recipe_name(v);
  }
  throw std::invalid_argument(file + ": layout.model: expected \"" + key + "\" one of " + known + ", found " +
                              it->dump());
}

}  // namespace

ModelShape model_shape_from_json(const nlohmann::json& model, const std::string& file) {
  if (!model.is_object())
    throw std::invalid_argument(file + ": layout.model: expected an object, found " + model.dump());
  auto field = [&](const char* key) {
    const auto it = model.find(key);
    if (it == model.end() || !it->is_number_integer())
      throw std::invalid_argument(file + ": layout.model: expected an integer \"" + key + "\", found " +
                                  (it == model.end() ? std::string("none") : it->dump()));
    return it->get<int64_t>();
  };
  ModelShape s;
  s.num_layers = field("num_layers");
  s.hidden_size = field("hidden_size");
  s.ffn_hidden_size = field("ffn_hidden_size");
  s.num_attention_heads = field("num_attention_heads");
  s.vocab_size = field("vocab_size");
  s.max_position_embeddings = field("max_position_embeddings");
  s.seq_length = s.max_position_embeddings;
  // The architecture: absent in checkpoints written before Llama support (and in every GPT
  // one), which then read as GPT's defaults.
  s.normalization = enum_field(model, "normalization", s.normalization,
                               {Normalization::kLayerNorm, Normalization::kRmsNorm}, file);
  s.position_embedding_type =
      enum_field(model, "position_embedding_type", s.position_embedding_type,
                 {PositionEmbedding::kLearnedAbsolute, PositionEmbedding::kRope}, file);
  s.activation = enum_field(model, "activation", s.activation, {Activation::kGelu, Activation::kSwiglu}, file);
  auto real = [&](const char* key, double fallback) {
    const auto it = model.find(key);
    if (it == model.end()) return fallback;
    if (!it->is_number())
      throw std::invalid_argument(file + ": layout.model: expected a number \"" + key + "\", found " + it->dump());
    return it->get<double>();
  };
  auto flag = [&](const char* key, bool fallback) {
    const auto it = model.find(key);
    if (it == model.end()) return fallback;
    if (!it->is_boolean())
      throw std::invalid_argument(file + ": layout.model: expected a boolean \"" + key + "\", found " + it->dump());
    return it->get<bool>();
  };
  s.rotary_base = real("rotary_base", s.rotary_base);
  s.rotary_percentage = real("rotary_percentage", s.rotary_percentage);
  if (model.contains("num_query_groups")) s.num_query_groups = field("num_query_groups");
  s.bias = flag("bias", s.bias);
  s.qkv_bias = flag("qkv_bias", s.qkv_bias);
  if (model.contains("kv_channels")) s.kv_channels = field("kv_channels");
  if (model.contains("rope_scaling")) {
    const nlohmann::json& r = model["rope_scaling"];
    if (!r.is_object())
      throw std::invalid_argument(file + ": layout.model: expected an object \"rope_scaling\", found " + r.dump());
    auto number = [&](const char* key) {
      if (!r.contains(key) || !r[key].is_number())
        throw std::invalid_argument(file + ": layout.model.rope_scaling: expected a number \"" + key + "\"");
      return r[key].get<double>();
    };
    s.rope_scaling = {true, number("factor"), number("low_freq_factor"), number("high_freq_factor"),
                      static_cast<int64_t>(number("old_context_len"))};
  }
  s.share_embeddings_and_output_weights =
      flag("share_embeddings_and_output_weights", s.share_embeddings_and_output_weights);
  return s;
}

}  // namespace loom
