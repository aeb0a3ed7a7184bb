// The Loom <-> Hugging Face LlamaForCausalLM mapping (convert/hf_llama.h): an exact inverse, the
// fused QKV regrouped per query group and SwiGLU's gate/up rows interleaved exactly as the model
// reads them (model/attention.h, model/mlp.h), and config.json fields Loom cannot represent
// refused naming the field. Logits against transformers: tests/python/test_convert_llama.py.
#include <catch2/catch.hpp>
#include <ATen/ATen.h>

#include "convert/convert_error.h"
#include "convert/hf_llama.h"

using namespace loom;

namespace {

// 4 query heads of dim 4 in 2 groups, untied output.
convert::Gpt2Shape llama_shape() {
  convert::Gpt2Shape s;
  s.num_layers = 2;
  s.hidden_size = 16;
  s.num_attention_heads = 4;
  s.num_query_groups = 2;
  s.ffn_hidden_size = 24;
  s.vocab_size = 10;
  s.max_position_embeddings = 32;
  s.normalization = Normalization::kRmsNorm;
  s.position_embedding_type = PositionEmbedding::kRope;
  s.activation = Activation::kSwiglu;
  s.bias = false;
  s.share_embeddings_and_output_weights = false;
  s.layernorm_epsilon = 1e-6;
  return s;
}

// HF-named tensors of `s` with distinct values.
std::map<std::string, at::Tensor> hf_params(const convert::Gpt2Shape& s) {
  const int64_t h = s.hidden_size, f = s.ffn(), d = s.head_dim(), g = s.query_groups();
  std::map<std::string, std::vector<int64_t>> shapes = {{"model.embed_tokens.weight", {s.vocab_size, h}},
                                                        {"model.norm.weight", {h}},
                                                        {"lm_head.weight", {s.vocab_size, h}}};
  for (int i = 0; i < s.num_layers; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    shapes[l + "input_layernorm.weight"] = {h};
    shapes[l + "self_attn.q_proj.weight"] = {s.num_attention_heads * d, h};
    shapes[l + "self_attn.k_proj.weight"] = {g * d, h};
    shapes[l + "self_attn.v_proj.weight"] = {g * d, h};
    shapes[l + "self_attn.o_proj.weight"] = {h, s.num_attention_heads * d};
    shapes[l + "post_attention_layernorm.weight"] = {h};
    shapes[l + "mlp.gate_proj.weight"] = {f, h};
    shapes[l + "mlp.up_proj.weight"] = {f, h};
    shapes[l + "mlp.down_proj.weight"] = {h, f};
    if (s.qkv_bias) {
      shapes[l + "self_attn.q_proj.bias"] = {s.num_attention_heads * d};
      shapes[l + "self_attn.k_proj.bias"] = {g * d};
      shapes[l + "self_attn.v_proj.bias"] = {g * d};
    }
  }
  std::map<std::string, at::Tensor> out;
  double start = 0;
  for (const auto& [name, shape] : shapes) {
    at::Tensor t = at::arange(start, start + c10::multiply_integers(shape), at::kFloat).view(shape);
    start += t.numel();
    out[name] = t;
  }
  return out;
}

}  // namespace

