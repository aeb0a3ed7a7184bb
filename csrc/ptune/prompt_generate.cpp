#include "ptune/prompt_generate.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "generate/model_loader.h"
#include "prompt_data/prompt_dataset.h"
#include "ptune/frozen_base.h"

namespace fs = std::filesystem;

namespace loom::ptune {

using generate::GenerateInputError;

nlohmann::json PromptPrediction::to_json() const {
  nlohmann::json j = record;
  j["taskname"] = task;
  j["prediction"] = prediction;
  if (has_answer) j["exact_match"] = exact_match;
  return j;
}

PromptGeneratePlan plan_prompt_generation(const PromptGenerateRequest& request) {
  PromptGeneratePlan plan;
  try {
    plan.tables = read_prompt_tables(request.prompt_checkpoint);
  } catch (const std::invalid_argument& e) {
    throw GenerateInputError(std::string("--prompt-checkpoint: ") + e.what());
  }
  if (!request.task.empty() && !plan.tables.find(request.task))
    throw GenerateInputError(fmt::format("--task: expected one of the tasks of {} ({}), found '{}'",
                                         request.prompt_checkpoint, plan.tables.task_list(), request.task));
  if (!fs::is_regular_file(request.input))
    throw GenerateInputError("--input " + request.input + " does not exist or is not a file");
  generate::GenerateRequest base = request.generation;
  if (base.checkpoint.empty()) {
    if (!plan.tables.base.contains("checkpoints"))
      throw GenerateInputError("--prompt-checkpoint: the tables do not name their base; pass --checkpoint");
    base.checkpoint = plan.tables.base["checkpoints"].get<std::string>();
    base.iteration = plan.tables.base.value("iteration", int64_t{0});
  }
  // The tuning run's tokenizer, unless the flags name one (or its files are gone).
  const std::optional<data::TokenizerSpec> recorded = recorded_tokenizer(plan.tables.base);
  const bool flags = !base.vocab_file.empty() || !base.merge_file.empty();
  if (recorded && !flags && recorded->library == "megatron") {
    base.vocab_file = recorded->vocab_file;
    base.merge_file = recorded->merge_file;
  }
  plan.base = generate::plan_generation(base);
  if (recorded && !flags) plan.base.tokenizer = *recorded;
  const int64_t hidden = plan.base.info.layout.model_shape.hidden_size;
  for (const auto& t : plan.tables.tasks)
    if (t.vectors.size(1) != hidden)
      throw GenerateInputError(fmt::format("--prompt-checkpoint: task '{}' has vectors of size {}, the base model {}",
                                           t.spec.taskname, t.vectors.size(1), hidden));
  return plan;
}

std::vector<PromptPrediction> run_prompt_generation(const PromptGeneratePlan& plan, const PromptGenerateRequest& request,
                                                    const runtime::CommunicatorPtr& tp) {
  const auto& bp = plan.base;
  const std::unique_ptr<data::Tokenizer> loaded = generate::load_tokenizer(bp);  // the base run's (any library)
  const data::Tokenizer& tokenizer = *loaded;
  const model::GptConfig config = generate::inference_config(bp.info.layout.model_shape, bp.model_options);
  std::vector<config::TaskTemplate> specs;
  for (const auto& t : plan.tables.tasks) specs.push_back(t.spec);
  const auto templates = prompt_data::parse_task_templates(specs, config.max_position_embeddings);
  prompt_data::ExampleOptions options = prompt_data::example_options(tokenizer);
  options.add_bos = plan.tables.add_bos;
  options.max_seq_length = config.max_position_embeddings;
  options.for_inference = true;
  const prompt_data::PromptDataset dataset({request.input}, templates, tokenizer, options, request.task);

  model::GptStage model = [&] {
    generate::FullCheckpoint checkpoint = generate::read_full_checkpoint(bp.location.checkpoints, bp.info);
    // The tables only mean something on the base they were tuned on.
    const auto& base = plan.tables.base;
    if (base.contains("checkpoint_digest") && base["checkpoint_digest"] != checkpoint_digest(checkpoint))
      throw GenerateInputError(fmt::format("--prompt-checkpoint: the tables were tuned on the base with checkpoint "
                                           "digest {}; {} iteration {} is another model",
                                           base["checkpoint_digest"].get<std::string>(), bp.location.checkpoints,
                                           bp.info.iteration));
    return generate::load_inference_model(checkpoint, config, tp, tp->device());
  }();
  const generate::GenerationOptions gen = generate::generation_options(request.generation, tokenizer);
  const auto on_device = at::TensorOptions().dtype(at::kLong).device(tp->device());
  std::vector<PromptPrediction> out;
  for (int64_t i = 0; i < dataset.size(); ++i) {
    const auto& ex = dataset[i];
    const auto& table = plan.tables.tasks[static_cast<size_t>(ex.task)];
    std::vector<int64_t> positions, text_only;
    for (int64_t j = 0; j < ex.size(); ++j) {
      if (ex.is_virtual[static_cast<size_t>(j)])
        positions.push_back(j);
      else
        text_only.push_back(ex.tokens[static_cast<size_t>(j)]);
    }
    model::PromptSplice splice;
    if (!request.without_virtual_tokens) {
      splice.seq_index = at::tensor(positions, on_device);
      splice.batch_index = at::zeros({static_cast<int64_t>(positions.size())}, on_device);
      splice.vectors = table.vectors.to(tp->device());
    }
    const auto result =
        generate::generate_tokens(model, tp, request.without_virtual_tokens ? text_only : ex.tokens, gen, splice);

    PromptPrediction p;
    p.source = dataset.source(i);
    p.task = table.spec.taskname;
    for (const auto& [k, v] : dataset.record(i)) p.record[k] = v;
    p.prediction = generate::continuation_text(result.tokens, request.generation.stop_strings, tokenizer);
    const auto& answer_field = table.spec.answer_field;
    p.has_answer = answer_field && dataset.record(i).count(*answer_field) > 0;
    // The rule of validation (answer_metrics.h): the answer's tokens first, then, when the run
    // trained answers to end with <|endoftext|>, the stop there.
    const auto& answer = ex.answer_tokens;
    if (plan.tables.add_eos)
      p.exact_match = p.has_answer && result.tokens == answer && result.reason == generate::StopReason::kStopToken;
    else
      p.exact_match = p.has_answer && result.tokens.size() >= answer.size() &&
                      std::equal(answer.begin(), answer.end(), result.tokens.begin());
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<PromptPrediction> prompt_generate_on_rank(const launch::RendezvousInfo& info,
                                                      const PromptGeneratePlan& plan,
                                                      const PromptGenerateRequest& request) {
  const runtime::RankSession session = runtime::start_rank_session(info, generate::rank_session_request(plan.base));
  std::vector<PromptPrediction> predictions = run_prompt_generation(plan, request, session.groups->tensor_ptr());
  session.groups->shutdown();
  return predictions;
}

}  // namespace loom::ptune
