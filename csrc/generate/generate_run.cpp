#include "generate/generate_run.h"

#include <ATen/ATen.h>

#include <filesystem>

#include "config/recipe.h"
#include "data/data_error.h"
#include "data/recipe_tokenizer.h"
#include "generate/request_checks.h"

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

// The flags that need no checkpoint: the request's fields (request_checks.h, named by their
// flags), --tensor-parallel, --iteration, --accelerator. Throws GenerateInputError.
void check_flags(const GenerateRequest& request) {
  try {
    check_request_fields(request.max_new_tokens, request.min_new_tokens, request.stop_strings, 0, request.sampling,
                         generate_flag_names());
  } catch (const std::invalid_argument& e) {
    throw GenerateInputError(e.what());
  }
  if (request.tensor_parallel < 0)
    throw GenerateInputError("--tensor-parallel must be >= 1, found " +
                             std::to_string(request.tensor_parallel));
  if (request.iteration && *request.iteration < 0)
    throw GenerateInputError("--iteration must be >= 0, found " + std::to_string(*request.iteration));
  if (!request.accelerator.empty() && request.accelerator != "cpu" && request.accelerator != "gpu")
    throw GenerateInputError("--accelerator: expected cpu or gpu, found '" + request.accelerator + "'");
}

// The recipe's tokenizer with its files found (resolve_recipe_path).
data::TokenizerSpec recipe_tokenizer_files(const config::TokenizerConfig& recipe_tokenizer, const fs::path& run_dir,
                                           const fs::path& recipe_file) {
  data::TokenizerSpec spec = data::tokenizer_spec(recipe_tokenizer);
  if (spec.library == "megatron") {
    spec.vocab_file = resolve_recipe_path(spec.vocab_file, run_dir, "model.tokenizer.vocab_file", recipe_file);
    spec.merge_file = resolve_recipe_path(spec.merge_file, run_dir, "model.tokenizer.merge_file", recipe_file);
  } else {
    const std::string& file = spec.model.empty() ? spec.vocab_file : spec.model;
    spec.model = resolve_recipe_path(file, run_dir, "model.tokenizer.model", recipe_file);
  }
  return spec;
}

// The tokenizer: the recipe's (if any), its GPT-2 files replaced by the flags given.
data::TokenizerSpec plan_tokenizer(const GenerateRequest& request, const std::optional<data::TokenizerSpec>& recipe) {
  const bool vocab = !request.vocab_file.empty(), merges = !request.merge_file.empty();
  if (vocab) require_file(request.vocab_file, "--vocab-file");
  if (merges) require_file(request.merge_file, "--merge-file");
  if (!recipe && !(vocab && merges))
    throw GenerateInputError(std::string(vocab ? "--merge-file" : "--vocab-file") + " is needed: " + request.checkpoint +
                             " is not inside a run directory with a config.yaml naming the tokenizer");
  if (!vocab && !merges) return *recipe;
  data::TokenizerSpec spec;  // a GPT-2 tokenizer
  if (recipe && recipe->library == "megatron") spec = *recipe;
  else if (!(vocab && merges))
    throw GenerateInputError("--vocab-file and --merge-file name a GPT-2 tokenizer together; the run's tokenizer is " +
                             recipe->library + " ('" + recipe->model + "')");
  if (vocab) spec.vocab_file = request.vocab_file;
  if (merges) spec.merge_file = request.merge_file;
  return spec;
}

}  // namespace

GeneratePlan plan_generation(const GenerateRequest& request) {
  check_flags(request);
  GeneratePlan plan;
  plan.accelerator = request.accelerator == "gpu";
  plan.location = locate_checkpoint(request.checkpoint);
  plan.info = read_checkpoint_info(plan.location.checkpoints, request.iteration);
  refuse_adapter_checkpoint(plan.info, request.checkpoint);
  plan.tensor_parallel =
      request.tensor_parallel > 0 ? request.tensor_parallel : plan.info.layout.parallel.tp;

  // The run's recipe: model fields metadata.json does not hold, and the tokenizer.
  std::optional<data::TokenizerSpec> recipe_tokenizer;
  const fs::path run_dir(plan.location.run_dir);
  const fs::path recipe_file = run_dir.empty() ? fs::path() : run_dir / "config.yaml";
  if (!recipe_file.empty() && fs::exists(recipe_file)) {
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
    // The flags replace a GPT-2 recipe's files, which then need not exist.
    const bool flags = !request.vocab_file.empty() && !request.merge_file.empty();
    if (!flags || recipe.model.tokenizer.library != config::TokenizerLibrary::kMegatron)
      recipe_tokenizer = recipe_tokenizer_files(recipe.model.tokenizer, run_dir, recipe_file);
    else
      recipe_tokenizer = data::tokenizer_spec(recipe.model.tokenizer);
  }
  plan.tokenizer = plan_tokenizer(request, recipe_tokenizer);

  model::GptConfig config = inference_config(plan.info.layout.model_shape, plan.model_options);
  try {
    config.validate(plan.tensor_parallel);
  } catch (const std::invalid_argument& e) {
    throw GenerateInputError("--tensor-parallel " + std::to_string(plan.tensor_parallel) +
                             " does not fit the checkpoint's model: " + e.what());
  }
  return plan;
}

