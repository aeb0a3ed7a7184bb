// Checkpoints written under (t=2, p=2) and (t=1, p=2, v=2) load as exactly the model that was
// saved, at t = 1 and (resharded) at t = 2; generation from them gives the same tokens at
// t = 1 and t = 2 (greedy and sampling), is deterministic per seed, and top-k = 1 is greedy.
// Broken checkpoints fail with errors naming the file.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "generate/checkpoint_reader.h"
#include "generate/model_loader.h"
#include "generate/token_generator.h"
#include "generate_test_util.h"
#include "harness/multiprocess.h"
#include "harness/worker_groups.h"
#include "launch/env_rendezvous.h"

using namespace loom;
using namespace loom::generate;
using namespace loom::generate::test;
namespace fs = std::filesystem;

namespace {

const std::vector<int64_t> kPrompt = {5, 17, 3, 99, 42};

// The option sets every layout must agree on.
std::vector<GenerationOptions> option_sets() {
  std::vector<GenerationOptions> out;
  auto add = [&](bool greedy, double temperature, int64_t top_k, double top_p, uint64_t seed) {
    GenerationOptions o;
    o.max_new_tokens = 16;
    o.sampling.greedy = greedy;
    o.sampling.temperature = temperature;
    o.sampling.top_k = top_k;
    o.sampling.top_p = top_p;
    o.sampling.seed = seed;
    out.push_back(o);
  };
  add(true, 1.0, 0, 1.0, 0);     // greedy
  add(false, 0.9, 0, 1.0, 1);    // temperature
  add(false, 0.8, 20, 0.9, 2);   // top-k and top-p
  add(false, 1.2, 50, 1.0, 3);   // top-k
  add(false, 1.0, 0, 0.6, 4);    // top-p
  add(false, 1.0, 1, 1.0, 5);    // top-k = 1: greedy
  return out;
}

std::string ids_line(const std::vector<int64_t>& ids) {
  std::ostringstream s;
  for (int64_t id : ids) s << id << ' ';
  return s.str();
}

std::vector<std::string> generate_all(const model::GptStage& model,
                                      const runtime::CommunicatorPtr& tp) {
  std::vector<std::string> out;
  for (const auto& o : option_sets()) out.push_back(ids_line(generate_tokens(model, tp, kPrompt, o).tokens));
  return out;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

model::GptStage load_model(const std::string& dir, const runtime::CommunicatorPtr& tp) {
  CheckpointInfo info = read_checkpoint_info(dir);
  FullCheckpoint ckpt = read_full_checkpoint(dir, info);
  return load_inference_model(ckpt, inference_config(info.layout.model_shape), tp);
}

// Every parameter equals its slice of the truth (rounded to `saved`, the dtype the checkpoint
// was written in) exactly; returns the first mismatch.
std::string compare_with_truth(const model::GptStage& stage, int rank, int t,
                               at::ScalarType saved = at::kFloat) {
  for (const auto& p : stage.parameters()) {
    at::Tensor full = truth_value(p.name, global_shape(p, t), stage.config().vocab_size,
                                  p.word_embedding);
    at::Tensor slice = p.tensor_parallel() ? model::shard(full, p.partition_dim, rank, t) : full;
    if (!at::equal(p.tensor.detach(), slice.to(saved).to(at::kFloat))) return p.name;
  }
  return "";
}

// Temporary folders of this test process, removed when it exits.
struct TempRoot {
  std::string dir = temp_dir("checkpoints");
  ~TempRoot() {
    try {
      launch::remove_tree(dir);
    } catch (const std::exception&) {
    }
  }
};

std::string shared_dir() {
  static const TempRoot root;
  return root.dir;
}

// The (t=2, p=2) checkpoint, written once by four ranks.
std::string checkpoint_t2p2() {
  static const std::string dir = [] {
    const std::string d = shared_dir() + "/t2p2";
    auto r = loom::test::run_ranks("generate_save_truth", 4,
                                   {{"GEN_DIR", d}, {"GEN_T", "2"}, {"GEN_P", "2"}, {"GEN_V", "1"}});
    if (r.exit_code() != 0) throw std::runtime_error("saving the t2p2 checkpoint: " + r.summary());
    return d;
  }();
  return dir;
}

runtime::CommunicatorPtr solo() { return runtime::Communicator::solo(); }

}  // namespace

LOOM_WORKER("generate_save_truth") {
  auto groups = loom::test::worker_groups(loom::test::env_int("GEN_T"), loom::test::env_int("GEN_P"));
  save_truth_checkpoint(loom::test::env_str("GEN_DIR"), 7, tiny_config(),
                        loom::test::env_int("GEN_V"), *groups);
  groups->shutdown();
}

LOOM_WORKER("generate_from_checkpoint_t2") {
  auto groups = loom::test::worker_groups(2);
  auto tp = groups->tensor_ptr();
  model::GptStage model = load_model(loom::test::env_str("GEN_DIR"), tp);
  const std::string bad = compare_with_truth(model, tp->rank(), 2);
  LOOM_WCHECK(bad.empty(), + ("parameter " + bad + " differs from the saved model"));
  std::ofstream out(loom::test::env_str("GEN_OUT") + ".rank" + std::to_string(tp->rank()));
  for (const auto& line : generate_all(model, tp)) out << line << "\n";
  groups->shutdown();
}

TEST_CASE("checkpoints of any layout load as the saved model at t=1") {
  model::GptStage t2p2 = load_model(checkpoint_t2p2(), solo());
  CHECK(compare_with_truth(t2p2, 0, 1) == "");

  const std::string v2 = shared_dir() + "/t1p2v2";
  auto r = loom::test::run_ranks("generate_save_truth", 2,
                                 {{"GEN_DIR", v2}, {"GEN_T", "1"}, {"GEN_P", "2"}, {"GEN_V", "2"}});
  INFO(r.summary());
  REQUIRE(r.exit_code() == 0);
  CHECK(fs::exists(v2 + "/iter_0000007/mp_rank_00_001/model_optim_rng.pt"));
  model::GptStage interleaved = load_model(v2, solo());
  CHECK(compare_with_truth(interleaved, 0, 1) == "");
}

TEST_CASE("a bf16 checkpoint loads as float32 parameters of the saved values") {
  const std::string dir = shared_dir() + "/bf16";
  model::GptConfig c = tiny_config();
  c.params_dtype = Precision::kBf16;
  {
    auto groups = runtime::ProcessGroups::single_process();
    save_truth_checkpoint(dir, 2, c, 1, *groups);
  }
  model::GptStage loaded = load_model(dir, solo());
  CHECK(loaded.parameters().front().tensor.scalar_type() == at::kFloat);
  CHECK(compare_with_truth(loaded, 0, 1, at::kBFloat16) == "");
  CHECK(compare_with_truth(loaded, 0, 1) != "");  // the rounding is visible
}

TEST_CASE("generation from a resharded checkpoint is the same at t=1 and t=2") {
  const std::string dir = checkpoint_t2p2();
  model::GptStage truth(tiny_config(), solo());
  set_truth(truth, 0, 1);
  const auto want = generate_all(truth, solo());
  const auto got_t1 = generate_all(load_model(dir, solo()), solo());
  CHECK(got_t1 == want);

  const std::string out = shared_dir() + "/ids_t2";
  auto r = loom::test::run_ranks("generate_from_checkpoint_t2", 2, {{"GEN_DIR", dir}, {"GEN_OUT", out}});
  INFO(r.summary());
  REQUIRE(r.exit_code() == 0);
  CHECK(read_lines(out + ".rank0") == want);
  CHECK(read_lines(out + ".rank1") == want);

  // The option sets really differ: sampling is not greedy, top-k = 1 is.
  REQUIRE(want.size() == 6);
  CHECK(want[5] == want[0]);
  CHECK(want[1] != want[0]);
  CHECK(want[2] != want[0]);
}

TEST_CASE("generation is deterministic per seed and stops where asked") {
  model::GptStage model(tiny_config(), solo());
  set_truth(model, 0, 1);
  GenerationOptions o;
  o.max_new_tokens = 16;
  o.sampling.temperature = 1.0;
  o.sampling.seed = 11;
  const auto a = generate_tokens(model, solo(), kPrompt, o).tokens;
  const auto b = generate_tokens(model, solo(), kPrompt, o).tokens;
  CHECK(a.size() == 16);
  CHECK(a == b);
  o.sampling.seed = 12;
  CHECK(generate_tokens(model, solo(), kPrompt, o).tokens != a);

  // Stop token: generation ends before it, excluding it.
  o.sampling.seed = 11;
  o.stop_token = a[3];
  const auto stopped = generate_tokens(model, solo(), kPrompt, o);
  CHECK(stopped.reason == StopReason::kStopToken);
  const auto first = std::find(a.begin(), a.end(), a[3]) - a.begin();
  CHECK(stopped.tokens == std::vector<int64_t>(a.begin(), a.begin() + first));

  // Context: a 20-token prompt leaves positions 20..23, i.e. 5 more tokens.
  GenerationOptions g;
  g.max_new_tokens = 10;
  g.sampling.greedy = true;
  std::vector<int64_t> long_prompt(20, 7);
  const auto full = generate_tokens(model, solo(), long_prompt, g);
  CHECK(full.reason == StopReason::kContextFull);
  CHECK(full.tokens.size() == 5);
  CHECK_THROWS_AS(generate_tokens(model, solo(), std::vector<int64_t>(25, 1), g), std::invalid_argument);
  CHECK_THROWS_AS(generate_tokens(model, solo(), {}, g), std::invalid_argument);
  CHECK_THROWS_AS(generate_tokens(model, solo(), {100}, g), std::invalid_argument);
}

TEST_CASE("broken or missing checkpoints fail naming the file") {
  const std::string base = shared_dir() + "/broken";
  fs::create_directories(base);
  const std::string good = base + "/good";
  {
    auto groups = runtime::ProcessGroups::single_process();
    save_truth_checkpoint(good, 3, tiny_config(), 1, *groups);
  }
  REQUIRE(compare_with_truth(load_model(good, solo()), 0, 1) == "");
  const std::string shard_rel = "/iter_0000003/mp_rank_00/model_optim_rng.pt";
  auto broken_copy = [&](const std::string& name) {
    const std::string d = base + "/" + name;
    copy_tree(good, d);
    return d;
  };
  using train::CheckpointError;

  CHECK_THROWS_WITH(locate_checkpoint(base + "/nowhere"), Catch::Contains(base + "/nowhere"));
  fs::create_directories(base + "/empty");
  CHECK_THROWS_WITH(locate_checkpoint(base + "/empty"), Catch::Contains("no checkpoint in"));
  CHECK(locate_checkpoint(good).checkpoints == good);
  CHECK_THROWS_WITH(read_checkpoint_info(good, 99), Catch::Contains("iter_0000099"));

  const std::string truncated = broken_copy("truncated");
  fs::resize_file(truncated + shard_rel, fs::file_size(truncated + shard_rel) - 10);
  CHECK_THROWS_WITH(load_model(truncated, solo()),
                    Catch::Contains(truncated + shard_rel) && Catch::Contains("truncated"));

  const std::string corrupt = broken_copy("corrupt");
  {
    std::fstream f(corrupt + shard_rel, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(200);
    const char c = static_cast<char>(f.get());
    f.seekp(200);
    f.put(static_cast<char>(~c));
  }
  CHECK_THROWS_WITH(load_model(corrupt, solo()), Catch::Contains("corrupt"));

  const std::string missing = broken_copy("missing");
  fs::remove(missing + shard_rel);
  CHECK_THROWS_WITH(load_model(missing, solo()),
                    Catch::Contains(missing + shard_rel) && Catch::Contains("missing"));

  const std::string no_meta = broken_copy("no_meta");
  std::ofstream(no_meta + "/iter_0000003/metadata.json") << "{ not json";
  CHECK_THROWS_WITH(read_checkpoint_info(no_meta), Catch::Contains("metadata.json"));

  const std::string bad_tracker = broken_copy("bad_tracker");
  std::ofstream(bad_tracker + "/latest_checkpointed_iteration.txt") << "12\n";
  CHECK_THROWS_AS(read_checkpoint_info(bad_tracker), CheckpointError);

  // metadata.json describing another model: the parameters do not fit it.
  const std::string other = broken_copy("other_shape");
  {
    std::ifstream in(other + "/iter_0000003/metadata.json");
    nlohmann::json meta = nlohmann::json::parse(in);
    meta["layout"]["model"]["ffn_hidden_size"] = 64;
    std::ofstream(other + "/iter_0000003/metadata.json") << meta.dump();
  }
  CHECK_THROWS_WITH(load_model(other, solo()), Catch::Contains("mlp") && Catch::Contains("shape"));
}