TEST_CASE("Llama HF -> Loom -> HF is the identity, with Loom's per-group QKV and interleaved gate/up", "[convert]") {
  const auto s = llama_shape();
  const auto hf = hf_params(s);
  const auto loom = convert::llama_to_loom(hf, s, /*padded_vocab=*/16, "model.safetensors");
  CHECK(loom.count("output_layer.weight"));
  CHECK(loom.at("output_layer.weight").size(0) == 16);
  CHECK(loom.at("embedding.word_embeddings.weight").narrow(0, 10, 6).eq(0).all().item<bool>());
  // Group 1 of layer 0: query heads 2 and 3, then K/V head 1 (d = 4 rows each).
  const at::Tensor qkv = loom.at("layers.0.self_attention.linear_qkv.weight");  // [(4 + 2·2)·4, 16]
  REQUIRE(qkv.size(0) == 32);
  const at::Tensor q = hf.at("model.layers.0.self_attn.q_proj.weight"), k = hf.at("model.layers.0.self_attn.k_proj.weight"),
                   v = hf.at("model.layers.0.self_attn.v_proj.weight");
  CHECK(at::equal(qkv.narrow(0, 16, 8), q.narrow(0, 8, 8)));
  CHECK(at::equal(qkv.narrow(0, 24, 4), k.narrow(0, 4, 4)));
  CHECK(at::equal(qkv.narrow(0, 28, 4), v.narrow(0, 4, 4)));
  // fc1 rows: gate j at 2j, up j at 2j + 1.
  const at::Tensor fc1 = loom.at("layers.1.mlp.linear_fc1.weight");
  CHECK(at::equal(fc1[6], hf.at("model.layers.1.mlp.gate_proj.weight")[3]));
  CHECK(at::equal(fc1[7], hf.at("model.layers.1.mlp.up_proj.weight")[3]));
  CHECK(at::equal(loom.at("layers.1.pre_mlp_layernorm.weight"), hf.at("model.layers.1.post_attention_layernorm.weight")));

  const auto back = convert::loom_to_llama(loom, s);
  REQUIRE(back.size() == hf.size());
  for (const auto& [name, t] : hf) {
    INFO(name);
    REQUIRE(back.count(name));
    CHECK(at::equal(back.at(name), t));
  }
}

TEST_CASE("Llama HF tensors that do not fit are named", "[convert]") {
  const auto s = llama_shape();
  auto hf = hf_params(s);
  hf.erase("model.layers.1.mlp.up_proj.weight");
  CHECK_THROWS_WITH(convert::llama_to_loom(hf, s, 16, "w.safetensors"),
                    Catch::Contains("w.safetensors: no tensor model.layers.1.mlp.up_proj.weight"));
  hf = hf_params(s);
  hf["model.layers.0.self_attn.q_proj.bias"] = at::zeros({16});
  CHECK_THROWS_WITH(convert::llama_to_loom(hf, s, 16, "w.safetensors"),
                    Catch::Contains("tensor model.layers.0.self_attn.q_proj.bias is not part of a Llama model"));
  hf = hf_params(s);
  hf["model.layers.0.self_attn.k_proj.weight"] = at::zeros({16, 16});  // 4 K/V heads: config.json says 2
  CHECK_THROWS_WITH(convert::llama_to_loom(hf, s, 16, "w.safetensors"),
                    Catch::Contains("k_proj.weight has shape [16, 16], expected [8, 16]"));
  // Tied: lm_head, when stored, must be the embedding.
  auto tied = s;
  tied.share_embeddings_and_output_weights = true;
  CHECK_THROWS_WITH(convert::llama_to_loom(hf_params(s), tied, 16, "w.safetensors"),
                    Catch::Contains("lm_head.weight differs from model.embed_tokens.weight"));
}

