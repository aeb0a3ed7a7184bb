// `loom generate` end to end on a run directory (config.yaml + checkpoints/) of a tiny model
// with the GPT-2 vocabulary: planning (tokenizer from the recipe, flags checked), the library
// run, and the `loom` executable at t = 1 and, resharded, at t = 2 (two local ranks), which
// must print the same text; bad input exits with status 2 naming the flag or file.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/recipe.h"
#include "data/gpt2_tokenizer.h"
#include "generate/generate_run.h"
#include "generate_test_util.h"

using namespace loom;
using namespace loom::generate;
using namespace loom::generate::test;
namespace fs = std::filesystem;

namespace {

const std::string kVocab = std::string(LOOM_SOURCE_DIR) + "/data/gpt2-vocab.json";
const std::string kMerges = std::string(LOOM_SOURCE_DIR) + "/data/gpt2-merges.txt";
constexpr const char* kPrompt = "To be, or not to be";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A run directory: the tiny recipe resized to tiny_config(50257), with layernorm_epsilon 2e-5
// and absolute tokenizer paths, and a t = 1 checkpoint of the truth model at iteration 5.
struct RunDir {
  std::string root = temp_dir("cli");
  std::string dir = root + "/run";
  RunDir() {
    fs::create_directories(dir);
    const std::string recipe_path = std::string(LOOM_SOURCE_DIR) + "/recipes/gpt3_tiny_cpu.yaml";
    const model::GptConfig c = tiny_config(50257);
    auto recipe = config::load_recipe(
        recipe_path, {"model.num_layers=" + std::to_string(c.num_layers),
                      "model.hidden_size=" + std::to_string(c.hidden_size),
                      "model.num_attention_heads=" + std::to_string(c.num_attention_heads),
                      "model.encoder_seq_length=" + std::to_string(c.max_position_embeddings),
                      "model.layernorm_epsilon=2.0e-5", "model.tokenizer.vocab_file=" + kVocab,
                      "model.tokenizer.merge_file=" + kMerges});
    std::ofstream(dir + "/config.yaml") << config::to_yaml(recipe);
    model::GptConfig saved = c;
    saved.layernorm_epsilon = 2e-5;
    auto groups = runtime::ProcessGroups::single_process();
    save_truth_checkpoint(dir + "/checkpoints", 5, saved, 1, *groups);
  }
  ~RunDir() {
    try {
      launch::remove_tree(root);
    } catch (const std::exception&) {
    }
  }
};

const RunDir& run_dir() {
  static const RunDir run;
  return run;
}

GenerateRequest request(const std::string& checkpoint) {
  GenerateRequest r;
  r.checkpoint = checkpoint;
  r.prompt = kPrompt;
  r.max_new_tokens = 8;
  r.sampling.greedy = true;
  return r;
}

struct Exec {
  int status = -1;
  std::string out, err;
};

Exec run_loom(const std::string& args) {
  const std::string loom = std::string(LOOM_BINARY_DIR) + "/bin/loom";
  if (!fs::exists(loom)) FAIL("the loom executable is missing: build the `loom` target in " LOOM_BINARY_DIR);
  const std::string out = run_dir().root + "/stdout.txt", err = run_dir().root + "/stderr.txt";
  const int raw = std::system((loom + " generate " + args + " >" + out + " 2>" + err).c_str());
  Exec e;
  e.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  e.out = read_text(out);
  e.err = read_text(err);
  return e;
}

}  // namespace

