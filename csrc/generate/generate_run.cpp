#include "generate/generate_run.h"

#include <ATen/ATen.h>

#include <filesystem>

#include "config/recipe.h"
#include "data/gpt2_tokenizer.h"

namespace fs = std::filesystem;

namespace loom::generate {

namespace {

// A tokenizer path from the recipe: as written (relative to the working directory, as the
// trainer read it), else relative to the run directory.
std::string resolve_recipe_path(const std::string& path, const fs::path& run_dir,
                                const std::string& field, const fs::path& recipe_file) {
  if (path.empty())
    throw GenerateInputError(recipe_file.string() + ": " + field +
                             " is empty; pass --vocab-file and --merge-file");
  if (fs::exists(path)) return path;
  const fs::path p(path);
  if (p.is_relative() && fs::exists(run_dir / p)) return (run_dir / p).string();
  throw GenerateInputError(recipe_file.string() + ": " + field + " '" + path +
                           "' does not exist (relative to the working directory or " +
                           run_dir.string() + "); pass --vocab-file and --merge-file");
}

void require_file(const std::string& path, const std::string& flag) {
  if (!fs::is_regular_file(path))
    throw GenerateInputError(flag + " " + path + " does not exist or is not a file");
}

}  // namespace

GeneratePlan plan_generation(const GenerateRequest& request) {
  if (request.max_new_tokens < 0)
    throw GenerateInputError("--max-new-tokens must be >= 0, found " +
                             std::to_string(request.max_new_tokens));
  if (request.tensor_parallel < 0)
    throw GenerateInputError("--tensor-parallel must be >= 1, found " +
                             std::to_string(request.tensor_parallel));
  if (request.min_new_tokens < 0)
    throw GenerateInputError("--min-new-tokens must be >= 0, found " + std::to_string(request.min_new_tokens));
  for (const auto& stop : request.stop_strings)
    if (stop.empty()) throw GenerateInputError("--stop: expected a non-empty string");
  if (request.iteration && *request.iteration < 0)
    throw GenerateInputError("--iteration must be >= 0, found " + std::to_string(*request.iteration));
  try {
    validate(request.sampling);
  } catch (const std::invalid_argument& e) {
    throw GenerateInputError(e.what());
  }

  if (!request.accelerator.empty() && request.accelerator != "cpu" && request.accelerator != "gpu")
    throw GenerateInputError("--accelerator: expected cpu or gpu, found '" + request.accelerator + "'");

  GeneratePlan plan;
  plan.accelerator = request.accelerator == "gpu";
  plan.location = locate_checkpoint(request.checkpoint);
  plan.info = read_checkpoint_info(plan.location.checkpoints, request.iteration);
  plan.tensor_parallel =
      request.tensor_parallel > 0 ? request.tensor_parallel : plan.info.layout.tensor_parallel;

  // The run's recipe: model fields metadata.json does not hold, and the tokenizer files.
  std::string recipe_vocab, recipe_merges;
  const fs::path recipe_file = plan.location.run_dir.empty()
                                   ? fs::path()
                                   : fs::path(plan.location.run_dir) / "config.yaml";
  const bool have_recipe = !recipe_file.empty() && fs::exists(recipe_file);
  if (have_recipe) {
    config::Recipe recipe;
    try {
      recipe = config::load_recipe(recipe_file.string());
    } catch (const std::exception& e) {
      throw GenerateInputError("cannot read the run's recipe " + recipe_file.string() + ":\n" +
                               e.what());
    }
    plan.model_options.layernorm_epsilon = recipe.model.layernorm_epsilon;
    plan.model_options.make_vocab_size_divisible_by = recipe.model.make_vocab_size_divisible_by;
    if (request.accelerator.empty())
      plan.accelerator = recipe.trainer.accelerator == config::Accelerator::kGpu;
    recipe_vocab = recipe.model.tokenizer.vocab_file;
    recipe_merges = recipe.model.tokenizer.merge_file;
  }

  const fs::path run_dir(plan.location.run_dir);
  for (auto [flag, given, from_recipe, field, out] :
       {std::tuple{"--vocab-file", &request.vocab_file, &recipe_vocab, "model.tokenizer.vocab_file",
                   &plan.vocab_file},
        std::tuple{"--merge-file", &request.merge_file, &recipe_merges,
                   "model.tokenizer.merge_file", &plan.merge_file}}) {
    if (!given->empty()) {
      require_file(*given, flag);
      *out = *given;
    } else if (have_recipe) {
      *out = resolve_recipe_path(*from_recipe, run_dir, field, recipe_file);
    } else {
      throw GenerateInputError(std::string(flag) + " is needed: " + request.checkpoint +
                               " is not inside a run directory with a config.yaml naming the "
                               "tokenizer");
    }
  }

  model::GptConfig config = inference_config(plan.info.layout.model_shape, plan.model_options);
  try {
    config.validate(plan.tensor_parallel);
  } catch (const std::invalid_argument& e) {
    throw GenerateInputError("--tensor-parallel " + std::to_string(plan.tensor_parallel) +
                             " does not fit the checkpoint's model: " + e.what());
  }
  return plan;
}

GenerateOutput run_generation(const GeneratePlan& plan, const GenerateRequest& request,
                              const runtime::CommunicatorPtr& tp) {
  if (tp->size() != plan.tensor_parallel)
    throw std::invalid_argument("run_generation: the tensor-parallel group has " +
                                std::to_string(tp->size()) + " ranks, the plan " +
                                std::to_string(plan.tensor_parallel));
  data::Gpt2Tokenizer tokenizer(plan.vocab_file, plan.merge_file);
  const model::GptConfig config = inference_config(plan.info.layout.model_shape, plan.model_options);
  if (static_cast<int64_t>(tokenizer.vocab_size()) != config.vocab_size)
    throw GenerateInputError("the tokenizer " + plan.vocab_file + " has " +
                             std::to_string(tokenizer.vocab_size()) +
                             " tokens, the checkpoint's model a vocabulary of " +
                             std::to_string(config.vocab_size));

  GenerateOutput out;
  for (int32_t id : tokenizer.encode(request.prompt)) out.prompt_ids.push_back(id);
  if (out.prompt_ids.empty()) {
    if (tokenizer.eod_id() < 0)
      throw GenerateInputError("--prompt is empty and the vocabulary has no <|endoftext|>");
    out.prompt_ids.push_back(tokenizer.eod_id());
  }
  if (static_cast<int64_t>(out.prompt_ids.size()) > config.max_position_embeddings)
    throw GenerateInputError("--prompt is " + std::to_string(out.prompt_ids.size()) +
                             " tokens long; the model takes at most max_position_embeddings = " +
                             std::to_string(config.max_position_embeddings));

  model::GptStage model = [&] {
    FullCheckpoint checkpoint = read_full_checkpoint(plan.location.checkpoints, plan.info);
    return load_inference_model(checkpoint, config, tp, tp->device());
  }();

  out.result = generate_tokens(model, tp, out.prompt_ids, generation_options(request, tokenizer));
  out.text = request.prompt + continuation_text(out.result.tokens, request.stop_strings, tokenizer);
  return out;
}

namespace {

std::string decode(const std::vector<int64_t>& tokens, const data::Gpt2Tokenizer& tokenizer) {
  const std::vector<int32_t> ids(tokens.begin(), tokens.end());
  return tokenizer.decode(ids);
}

}  // namespace

GenerationOptions generation_options(const GenerateRequest& request, const data::Gpt2Tokenizer& tokenizer) {
  GenerationOptions options;
  options.max_new_tokens = request.max_new_tokens;
  options.min_new_tokens = request.min_new_tokens;
  options.stop_token = tokenizer.eod_id();
  options.sampling = request.sampling;
  if (!request.stop_strings.empty()) {
    options.stop_when = [&request, &tokenizer](const std::vector<int64_t>& tokens) {
      const std::string text = decode(tokens, tokenizer);
      for (const auto& stop : request.stop_strings)
        if (text.find(stop) != std::string::npos) return true;
      return false;
    };
  }
  return options;
}

std::string continuation_text(const std::vector<int64_t>& tokens, const std::vector<std::string>& stop_strings,
                              const data::Gpt2Tokenizer& tokenizer) {
  std::string text = decode(tokens, tokenizer);
  size_t cut = std::string::npos;
  for (const auto& stop : stop_strings) cut = std::min(cut, text.find(stop));
  if (cut != std::string::npos) text.resize(cut);
  return text;
}

}  // namespace loom::generate