TEST_CASE("Llama config.json reads into the architecture, and what Loom cannot represent is named", "[convert]") {
  const nlohmann::json base = {{"model_type", "llama"},      {"hidden_size", 16},         {"intermediate_size", 24},
                               {"num_hidden_layers", 2},     {"num_attention_heads", 4},  {"num_key_value_heads", 2},
                               {"vocab_size", 10},           {"rms_norm_eps", 1e-5},      {"max_position_embeddings", 32},
                               {"rope_parameters", {{"rope_theta", 500000.0}, {"rope_type", "default"}}},
                               {"tie_word_embeddings", false}, {"hidden_act", "silu"}};
  const auto s = convert::llama_shape_from_config(base, "config.json");
  CHECK(s.query_groups() == 2);
  CHECK(s.rotary_base == 500000.0);
  CHECK(s.layernorm_epsilon == 1e-5);
  CHECK(s.normalization == Normalization::kRmsNorm);
  CHECK_FALSE(s.share_embeddings_and_output_weights);
  // The export's config.json reads back to the same shape.
  const auto again = convert::llama_shape_from_config(convert::llama_config_json(s, {}, 1, 2), "config.json");
  CHECK(again.query_groups() == 2);
  CHECK(again.rotary_base == 500000.0);
  CHECK(again.ffn() == 24);
  // transformers 4's spelling.
  nlohmann::json old = base;
  old.erase("rope_parameters");
  old["rope_theta"] = 10000.0;
  old["rope_scaling"] = nullptr;
  CHECK(convert::llama_shape_from_config(old, "config.json").rotary_base == 10000.0);

  auto refused = [&](const char* key, const nlohmann::json& value, const std::string& needle) {
    nlohmann::json c = base;
    c[key] = value;
    CHECK_THROWS_WITH(convert::llama_shape_from_config(c, "config.json"),
                      Catch::Contains("config.json: ") && Catch::Contains(needle));
  };
  refused("rope_parameters", {{"rope_type", "yarn"}, {"factor", 8.0}, {"rope_theta", 500000.0}},
          "rope_parameters.rope_type \"yarn\" is not supported");
  refused("rope_parameters", {{"rope_type", "llama3"}, {"factor", 8.0}, {"rope_theta", 500000.0}},
          "rope_parameters.low_freq_factor must be a number for rope_type llama3");
  refused("rope_scaling", {{"type", "linear"}, {"factor", 2.0}}, "rope_scaling.rope_type \"linear\"");
  refused("hidden_act", "gelu", "hidden_act \"gelu\"");
  refused("attention_bias", true, "attention_bias is true");
  refused("head_dim", 0, "head_dim must be a positive integer");
  refused("num_key_value_heads", 3, "num_key_value_heads 3 does not divide num_attention_heads 4");
}

TEST_CASE("Qwen2 HF -> Loom -> HF is the identity, its Q/K/V biases regrouped per query group like the weights",
          "[convert]") {
  auto s = llama_shape();
  s.qkv_bias = true;
  const auto hf = hf_params(s);
  const auto loom = convert::llama_to_loom(hf, s, /*padded_vocab=*/16, "model.safetensors");
  // Group 1 of layer 1: query heads 2 and 3 (bias entries 8..15), then K/V head 1 (4..7).
  const at::Tensor bias = loom.at("layers.1.self_attention.linear_qkv.bias");
  REQUIRE(bias.sizes() == at::IntArrayRef({32}));
  const std::string m = "model.layers.1.self_attn.";
  CHECK(at::equal(bias.narrow(0, 16, 8), hf.at(m + "q_proj.bias").narrow(0, 8, 8)));
  CHECK(at::equal(bias.narrow(0, 24, 4), hf.at(m + "k_proj.bias").narrow(0, 4, 4)));
  CHECK(at::equal(bias.narrow(0, 28, 4), hf.at(m + "v_proj.bias").narrow(0, 4, 4)));
  CHECK_FALSE(loom.count("layers.1.self_attention.linear_proj.bias"));
  const auto back = convert::loom_to_llama(loom, s);
  REQUIRE(back.size() == hf.size());
  for (const auto& [name, t] : hf) {
    INFO(name);
    REQUIRE(back.count(name));
    CHECK(at::equal(back.at(name), t));
  }
  // Without its biases a Qwen2 folder is incomplete.
  auto missing = hf;
  missing.erase("model.layers.0.self_attn.v_proj.bias");
  CHECK_THROWS_WITH(convert::llama_to_loom(missing, s, 16, "w.safetensors"),
                    Catch::Contains("w.safetensors: no tensor model.layers.0.self_attn.v_proj.bias"));
}

