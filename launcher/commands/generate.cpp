// `loom generate --checkpoint DIR (--prompt TEXT | --prompt-file FILE) [--max-new-tokens N]
// [sampling options] [--tensor-parallel t] [--iteration N]`, or with a prompt-learning run's
// tables `loom generate --prompt-checkpoint DIR [--task NAME] --input FILE.jsonl [--output FILE]`
// (ptune/prompt_generate.h: one JSON line out per record, exact match when the record has its
// answer): text generation from a training checkpoint with a KV
// cache, tensor-parallel over t ranks (default: the checkpoint's t; any t that divides the
// heads and the FFN works, the checkpoint is resharded). Without launcher variables and t > 1
// it starts t local ranks of itself, on the run's accelerator unless --accelerator says
// otherwise (CPU ranks with Gloo, GPUs with NCCL). Prints the prompt and its continuation on
// stdout; progress and errors go to stderr. Exit 0 ok, 2 bad input, 1 runtime failure.
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "command_registry.h"
#include "error_text.h"
#include "input_errors.h"
#include "local_ranks.h"
#include "config/recipe.h"
#include "data/data_error.h"
#include "generate/generate_run.h"
#include "ptune/prompt_generate.h"
#include "launch/env_rendezvous.h"
#include "launch/local_launcher.h"
#include "train/checkpoint.h"

namespace {

using loom::generate::GenerateRequest;

// What was asked: plain generation from a prompt, or prompted generation over JSONL records.
struct GenerateJob {
  GenerateRequest request;
  std::optional<loom::ptune::PromptGenerateRequest> prompted;
  std::string output;  ///< --output (prompted): the predictions' JSONL; empty: stdout
};

// Runs as one rank (or the only process): generation over the records of --input.
int run_prompted(const GenerateJob& job, const loom::launch::RendezvousInfo& info, const std::string& who) {
  const auto start = std::chrono::steady_clock::now();
  const auto plan = loom::ptune::plan_prompt_generation(*job.prompted);
  const auto predictions = loom::ptune::prompt_generate_on_rank(info, plan, *job.prompted);
  if (info.rank != 0) return 0;
  std::ofstream file;
  if (!job.output.empty()) {
    file.open(job.output, std::ios::trunc);
    if (!file) throw std::runtime_error("--output " + job.output + ": cannot write the file");
  }
  std::ostream& out = job.output.empty() ? std::cout : file;
  int64_t scored = 0, exact = 0;
  for (const auto& p : predictions) {
    // A few byte-level tokens may end inside a character: ill-formed bytes become U+FFFD, as
    // loom serve's answers do.
    out << p.to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    scored += p.has_answer;
    exact += p.exact_match;
  }
  out.flush();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << fmt::format("{}{} records, t = {}, {:.2f} s", who, predictions.size(), plan.base.tensor_parallel, seconds);
  if (scored > 0)
    std::cerr << fmt::format("; exact match {}/{} = {:.1f}%", exact, scored, 100.0 * double(exact) / double(scored));
  std::cerr << "\n";
  return 0;
}

int run_rank(const GenerateJob& job, const loom::launch::RendezvousInfo& info) {
  const GenerateRequest& request = job.request;
  const std::string who = loom::cli::rank_prefix("generate", info);
  return loom::cli::run_rank_body(who, [&] {
    if (job.prompted) return run_prompted(job, info, who);
    const auto start = std::chrono::steady_clock::now();
    const auto plan = loom::generate::plan_generation(request);
    const auto out = loom::generate::generate_on_rank(info, plan, request);
    if (info.rank == 0) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::cout << out.text << std::endl;
      std::cerr << fmt::format("loom generate: {} prompt tokens, {} new tokens ({}), t = {}, "
                               "iteration {}, {:.2f} s\n",
                               out.prompt_ids.size(), out.result.tokens.size(),
                               loom::generate::describe(out.result.reason), plan.tensor_parallel,
                               plan.info.iteration, seconds);
    }
    return 0;
  });
}

