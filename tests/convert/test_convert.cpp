// loom_convert's parts: the safetensors reader/writer on every dtype (the Python package's files
// are checked in tests/python/test_convert.py), the Loom <-> Hugging Face GPT-2 mapping (an
// exact inverse; the fused QKV regrouped per head), config.json fields Loom cannot represent;
// and, hidden ("[.logits]"), the logits of a checkpoint for the Python tests to compare with
// transformers.
#include <catch2/catch.hpp>
#include <ATen/ATen.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "convert/convert_error.h"
#include "convert/hf_gpt2.h"
#include "convert/run_recipe.h"
#include "generate/checkpoint_reader.h"
#include "generate/model_loader.h"
#include "launch/file_util.h"
#include "model/dropout_context.h"
#include "model/gpt_stage.h"
#include "runtime/communicator.h"
#include "tensor_io/safetensors_file.h"

using namespace loom;

namespace {

std::string temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("loom_test_convert_" + name + "_" + std::to_string(::getpid()));
  launch::remove_tree(dir.string());
  std::filesystem::create_directories(dir);
  return dir.string();
}

convert::Gpt2Shape small_shape() {
  convert::Gpt2Shape s;
  s.num_layers = 2;
  s.hidden_size = 8;
  s.num_attention_heads = 2;
  s.ffn_hidden_size = 12;
  s.vocab_size = 10;
  s.max_position_embeddings = 6;
  return s;
}

// Loom-named parameters of `s` with distinct values, the word embedding padded to `padded`.
std::map<std::string, at::Tensor> loom_params(const convert::Gpt2Shape& s, int64_t padded) {
  const int64_t h = s.hidden_size, f = s.ffn_hidden_size;
  std::map<std::string, std::vector<int64_t>> shapes = {{"embedding.word_embeddings.weight", {padded, h}},
                                                        {"embedding.position_embeddings.weight", {s.max_position_embeddings, h}},
                                                        {"final_layernorm.weight", {h}},
                                                        {"final_layernorm.bias", {h}}};
  for (int i = 0; i < s.num_layers; ++i) {
    const std::string l = "layers." + std::to_string(i) + ".";
    shapes[l + "input_layernorm.weight"] = {h};
    shapes[l + "input_layernorm.bias"] = {h};
    shapes[l + "self_attention.linear_qkv.weight"] = {3 * h, h};
    shapes[l + "self_attention.linear_qkv.bias"] = {3 * h};
    shapes[l + "self_attention.linear_proj.weight"] = {h, h};
    shapes[l + "self_attention.linear_proj.bias"] = {h};
    shapes[l + "pre_mlp_layernorm.weight"] = {h};
    shapes[l + "pre_mlp_layernorm.bias"] = {h};
    shapes[l + "mlp.linear_fc1.weight"] = {f, h};
    shapes[l + "mlp.linear_fc1.bias"] = {f};
    shapes[l + "mlp.linear_fc2.weight"] = {h, f};
    shapes[l + "mlp.linear_fc2.bias"] = {h};
  }
  std::map<std::string, at::Tensor> out;
  double start = 0;
  for (const auto& [name, shape] : shapes) {
    at::Tensor t = at::arange(start, start + c10::multiply_integers(shape), at::kFloat).view(shape);
    start += t.numel();
    out[name] = t;
  }
  out["embedding.word_embeddings.weight"].narrow(0, s.vocab_size, padded - s.vocab_size).zero_();
  return out;
}

}  // namespace

TEST_CASE("safetensors: every dtype round-trips bit for bit", "[convert]") {
  const std::string dir = temp_dir("dtypes");
  tensor_io::SafetensorsContent c;
  c.tensors["f64"] = at::randn({2, 3}, at::kDouble);
  c.tensors["f32"] = at::randn({4}, at::kFloat);
  c.tensors["f16"] = at::randn({3, 1}, at::kHalf);
  c.tensors["bf16"] = at::randn({5}, at::kBFloat16);
  c.tensors["i64"] = at::arange(7, at::kLong);
  c.tensors["i32"] = at::arange(3, at::kInt);
  c.tensors["scalar"] = at::scalar_tensor(2.5, at::kFloat);
  tensor_io::write_safetensors(dir + "/x.safetensors", c);
  const auto back = tensor_io::read_safetensors(dir + "/x.safetensors");
  REQUIRE(back.tensors.size() == c.tensors.size());
  for (const auto& [name, t] : c.tensors) {
    INFO(name);
    CHECK(back.tensors.at(name).scalar_type() == t.scalar_type());
    CHECK(at::equal(back.tensors.at(name), t));
  }
  tensor_io::SafetensorsContent bad;
  bad.tensors["flag"] = at::ones({1}, at::kBool);
  CHECK_THROWS_WITH(tensor_io::write_safetensors(dir + "/y.safetensors", bad), Catch::Contains("tensor 'flag' is Bool"));
  launch::remove_tree(dir);
}

