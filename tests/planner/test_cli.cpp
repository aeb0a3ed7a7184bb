// `loom plan` front end: exit statuses, CSV and recipe outputs.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "planner/cli.h"

using loom::planner::run_plan_command;

namespace {
int run(std::vector<std::string> args) {
  args.insert(args.begin(), "loom plan");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return run_plan_command(int(argv.size()), argv.data());
}
std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
std::string temp_path(const char* name) {
  return std::string("/tmp/loom_test_planner_") + std::to_string(getpid()) + "_" + name;
}
}  // namespace

TEST_CASE("loom plan writes the ranked CSV and a NeMo-style recipe", "[planner]") {
  const std::string csv = temp_path("plan.csv"), yaml = temp_path("plan.yaml");
  REQUIRE(run({"--size", "5", "--nodes", "2", "--global-batch-size", "256", "--tokens", "1e11", "--price",
               "2.5", "--keep", "30", "--csv", csv, "--write-recipe", yaml, "--explain"}) == 0);
  const std::string table = slurp(csv);
  std::size_t lines = 0;
  for (char ch : table) lines += ch == '\n';
  CHECK(lines == 31);  // header + 30 kept layouts
  CHECK(table.rfind("rank,tp,pp,vp,dp,micro_batch,sequence_parallel", 0) == 0);
  const std::string recipe = slurp(yaml);
  for (const char* key : {"trainer:", "  num_nodes: 2", "  devices: 8", "  global_batch_size: 256",
                          "  tensor_model_parallel_size:", "  pipeline_model_parallel_size:",
                          "  virtual_pipeline_model_parallel_size:", "  sequence_parallel:",
                          "  num_layers: 24", "  hidden_size: 4096", "  ffn_hidden_size: 16384",
                          "  num_attention_heads: 32", "  encoder_seq_length: 2048",
                          "  activations_checkpoint_granularity:", "  optim:", "    name: "})
    CHECK(recipe.find(key) != std::string::npos);
  std::remove(csv.c_str());
  std::remove(yaml.c_str());
}

TEST_CASE("loom plan exit statuses", "[planner]") {
  CHECK(run({"--size", "5"}) == 2);                                        // missing batch
  CHECK(run({"--global-batch-size", "8"}) == 2);                           // missing model
  CHECK(run({"--size", "5", "--global-batch-size", "8", "--gpu", "Z80"}) == 2);
  CHECK(run({"--size", "5", "--global-batch-size", "8", "--recompute", "sometimes"}) == 2);
  CHECK(run({"--size", "5", "--num-layers", "4", "--global-batch-size", "8"}) == 2);
  // 175B cannot fit on one 8-GPU node: runtime failure with the binding term explained.
  CHECK(run({"--size", "175", "--global-batch-size", "8"}) == 1);
  // Any memory size is accepted, and fixing every knob evaluates one layout.
  CHECK(run({"--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length",
             "512", "--gpu-memory-gib", "12", "--global-batch-size", "16", "--tp", "2", "--pp", "2",
             "--vp", "1", "--mbs", "2", "--sp", "on", "--recompute", "selective", "--dist-opt", "on"}) == 0);
  CHECK(run({"--help"}) == 0);
}

// Runs the command with stderr redirected to a file; returns {status, stderr text}.
static std::pair<int, std::string> run_capturing(std::vector<std::string> args) {
  const std::string path = temp_path("stderr.txt");
  std::fflush(stderr);
  const int saved = dup(2);
  FILE* f = std::fopen(path.c_str(), "w");
  dup2(fileno(f), 2);
  const int status = run(std::move(args));
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::fclose(f);
  return {status, slurp(path)};
}

TEST_CASE("knob lists that leave no valid layout are told apart from layouts that do not fit", "[planner]") {
  // Global batch 8 on 8 GPUs: d·b | 8 rules out micro-batch 3 everywhere.
  auto [status, err] = run_capturing({"--size", "1", "--global-batch-size", "8", "--mbs", "3"});
  CHECK(status == 1);
  CHECK_THAT(err, Catch::Contains("no valid layout: every combination of the allowed"));
  // A valid but memory-starved plan is the other failure.
  std::tie(status, err) = run_capturing({"--size", "175", "--nodes", "1", "--global-batch-size", "8",
                                         "--gpu-memory-gib", "8"});
  CHECK(status == 1);
  CHECK_THAT(err, Catch::Contains("no layout fits in 8.0 GiB per GPU"));
  CHECK_THAT(err, !Catch::Contains("no valid layout"));
}

TEST_CASE("loom plan refuses flags that describe no layout, naming the flag", "[planner][hostile]") {
  const std::vector<std::string> base = {"--size", "1", "--global-batch-size", "8"};
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--tp", "0"}, "--tp: expected sizes >= 1, found 0"},
      {{"--pp", "2,-1"}, "--pp: expected sizes >= 1, found -1"},
      {{"--mbs", "0"}, "--mbs: expected sizes >= 1, found 0"},
      {{"--keep", "0"}, "--keep: expected an integer >= 1, found 0"},
      {{"--keep", "-3"}, "--keep: expected an integer >= 1, found -3"},
      {{"--top", "-1"}, "--top: expected an integer >= 0, found -1"},
      {{"--tokens", "-1e9"}, "--tokens: expected a number >= 0, found -1000000000"},
      {{"--tokens", "1e9", "--price", "-2"}, "--price: expected a number >= 0, found -2"},
  };
  for (const auto& [extra, message] : cases) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    auto [status, err] = run_capturing(args);
    INFO(extra.front() << " " << extra.back() << ": " << err);
    CHECK(status == 2);
    CHECK_THAT(err, Catch::Contains(message));
  }
  auto [status, err] = run_capturing({"--num-layers", "4", "--hidden-size", "1000000000", "--num-attention-heads",
                                      "8", "--global-batch-size", "8"});
  CHECK(status == 2);
  CHECK_THAT(err, Catch::Contains("--hidden-size: expected an integer in [0, 1048576], found 1000000000"));
}
