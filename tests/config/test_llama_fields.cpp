// The Llama-family model fields (NeMo's names; docs/design/llama.md): their GPT defaults, a
// recipe that sets them, the errors that name the field, and the checkpoint codec
// (rules/model_shape_json.h) carrying them, with older checkpoints reading as GPT.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "config/derived.h"
#include "config_test_util.h"
#include "rules/model_shape_json.h"

using namespace loom::config;
using loom::config::test::errors_of;
using loom::config::test::kMinimalRecipe;

namespace {

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

// The minimal recipe (t = 2, 4 heads) as a Llama: RMSNorm, RoPE, SwiGLU, 2 K/V heads, no bias,
// untied output.
const std::vector<std::string> kLlama = {
    "model.normalization=rmsnorm",   "model.position_embedding_type=rope", "model.rotary_base=500000",
    "model.activation=fast-swiglu",  "model.num_query_groups=2",          "model.bias=false",
    "model.share_embeddings_and_output_weights=false", "model.layernorm_epsilon=1.0e-6"};

}  // namespace

TEST_CASE("the architecture fields default to GPT's", "[config]") {
  const Recipe r = load_recipe_from_string(kMinimalRecipe, "min.yaml");
  CHECK(r.model.normalization == loom::Normalization::kLayerNorm);
  CHECK(r.model.position_embedding_type == loom::PositionEmbedding::kLearnedAbsolute);
  CHECK(r.model.rotary_base == 10000.0);
  CHECK(r.model.rotary_percentage == 1.0);
  CHECK(r.model.activation == loom::Activation::kGelu);
  CHECK_FALSE(r.model.num_query_groups.has_value());
  CHECK(r.model.bias);
  CHECK_FALSE(r.model.qkv_bias);
  CHECK(r.model.share_embeddings_and_output_weights);
  const loom::ModelShape shape = recipe_model_shape(r, 50257);
  CHECK(shape.is_gpt());
  CHECK(shape.query_groups() == 4);
  // Redundant spellings stay GPT (exported as GPT-2): kv_channels written as hidden / heads, and
  // a QKV bias beside bias: true.
  const Recipe spelled = load_recipe_from_string(kMinimalRecipe, "min.yaml",
                                                 {"model.kv_channels=" + std::to_string(r.model.hidden_size / r.model.num_attention_heads),
                                                  "model.qkv_bias=true"});
  CHECK(recipe_model_shape(spelled, 50257).is_gpt());
  CHECK_FALSE(recipe_model_shape(load_recipe_from_string(kMinimalRecipe, "min.yaml", {"model.kv_channels=8"}), 50257).is_gpt());
}

TEST_CASE("a Llama recipe reads into the model shape", "[config]") {
  const Recipe r = load_recipe_from_string(kMinimalRecipe, "min.yaml", kLlama);
  const loom::ModelShape s = recipe_model_shape(r, 32000);
  CHECK(s.normalization == loom::Normalization::kRmsNorm);
  CHECK(s.position_embedding_type == loom::PositionEmbedding::kRope);
  CHECK(s.rotary_base == 500000.0);
  CHECK(s.activation == loom::Activation::kSwiglu);
  CHECK(s.num_query_groups == 2);
  CHECK(s.query_groups() == 2);
  CHECK_FALSE(s.bias);
  CHECK_FALSE(s.share_embeddings_and_output_weights);
  CHECK_FALSE(s.is_gpt());
  CHECK(r.model.layernorm_epsilon == 1e-6);
  // Qwen2: NeMo's qkv_bias (Megatron-Core's add_qkv_bias) beside bias false.
  const Recipe qwen2 = load_recipe_from_string(kMinimalRecipe, "min.yaml", {"model.bias=false", "model.qkv_bias=true"});
  CHECK(recipe_model_shape(qwen2, 32000).qkv_bias);
  CHECK_FALSE(recipe_model_shape(qwen2, 32000).is_gpt());
  // NeMo's other spelling of the gated MLP.
  CHECK(load_recipe_from_string(kMinimalRecipe, "min.yaml", {"model.activation=swiglu"}).model.activation ==
        loom::Activation::kSwiglu);
}