// Largest --prompt-file read: far beyond any context window, small enough to read whole.
constexpr std::streamoff kMaxPromptFileBytes = std::streamoff{64} << 20;
// Largest --max-new-tokens: generation stops at the model's max_position_embeddings anyway.
constexpr int64_t kMaxNewTokens = int64_t{1} << 31;

// Reads --prompt-file (prompts beyond the 128 KiB an argument may hold). Throws
// std::invalid_argument naming the flag and the file.
std::string read_prompt_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::invalid_argument("--prompt-file " + path + ": cannot open the file");
  if (in.tellg() > kMaxPromptFileBytes)
    throw std::invalid_argument("--prompt-file " + path + ": expected at most 64 MiB, found " +
                                std::to_string(static_cast<long long>(in.tellg())) + " bytes");
  in.seekg(0);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// What `loom generate` was asked, as parsed (checked by check_generate_args).
struct GenerateArgs {
  GenerateJob job;
  loom::ptune::PromptGenerateRequest prompted;
  int64_t iteration = -1;
  std::string prompt_file, max_new_tokens;
  CLI::Option* checkpoint = nullptr;
  CLI::Option* prompt_checkpoint = nullptr;
  CLI::Option* input = nullptr;
};

void add_generate_flags(CLI::App& app, GenerateArgs& a) {
  GenerateRequest& request = a.job.request;
  a.max_new_tokens = std::to_string(request.max_new_tokens);
  a.checkpoint = app.add_option("--checkpoint", request.checkpoint,
                                "run directory (holding checkpoints/) or checkpoints directory "
                                "(with --prompt-checkpoint: default the base its tables name)");
  a.prompt_checkpoint = app.add_option("--prompt-checkpoint", a.prompted.prompt_checkpoint,
                                       "a loom ptune run directory (or its prompt_tables folder)");
  app.add_option("--task", a.prompted.task, "the task of --input records without \"taskname\"");
  a.input = app.add_option("--input", a.prompted.input, "JSONL records with the task template's fields");
  app.add_option("--output", a.job.output, "predictions JSONL (default: stdout)");
  app.add_flag("--no-virtual-tokens", a.prompted.without_virtual_tokens,
               "the no-prompt baseline: the records' template text without its virtual tokens");
  app.add_option("--min-new-tokens", request.min_new_tokens, "no <|endoftext|> before this many new tokens")
      ->capture_default_str();
  app.add_option("--repetition-penalty", request.sampling.repetition_penalty,
                 "divide positive (multiply negative) logits of tokens already in the context (1: off)")
      ->capture_default_str();
  app.add_option("--stop", request.stop_strings, "stop (and cut the text) at this string; repeatable");
  auto* prompt = app.add_option("--prompt", request.prompt, "text to continue (empty: start a new document)");
  auto* prompt_from = app.add_option("--prompt-file", a.prompt_file,
                                     "file whose UTF-8 text is the prompt (for prompts too long for an argument)");
  prompt->excludes(prompt_from);
  // Read as text and checked here: CLI11 accepts integers beyond 64 bits silently.
  app.add_option("--max-new-tokens", a.max_new_tokens, "tokens to generate at most")->capture_default_str();
  app.add_flag("--greedy", request.sampling.greedy, "always take the most probable token");
  app.add_option("--temperature", request.sampling.temperature, "softmax temperature (> 0)")
      ->capture_default_str();
  app.add_option("--top-k", request.sampling.top_k, "sample among the k most probable (0: all)")
      ->capture_default_str();
  app.add_option("--top-p", request.sampling.top_p,
                 "sample within the smallest set of probability >= p (1: all)")
      ->capture_default_str();
  app.add_option("--seed", request.sampling.seed, "sampling seed")->capture_default_str();
  app.add_option("--tensor-parallel", request.tensor_parallel,
                 "tensor-parallel ranks (default: the checkpoint's)");
  app.add_option("--iteration", a.iteration, "checkpoint iteration (default: the latest)");
  app.add_option("--vocab-file", request.vocab_file, "GPT-2 vocab.json (default: the recipe's)");
  app.add_option("--merge-file", request.merge_file, "GPT-2 merges.txt (default: the recipe's)");
  app.add_option("--accelerator", request.accelerator,
                 "cpu or gpu (default: the run's trainer.accelerator)");
}

