// The model shape as checkpoints record it (rules/model_shape_json.h): the one codec that the
// trainer writes with and every checkpoint reader, the planner's `plan infer --checkpoint`
// included, reads with.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <unistd.h>

#include "planner/inference_measure.h"
#include "rules/model_shape_json.h"

using loom::ModelShape;

namespace {

// The layout.model object of a checkpoint the trainer wrote before the codec existed.
const nlohmann::json kRecorded = {{"num_layers", 4},     {"hidden_size", 128},        {"ffn_hidden_size", 384},
                                  {"num_attention_heads", 4}, {"vocab_size", 50257}, {"max_position_embeddings", 256}};

}  // namespace

TEST_CASE("the checkpoint's model shape is written with the keys checkpoints have always had", "[planner][checkpoint]") {
  ModelShape m{4, 128, 4, 0, 128, 256, 50257, 128};  // ffn 0: 4h
  const nlohmann::json j = loom::model_shape_to_json(m);
  CHECK(j == nlohmann::json{{"num_layers", 4},         {"hidden_size", 128}, {"ffn_hidden_size", 512},
                            {"num_attention_heads", 4}, {"vocab_size", 50257}, {"max_position_embeddings", 256}});
}

TEST_CASE("a recorded model shape reads back, other keys beside it left alone", "[planner][checkpoint]") {
  nlohmann::json model = kRecorded;
  model["prompt_learning"] = {{"base_iteration", 2}};
  const ModelShape s = loom::model_shape_from_json(model, "iter_0000002/metadata.json");
  CHECK(s.num_layers == 4);
  CHECK(s.hidden_size == 128);
  CHECK(s.ffn_hidden_size == 384);
  CHECK(s.num_attention_heads == 4);
  CHECK(s.vocab_size == 50257);
  CHECK(s.max_position_embeddings == 256);
  CHECK(s.seq_length == 256);                     // not recorded: up to the position table
  CHECK(s.make_vocab_size_divisible_by == 1);     // not recorded: the caller's recipe sets it
  CHECK(loom::model_shape_to_json(s) == kRecorded);  // the same object written again
}

TEST_CASE("a missing or non-integer model field is named with the file", "[planner][checkpoint]") {
  nlohmann::json model = kRecorded;
  model.erase("hidden_size");
  CHECK_THROWS_WITH(loom::model_shape_from_json(model, "run/iter_0000007/metadata.json"),
                    "run/iter_0000007/metadata.json: layout.model: expected an integer \"hidden_size\", found none");
  model = kRecorded;
  model["vocab_size"] = "50257";
  CHECK_THROWS_WITH(loom::model_shape_from_json(model, "m.json"),
                    "m.json: layout.model: expected an integer \"vocab_size\", found \"50257\"");
  CHECK_THROWS_WITH(loom::model_shape_from_json(nlohmann::json::array(), "m.json"),
                    "m.json: layout.model: expected an object, found []");
}

TEST_CASE("plan infer --checkpoint reads the shape with the checkpoints' codec", "[planner][checkpoint]") {
  namespace fs = std::filesystem;
  const fs::path run = fs::temp_directory_path() / ("loom_test_planner_ckpt_" + std::to_string(::getpid()));
  const fs::path iter = run / "checkpoints" / "iter_0000003";
  fs::create_directories(iter);
  std::ofstream(run / "checkpoints" / "latest_checkpointed_iteration.txt") << "3\n";
  nlohmann::json meta = {{"format", "loom-megatron-legacy-1"}, {"iteration", 3},
                         {"layout", {{"tensor_model_parallel_size", 1}, {"model", kRecorded}}}};
  std::ofstream(iter / "metadata.json") << meta.dump(2);
  const ModelShape s = loom::planner::checkpoint_model_shape(run.string());
  CHECK(loom::model_shape_to_json(s) == kRecorded);
  CHECK(s.seq_length == 256);

  meta["layout"]["model"].erase("num_layers");
  std::ofstream(iter / "metadata.json") << meta.dump(2);
  CHECK_THROWS_WITH(loom::planner::checkpoint_model_shape(run.string()),
                    Catch::Contains("--checkpoint: ") && Catch::Contains("iter_0000003/metadata.json") &&
                        Catch::Contains("expected an integer \"num_layers\", found none"));
  std::error_code ec;
  fs::remove(iter / "metadata.json", ec);
  fs::remove(run / "checkpoints" / "latest_checkpointed_iteration.txt", ec);
  fs::remove(iter, ec);
  fs::remove(run / "checkpoints", ec);
  fs::remove(run, ec);
}