TEST_CASE("plan_generation finds the checkpoint and the recipe's tokenizer") {
  const std::string dir = run_dir().dir;
  GeneratePlan plan = plan_generation(request(dir));
  CHECK(plan.location.checkpoints == dir + "/checkpoints");
  CHECK(plan.info.iteration == 5);
  CHECK(plan.tensor_parallel == 1);
  CHECK(plan.tokenizer.library == "megatron");
  CHECK(plan.tokenizer.vocab_file == kVocab);
  CHECK(plan.tokenizer.merge_file == kMerges);
  CHECK(plan.model_options.layernorm_epsilon == 2e-5);
  // The checkpoints folder itself: its parent's config.yaml is found.
  CHECK(plan_generation(request(dir + "/checkpoints")).tokenizer.vocab_file == kVocab);

  auto expect_error = [](GenerateRequest r, const std::string& needle) {
    REQUIRE_THROWS_AS(plan_generation(r), GenerateInputError);
    CHECK_THROWS_WITH(plan_generation(r), Catch::Contains(needle));
  };
  GenerateRequest r = request(dir);
  r.tensor_parallel = 3;
  expect_error(r, "--tensor-parallel 3");
  r = request(dir);
  r.sampling.greedy = false;
  r.sampling.top_p = 1.5;
  expect_error(r, "--top-p");
  r = request(dir);
  r.max_new_tokens = -1;
  expect_error(r, "--max-new-tokens");
  r = request(dir);
  r.vocab_file = dir + "/no-such-vocab.json";
  expect_error(r, dir + "/no-such-vocab.json");

  // A checkpoints folder with no recipe around it needs the tokenizer flags.
  const std::string bare = dir + "/bare/ckpts";
  fs::create_directories(bare);
  copy_tree(dir + "/checkpoints", bare);
  expect_error(request(bare), "--vocab-file is needed");
  r = request(bare);
  r.vocab_file = kVocab;
  r.merge_file = kMerges;
  CHECK(plan_generation(r).model_options.layernorm_epsilon == 1e-5);
}

TEST_CASE("run_generation tokenises, generates with the KV cache and decodes") {
  const std::string dir = run_dir().dir;
  GenerateRequest r = request(dir);
  GenerateOutput out = run_generation(plan_generation(r), r, runtime::Communicator::solo());

  data::Gpt2Tokenizer tok(kVocab, kMerges);
  const auto ids = tok.encode(kPrompt);
  CHECK(out.prompt_ids == std::vector<int64_t>(ids.begin(), ids.end()));
  model::GptConfig c = tiny_config(50257);
  c.layernorm_epsilon = 2e-5;
  model::GptStage truth(c, runtime::Communicator::solo());
  set_truth(truth, 0, 1);
  GenerationOptions o;
  o.max_new_tokens = 8;
  o.sampling.greedy = true;
  o.stop_token = tok.eod_id();
  const auto want = generate_tokens(truth, runtime::Communicator::solo(), out.prompt_ids, o);
  CHECK(out.result.tokens == want.tokens);
  std::vector<int32_t> new_ids(want.tokens.begin(), want.tokens.end());
  CHECK(out.text == std::string(kPrompt) + tok.decode(new_ids));

  // An empty prompt starts from <|endoftext|>; the output is the continuation alone.
  r.prompt = "";
  out = run_generation(plan_generation(r), r, runtime::Communicator::solo());
  CHECK(out.prompt_ids == std::vector<int64_t>{tok.eod_id()});
}

TEST_CASE("loom generate prints the same text at t=1 and t=2") {
  const std::string dir = run_dir().dir;
  GenerateRequest r = request(dir);
  const std::string greedy_text = run_generation(plan_generation(r), r, runtime::Communicator::solo()).text;
  r.sampling.greedy = false;
  r.sampling.temperature = 0.9;
  r.sampling.top_k = 40;
  r.sampling.top_p = 0.95;
  r.sampling.seed = 3;
  const std::string sampled_text = run_generation(plan_generation(r), r, runtime::Communicator::solo()).text;
  REQUIRE(sampled_text != greedy_text);

  const std::string base = "--checkpoint " + dir + " --prompt '" + kPrompt + "' --max-new-tokens 8";
  const std::string sampling = " --temperature 0.9 --top-k 40 --top-p 0.95 --seed 3";
  for (const char* t : {"", " --tensor-parallel 2"}) {
    INFO("t flag '" << t << "'");
    Exec g = run_loom(base + " --greedy" + t);
    INFO(g.err);
    CHECK(g.status == 0);
    CHECK(g.out == greedy_text + "\n");
    Exec s = run_loom(base + sampling + t);
    INFO(s.err);
    CHECK(s.status == 0);
    CHECK(s.out == sampled_text + "\n");
  }
}