// Checks the flags that go together (plain or prompted generation), reads --prompt-file and
// --max-new-tokens into the request. Throws std::invalid_argument naming the flag.
void check_generate_args(const CLI::App& app, GenerateArgs& a) {
  GenerateRequest& request = a.job.request;
  if (a.prompt_checkpoint->count() > 0) {
    if (a.input->count() == 0)
      throw std::invalid_argument("--prompt-checkpoint needs --input FILE.jsonl (records of the task's fields)");
    if (app.count("--prompt") || app.count("--prompt-file"))
      throw std::invalid_argument("--prompt and --prompt-file do not go with --prompt-checkpoint: the prompts "
                                  "are the --input records laid out by their task's template");
  } else {
    if (a.checkpoint->count() == 0)
      throw std::invalid_argument("--checkpoint DIR (or --prompt-checkpoint DIR) is required");
    if (a.input->count() > 0 || app.count("--task") || app.count("--output"))
      throw std::invalid_argument("--input, --task and --output need --prompt-checkpoint");
    if (!app.count("--prompt") && !app.count("--prompt-file"))
      throw std::invalid_argument("give the prompt with --prompt TEXT or --prompt-file FILE");
  }
  if (app.count("--prompt-file")) request.prompt = read_prompt_file(a.prompt_file);
  const std::string& max_new = a.max_new_tokens;
  const bool digits =
      !max_new.empty() && max_new.size() <= 12 && max_new.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || std::stoll(max_new) > kMaxNewTokens)
    throw std::invalid_argument("--max-new-tokens: expected an integer in [0, " + std::to_string(kMaxNewTokens) +
                                "], found '" + max_new + "'");
  request.max_new_tokens = std::stoll(max_new);
  if (app.count("--tensor-parallel") && request.tensor_parallel < 1)
    throw std::invalid_argument("--tensor-parallel: expected an integer >= 1, found " +
                                std::to_string(request.tensor_parallel));
}

// One process without a launcher: checks the input here, then runs in place (t = 1) or starts
// t local ranks of itself (their stdout is the generated text, rank 0 only).
int generate_from_one_process(const GenerateJob& job, const loom::launch::RendezvousInfo& info, int argc,
                              char** argv) {
  int t = 1;
  try {
    t = job.prompted ? loom::ptune::plan_prompt_generation(*job.prompted).base.tensor_parallel
                     : loom::generate::plan_generation(job.request).tensor_parallel;
  } catch (const std::exception& e) {
    std::cerr << "loom generate: error: " << loom::cli::error_text(e) << "\n";
    return 2;
  }
  if (t == 1) return run_rank(job, info);
  return loom::cli::run_local_ranks_for_output("generate", argc, argv, t);  // stdout: rank 0's text
}

int generate_command(int argc, char** argv) {
  CLI::App app{"Generate text from a training checkpoint (KV cache, tensor parallel)."};
  GenerateArgs args;
  add_generate_flags(app, args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  GenerateJob& job = args.job;
  if (app.count("--iteration") > 0) job.request.iteration = args.iteration;
  try {
    check_generate_args(app, args);
  } catch (const std::invalid_argument& e) {
    std::cerr << "loom generate: error: " << e.what() << "\n";
    return 2;
  }
  if (args.prompt_checkpoint->count() > 0) {
    args.prompted.generation = job.request;
    job.prompted = args.prompted;
  }

  loom::launch::RendezvousInfo info;
  try {
    info = loom::launch::rendezvous_from_env();
  } catch (const std::exception& e) {
    std::cerr << "loom generate: " << loom::cli::error_text(e) << "\n";
    return 2;
  }
  if (info.source != loom::launch::RendezvousSource::kSingleProcess) return run_rank(job, info);
  return generate_from_one_process(job, info, argc, argv);
}

}  // namespace

LOOM_REGISTER_COMMAND("generate", "generate text from a training checkpoint", generate_command);