TEST_CASE("safetensors: a header naming one tensor twice, or a field of an entry twice, is refused", "[convert]") {
  // The first of the two lies about the shape; a JSON object reader keeps only one of them.
  const std::string dir = temp_dir("duplicate");
  auto file_with = [&](const std::string& header) {
    std::string bytes;
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xFF));
    bytes += header + std::string(8, '\0');
    const std::string path = dir + "/dup.safetensors";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return path;
  };
  CHECK_THROWS_WITH(
      tensor_io::read_safetensors(file_with(
          R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})")),
      Catch::Contains("dup.safetensors: not a safetensors file") && Catch::Contains("names 'w' twice"));
  CHECK_THROWS_WITH(tensor_io::read_safetensors(
                        file_with(R"({"w":{"dtype":"F32","shape":[9999999,5],"shape":[2],"data_offsets":[0,8]}})")),
                    Catch::Contains("entry 'w' has the field 'shape' twice"));
  // __metadata__ is a free map (the reference keeps the last value): accepted.
  const auto content = tensor_io::read_safetensors(
      file_with(R"({"__metadata__":{"k":"a","k":"b"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})"));
  CHECK(content.metadata.at("k") == "b");
  launch::remove_tree(dir);
}

TEST_CASE("hf mapping: Loom -> HF -> Loom is exact, QKV regrouped from per-head to [q|k|v]", "[convert]") {
  const auto s = small_shape();
  const auto loom = loom_params(s, 16);
  const auto hf = convert::loom_to_hf(loom, s);
  CHECK(hf.count("lm_head.weight") == 0);
  CHECK(hf.at("transformer.wte.weight").sizes() == at::IntArrayRef({10, 8}));
  CHECK(hf.at("transformer.h.1.mlp.c_fc.weight").sizes() == at::IntArrayRef({8, 12}));
  // Head 1's key rows of Loom ([q0 k0 v0 q1 k1 v1], d = 4) are HF's columns h + 4 .. h + 8.
  const at::Tensor qkv = loom.at("layers.0.self_attention.linear_qkv.weight");
  const at::Tensor c_attn = hf.at("transformer.h.0.attn.c_attn.weight");
  CHECK(at::equal(c_attn.narrow(1, 8 + 4, 4), qkv.narrow(0, 3 * 4 + 4, 4).t()));
  CHECK(at::equal(hf.at("transformer.h.0.attn.c_attn.bias").narrow(0, 2 * 8, 4),
                  loom.at("layers.0.self_attention.linear_qkv.bias").narrow(0, 8, 4)));
  const auto again = convert::hf_to_loom(hf, s, 16, "mem");
  REQUIRE(again.size() == loom.size());
  for (const auto& [name, t] : loom) {
    INFO(name);
    CHECK(at::equal(again.at(name), t));
  }
  // A tied lm_head is accepted, an untied one refused; missing and misshapen tensors named.
  auto with_head = hf;
  with_head["lm_head.weight"] = hf.at("transformer.wte.weight").clone();
  CHECK_NOTHROW(convert::hf_to_loom(with_head, s, 16, "f"));
  with_head["lm_head.weight"] += 1;
  CHECK_THROWS_WITH(convert::hf_to_loom(with_head, s, 16, "f"), Catch::Contains("tie_word_embeddings"));
  auto missing = hf;
  missing.erase("transformer.h.1.ln_2.bias");
  CHECK_THROWS_WITH(convert::hf_to_loom(missing, s, 16, "m.safetensors"),
                    Catch::Contains("m.safetensors: no tensor transformer.h.1.ln_2.bias"));
  auto misshapen = hf;
  misshapen["transformer.h.0.attn.c_proj.weight"] = at::zeros({8, 9});
  CHECK_THROWS_WITH(convert::hf_to_loom(misshapen, s, 16, "m"),
                    Catch::Contains("transformer.h.0.attn.c_proj.weight has shape [8, 9], expected [8, 8]"));
  auto extra = hf;
  extra["transformer.h.2.ln_1.weight"] = at::zeros({8});
  CHECK_THROWS_WITH(convert::hf_to_loom(extra, s, 16, "m"), Catch::Contains("h.2.ln_1.weight is not part"));
}