TEST_CASE("loom generate exits 2 on bad input, naming the flag or file") {
  const std::string dir = run_dir().dir;
  Exec e = run_loom("--checkpoint " + dir + "/nowhere --prompt hi");
  CHECK(e.status == 2);
  CHECK_THAT(e.err, Catch::Contains(dir + "/nowhere"));
  e = run_loom("--checkpoint " + dir + " --prompt hi --top-p 2");
  CHECK(e.status == 2);
  CHECK_THAT(e.err, Catch::Contains("--top-p"));
  e = run_loom("--checkpoint " + dir + " --prompt hi --tensor-parallel 3");
  CHECK(e.status == 2);
  CHECK_THAT(e.err, Catch::Contains("--tensor-parallel 3"));
  e = run_loom("--prompt hi");
  CHECK(e.status == 2);
  CHECK_THAT(e.err, Catch::Contains("--checkpoint"));
  // A corrupt shard, found by the ranks after they started.
  const std::string broken = run_dir().root + "/broken";
  copy_tree(dir, broken);
  const std::string shard = broken + "/checkpoints/iter_0000005/mp_rank_00/model_optim_rng.pt";
  fs::resize_file(shard, fs::file_size(shard) - 1);
  e = run_loom("--checkpoint " + broken + " --prompt hi --tensor-parallel 2");
  CHECK(e.status == 2);
  CHECK_THAT(e.err, Catch::Contains(shard));
  CHECK(e.out.empty());
}

TEST_CASE("loom generate refuses out-of-range flags and reads long prompts from a file", "[generate][hostile]") {
  const std::string dir = run_dir().dir;
  Exec e = run_loom("--checkpoint " + dir + " --prompt hi --max-new-tokens 10000000000000000000");
  CHECK(e.status == 2);
  CHECK_THAT(e.err, Catch::Contains("--max-new-tokens: expected an integer in [0, 2147483648], found "
                                    "'10000000000000000000'"));
  e = run_loom("--checkpoint " + dir + " --prompt hi --tensor-parallel 0");
  CHECK(e.status == 2);
  CHECK_THAT(e.err, Catch::Contains("--tensor-parallel: expected an integer >= 1, found 0"));
  e = run_loom("--checkpoint " + dir);
  CHECK(e.status == 2);
  CHECK_THAT(e.err, Catch::Contains("--prompt TEXT or --prompt-file FILE"));

  // The file's text is the prompt: the same output as --prompt at t = 1 and t = 2 (whose ranks
  // read the file themselves).
  const std::string prompt_path = run_dir().root + "/prompt.txt";
  std::ofstream(prompt_path, std::ios::binary) << kPrompt;
  const Exec want = run_loom("--checkpoint " + dir + " --prompt '" + kPrompt + "' --max-new-tokens 4 --greedy");
  REQUIRE(want.status == 0);
  for (const char* t : {"", " --tensor-parallel 2"}) {
    const Exec got = run_loom("--checkpoint " + dir + " --prompt-file " + prompt_path + " --max-new-tokens 4 --greedy" + t);
    INFO(got.err);
    CHECK(got.status == 0);
    CHECK(got.out == want.out);
  }
  // 200 KB: more than one argument may hold (128 KiB), so only a file can pass it; it reaches
  // the model, which says it does not fit the context.
  std::ofstream(prompt_path, std::ios::binary) << std::string(200000, 'x') + " end";
  e = run_loom("--checkpoint " + dir + " --prompt-file " + prompt_path + " --max-new-tokens 4");
  CHECK(e.status == 2);
  CHECK_THAT(e.err, Catch::Contains("prompt"));
  e = run_loom("--checkpoint " + dir + " --prompt-file " + run_dir().root + "/none.txt");
  CHECK(e.status == 2);
  CHECK_THAT(e.err, Catch::Contains("--prompt-file " + run_dir().root + "/none.txt: cannot open the file"));
  e = run_loom("--checkpoint " + dir + " --prompt hi --prompt-file " + prompt_path);
  CHECK(e.status == 2);
}

TEST_CASE("loom generate under a launcher refuses a world that is not --tensor-parallel ranks (exit 2)") {
  // runtime::start_rank_session checks the world before any rendezvous: rank 0 of a 3-rank
  // world for a t = 1 checkpoint stops at once, naming both numbers and the flag.
  const std::string dir = run_dir().dir;
  const std::string env = "WORLD_SIZE=3 RANK=0 LOCAL_RANK=0 LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=29871 ";
  const std::string loom = std::string(LOOM_BINARY_DIR) + "/bin/loom";
  const std::string err = run_dir().root + "/world.txt";
  const int raw = std::system((env + loom + " generate --checkpoint " + dir + " --prompt hi 2>" + err).c_str());
  CHECK((WIFEXITED(raw) ? WEXITSTATUS(raw) : -1) == 2);
  CHECK_THAT(read_text(err), Catch::Contains("--tensor-parallel asks for 1 ranks, but 3 were started"));
}
