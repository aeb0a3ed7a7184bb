#include "rules/model_shape_json.h"

#include <nlohmann/json.hpp>

#include <stdexcept>

namespace loom {

nlohmann::json model_shape_to_json(const ModelShape& shape) {
  return {{"num_layers", shape.num_layers},
          {"hidden_size", shape.hidden_size},
          {"ffn_hidden_size", shape.ffn()},
          {"num_attention_heads", shape.num_attention_heads},
          {"vocab_size", shape.vocab_size},
          {"max_position_embeddings", shape.max_position_embeddings}};
}

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
  return s;
}

}  // namespace loom