std::unique_ptr<data::Tokenizer> load_tokenizer(const GeneratePlan& plan) {
  std::unique_ptr<data::Tokenizer> tokenizer;
  try {
    tokenizer = data::make_tokenizer(plan.tokenizer);
  } catch (const data::DataError& e) {
    throw GenerateInputError(e.what());
  }
  const int64_t model_vocab = plan.info.layout.model_shape.vocab_size;
  if (static_cast<int64_t>(tokenizer->vocab_size()) != model_vocab)
    throw GenerateInputError("the tokenizer " + tokenizer->description() + " has " +
                             std::to_string(tokenizer->vocab_size()) +
                             " tokens, the checkpoint's model a vocabulary of " + std::to_string(model_vocab));
  return tokenizer;
}

GenerateOutput run_generation(const GeneratePlan& plan, const GenerateRequest& request,
                              const runtime::CommunicatorPtr& tp) {
  if (tp->size() != plan.tensor_parallel)
    throw std::invalid_argument("run_generation: the tensor-parallel group has " +
                                std::to_string(tp->size()) + " ranks, the plan " +
                                std::to_string(plan.tensor_parallel));
  const std::unique_ptr<data::Tokenizer> loaded = load_tokenizer(plan);
  const data::Tokenizer& tokenizer = *loaded;
  const model::GptConfig config = inference_config(plan.info.layout.model_shape, plan.model_options);

  GenerateOutput out;
  for (int32_t id : tokenizer.encode(request.prompt)) out.prompt_ids.push_back(id);
  if (out.prompt_ids.empty()) {
    // An empty prompt starts a new document: in preprocessed data, what follows an end of document.
    const int32_t start = document_start_id(tokenizer);
    if (start < 0)
      throw GenerateInputError("--prompt is empty and the tokenizer " + tokenizer.description() +
                               " has no end-of-document (or beginning-of-sequence) token");
    out.prompt_ids.push_back(start);
  }
  try {
    check_prompt_length(static_cast<int64_t>(out.prompt_ids.size()), {config.vocab_size, config.max_position_embeddings},
                        "--prompt");
  } catch (const RequestError& e) {
    throw GenerateInputError(e.what());
  }

  model::GptStage model = [&] {
    FullCheckpoint checkpoint = read_full_checkpoint(plan.location.checkpoints, plan.info);
    return load_inference_model(checkpoint, config, tp, tp->device());
  }();

  out.result = generate_tokens(model, tp, out.prompt_ids, generation_options(request, tokenizer));
  out.text = request.prompt + continuation_text(out.result.tokens, request.stop_strings, tokenizer);
  return out;
}

runtime::RankSessionRequest rank_session_request(const GeneratePlan& plan) {
  runtime::RankSessionRequest session;
  session.layout.tp = plan.tensor_parallel;
  session.world_size_source = "--tensor-parallel";
  session.device = plan.accelerator ? runtime::DeviceKind::kAccelerator : runtime::DeviceKind::kCpu;
  return session;
}

GenerateOutput generate_on_rank(const launch::RendezvousInfo& info, const GeneratePlan& plan,
                                const GenerateRequest& request) {
  const runtime::RankSession session = runtime::start_rank_session(info, rank_session_request(plan));
  GenerateOutput out = run_generation(plan, request, session.groups->tensor_ptr());
  session.groups->shutdown();
  return out;
}

namespace {

std::string decode(const std::vector<int64_t>& tokens, const data::Tokenizer& tokenizer) {
  const std::vector<int32_t> ids(tokens.begin(), tokens.end());
  return tokenizer.decode_continuation(ids);  // the tokens follow the prompt
}

}  // namespace

GenerationOptions generation_options(const GenerateRequest& request, const data::Tokenizer& tokenizer) {
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
                              const data::Tokenizer& tokenizer) {
  std::string text = decode(tokens, tokenizer);
  size_t cut = std::string::npos;
  for (const auto& stop : stop_strings) cut = std::min(cut, text.find(stop));
  if (cut != std::string::npos) text.resize(cut);
  return text;
}

}  // namespace loom::generate