TEST_CASE("bad Llama fields are errors naming the field", "[config]") {
  // 3 groups do not divide 4 heads.
  std::string text = joined(errors_of(kMinimalRecipe, {"model.num_query_groups=3"}));
  INFO(text);
  CHECK(text.find("model.num_query_groups: expected a divisor of num_attention_heads (4), found 3") != std::string::npos);
  // 1 group (multi-query) does not split over t = 2: Loom does not replicate K/V heads.
  text = joined(errors_of(kMinimalRecipe, {"model.num_query_groups=1"}));
  CHECK(text.find("model.num_query_groups: expected a multiple of tensor_model_parallel_size (2)") != std::string::npos);
  CHECK(errors_of(kMinimalRecipe, {"model.num_query_groups=1", "model.tensor_model_parallel_size=1",
                                   "trainer.devices=2"}).empty());
  text = joined(errors_of(kMinimalRecipe, {"model.num_query_groups=0"}));
  CHECK(text.find("model.num_query_groups") != std::string::npos);
  text = joined(errors_of(kMinimalRecipe, {"model.rotary_percentage=0"}));
  CHECK(text.find("model.rotary_percentage: expected a fraction in (0, 1], found 0") != std::string::npos);
  CHECK(errors_of(kMinimalRecipe, {"model.position_embedding_type=rope", "model.rotary_percentage=0.5"}).empty());
  text = joined(errors_of(kMinimalRecipe, {"model.rope_scaling=true"}));
  CHECK(text.find("model.rope_scaling: true needs position_embedding_type rope") != std::string::npos);
  text = joined(errors_of(kMinimalRecipe, {"model.kv_channels=0"}));
  CHECK(text.find("model.kv_channels") != std::string::npos);
  // kv_channels frees the head width from hidden_size / num_attention_heads (HF head_dim).
  CHECK(errors_of(kMinimalRecipe, {"model.hidden_size=66", "model.kv_channels=16"}).empty());
  text = joined(errors_of(kMinimalRecipe, {"model.position_embedding_type=rope", "model.rotary_base=0"}));
  CHECK(text.find("model.rotary_base: expected > 0, found 0") != std::string::npos);
  text = joined(errors_of(kMinimalRecipe, {"model.activation=relu"}));
  CHECK(text.find("model.activation") != std::string::npos);
  CHECK(text.find("fast-swiglu") != std::string::npos);
  text = joined(errors_of(kMinimalRecipe, {"model.normalization=batchnorm"}));
  CHECK(text.find("model.normalization") != std::string::npos);
}

TEST_CASE("the checkpoint codec carries the architecture, and old checkpoints read as GPT", "[config]") {
  // A GPT shape: the keys checkpoints have always had, nothing more.
  loom::ModelShape gpt{4, 128, 4, 0, 128, 256, 50257, 128};
  const nlohmann::json old = loom::model_shape_to_json(gpt);
  CHECK(old.size() == 6);
  const loom::ModelShape back = loom::model_shape_from_json(old, "metadata.json");
  CHECK(back.is_gpt());
  CHECK(back.query_groups() == 4);

  loom::ModelShape llama = gpt;
  llama.normalization = loom::Normalization::kRmsNorm;
  llama.position_embedding_type = loom::PositionEmbedding::kRope;
  llama.rotary_base = 500000.0;
  llama.activation = loom::Activation::kSwiglu;
  llama.num_query_groups = 2;
  llama.bias = false;
  llama.share_embeddings_and_output_weights = false;
  const nlohmann::json j = loom::model_shape_to_json(llama);
  CHECK(j.at("normalization") == "rmsnorm");
  CHECK(j.at("position_embedding_type") == "rope");
  CHECK(j.at("activation") == "fast-swiglu");
  CHECK(j.at("num_query_groups") == 2);
  const loom::ModelShape r = loom::model_shape_from_json(j, "metadata.json");
  CHECK(r.normalization == llama.normalization);
  CHECK(r.position_embedding_type == llama.position_embedding_type);
  CHECK(r.rotary_base == 500000.0);
  CHECK(r.rotary_percentage == 1.0);
  CHECK(r.activation == llama.activation);
  CHECK(r.num_query_groups == 2);
  CHECK_FALSE(r.bias);
  CHECK_FALSE(r.qkv_bias);
  CHECK_FALSE(r.share_embeddings_and_output_weights);
  llama.qkv_bias = true;
  CHECK(loom::model_shape_from_json(loom::model_shape_to_json(llama), "metadata.json").qkv_bias);

  nlohmann::json bad = j;
  bad["activation"] = "relu";
  CHECK_THROWS_WITH(loom::model_shape_from_json(bad, "metadata.json"),
                    Catch::Contains("metadata.json: layout.model: expected \"activation\" one of gelu, fast-swiglu"));
  bad = j;
  bad["bias"] = 1;
  CHECK_THROWS_WITH(loom::model_shape_from_json(bad, "metadata.json"), Catch::Contains("\"bias\""));
}