TEST_CASE("Qwen2 config.json reads as the Llama architecture with Q/K/V biases, and back", "[convert]") {
  const nlohmann::json qwen2 = {{"model_type", "qwen2"},      {"hidden_size", 16},        {"intermediate_size", 24},
                                {"num_hidden_layers", 2},     {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                                {"vocab_size", 10},           {"rms_norm_eps", 1e-6},     {"max_position_embeddings", 32},
                                {"rope_theta", 1000000.0},    {"tie_word_embeddings", true}, {"hidden_act", "silu"},
                                {"use_sliding_window", false}, {"sliding_window", 4096},  {"max_window_layers", 2}};
  const auto s = convert::llama_shape_from_config(qwen2, "config.json");
  CHECK(s.qkv_bias);
  CHECK_FALSE(s.bias);
  CHECK(s.share_embeddings_and_output_weights);
  CHECK(s.rotary_base == 1000000.0);
  const nlohmann::json out = convert::llama_config_json(s, {}, 1, 2);
  CHECK(out.at("model_type") == "qwen2");
  CHECK(out.at("architectures")[0] == "Qwen2ForCausalLM");
  CHECK(out.at("use_sliding_window") == false);
  CHECK_FALSE(out.contains("attention_bias"));
  CHECK(convert::llama_shape_from_config(out, "config.json").qkv_bias);
  // A Llama shape still exports as LlamaForCausalLM.
  CHECK(convert::llama_config_json(llama_shape(), {}, 1, 2).at("model_type") == "llama");

  nlohmann::json sliding = qwen2;
  sliding["use_sliding_window"] = true;
  CHECK_THROWS_WITH(convert::llama_shape_from_config(sliding, "config.json"),
                    Catch::Contains("config.json: use_sliding_window is true"));
  sliding = qwen2;
  sliding["layer_types"] = {"full_attention", "sliding_attention"};
  CHECK_THROWS_WITH(convert::llama_shape_from_config(sliding, "config.json"),
                    Catch::Contains("config.json: layer_types holds \"sliding_attention\""));
}

TEST_CASE("Llama config.json: head_dim other than hidden / heads and Llama 3.1's rope scaling, both ways", "[convert]") {
  const nlohmann::json llama31 = {
      {"model_type", "llama"},       {"hidden_size", 16},      {"intermediate_size", 24},   {"num_hidden_layers", 2},
      {"num_attention_heads", 4},    {"num_key_value_heads", 2}, {"head_dim", 8},          {"vocab_size", 10},
      {"rms_norm_eps", 1e-5},        {"max_position_embeddings", 32}, {"hidden_act", "silu"},
      {"rope_parameters", {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}}}};
  const auto s = convert::llama_shape_from_config(llama31, "config.json");
  CHECK(s.kv_channels == 8);
  CHECK(s.head_dim() == 8);
  CHECK(s.rope_scaling.enabled);
  CHECK(s.rope_scaling.factor == 8.0);
  CHECK(s.rope_scaling.high_freq_factor == 4.0);
  CHECK(s.rope_scaling.old_context_len == 8192);
  CHECK(s.rotary_base == 500000.0);
  const nlohmann::json out = convert::llama_config_json(s, {}, 1, 2);
  CHECK(out.at("head_dim") == 8);
  CHECK(out.at("rope_parameters").at("rope_type") == "llama3");
  CHECK(out.at("rope_scaling").at("original_max_position_embeddings") == 8192);
  const auto again = convert::llama_shape_from_config(out, "config.json");
  CHECK(again.kv_channels == 8);
  CHECK(again.rope_scaling.enabled);
  CHECK(again.rope_scaling.low_freq_factor == 1.0);
  // transformers 4's rope_scaling is read over rope_parameters (as transformers 5 reads it).
  nlohmann::json old = llama31;
  old["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 2.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 64}};
  CHECK(convert::llama_shape_from_config(old, "config.json").rope_scaling.factor == 2.0);
  // The mapping uses d = head_dim: q_proj [a·d, h], o_proj [h, a·d].
  auto hf = hf_params(s);
  CHECK(hf.at("model.layers.0.self_attn.q_proj.weight").size(0) == 32);
  const auto loom = convert::llama_to_loom(hf, s, 16, "model.safetensors");
  CHECK(loom.at("layers.0.self_attention.linear_qkv.weight").size(0) == (4 + 2 * 2) * 8);
  CHECK(loom.at("layers.0.self_attention.linear_proj.weight").sizes() == at::IntArrayRef({16, 32}));
  const auto back = convert::loom_to_llama(loom, s);
  for (const auto& [name, t] : hf) CHECK(at::equal(back.at(name), t));
}