TEST_CASE("hf config: defaults as GPT2Config, unrepresentable fields named", "[convert]") {
  auto s = convert::gpt2_shape_from_config(nlohmann::json::parse(R"({"n_layer": 3, "n_embd": 16, "n_head": 4})"), "c.json");
  CHECK(s.ffn_hidden_size == 64);
  CHECK(s.vocab_size == 50257);
  CHECK(s.max_position_embeddings == 1024);
  const auto round = convert::gpt2_shape_from_config(convert::hf_config_json(s, {}), "c.json");
  CHECK(round.num_layers == 3);
  CHECK(round.ffn_hidden_size == 64);
  for (const auto& [text, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"activation_function": "relu"})", "activation_function \"relu\""},
           {R"({"activation_function": "gelu"})", "activation_function \"gelu\""},
           {R"({"tie_word_embeddings": false})", "tie_word_embeddings"},
           {R"({"scale_attn_by_inverse_layer_idx": true})", "scale_attn_by_inverse_layer_idx"},
           {R"({"scale_attn_weights": false})", "scale_attn_weights"},
           {R"({"add_cross_attention": true})", "add_cross_attention"},
           {R"({"model_type": "llama"})", "model_type"},
           {R"({"n_embd": 10, "n_head": 4})", "n_embd 10 is not divisible by n_head 4"},
           {R"({"n_layer": 0})", "n_layer must be a positive integer"}}) {
    INFO(text);
    CHECK_THROWS_WITH(convert::gpt2_shape_from_config(nlohmann::json::parse(text), "c.json"),
                      Catch::Contains("c.json: " + field));
  }
}

// Writes the float32 logits [n, V] of checkpoint $LOOM_LOGITS_CHECKPOINT (a run directory) on
// the tokens $LOOM_LOGITS_TOKENS ("1,2,3") to $LOOM_LOGITS_OUT (safetensors, "logits"), with the
// run's layer norm epsilon: the Python tests compare them with transformers'.
TEST_CASE("logits of a checkpoint for the Python tests", "[.logits]") {
  const char* dir = std::getenv("LOOM_LOGITS_CHECKPOINT");
  const char* tokens_text = std::getenv("LOOM_LOGITS_TOKENS");
  const char* out = std::getenv("LOOM_LOGITS_OUT");
  REQUIRE(dir);
  REQUIRE(tokens_text);
  REQUIRE(out);
  std::vector<int64_t> ids;
  std::stringstream in(tokens_text);
  for (std::string item; std::getline(in, item, ',');) ids.push_back(std::stoll(item));
  const auto location = generate::locate_checkpoint(dir);
  const auto recipe = convert::load_run_recipe(location.run_dir, "the logits");
  const auto info = generate::read_checkpoint_info(location.checkpoints);
  const auto full = generate::read_full_checkpoint(location.checkpoints, info);
  generate::InferenceModelOptions options;
  options.layernorm_epsilon = recipe.model.layernorm_epsilon;
  options.make_vocab_size_divisible_by = recipe.model.make_vocab_size_divisible_by;
  const auto config = generate::inference_config(info.layout.model_shape, options);
  const model::GptStage stage = generate::load_inference_model(full, config, runtime::Communicator::solo());
  at::NoGradGuard no_grad;
  model::StageInputs inputs;
  const int64_t n = static_cast<int64_t>(ids.size());
  inputs.tokens = at::tensor(ids, at::kLong).view({1, n});  // host: a CPU model
  inputs.position_ids = at::arange(n, at::kLong).view({1, n});  // host: as above
  model::DropoutContext dropout;
  dropout.training = false;
  at::Tensor logits = stage.forward(inputs, dropout);  // [n, 1, V_padded]
  tensor_io::SafetensorsContent content;
  content.tensors["logits"] = logits.select(1, 0).narrow(1, 0, config.vocab_size).contiguous().to(at::kFloat);
  tensor_io::write_safetensors(out, content);
}
