// Prompt-learning recipes (`loom ptune`, docs/design/ptuning.md): their own keys (the base, the
// tasks, JSONL data) and none of a pretraining recipe's model shape, NeMo's spellings, located
// errors, and a resolved YAML that loads back.
#include <catch2/catch.hpp>

#include <algorithm>

#include "config/schema.h"
#include "config_test_util.h"

using namespace loom::config;

namespace {

const char* kPromptRecipe = R"(trainer:
  devices: 2
  accelerator: cpu
  precision: 32
  max_steps: 20
model:
  micro_batch_size: 2
  global_batch_size: 8
  tensor_model_parallel_size: 2
  language_model_path: runs/gpt3_tiny_cpu
  virtual_prompt_style: p-tuning
  task_templates:
    - taskname: speaker
      prompt_template: "<|VIRTUAL_PROMPT_0|> {line} Speaker:{speaker}"
      prompt_template_fields: [line, speaker]
      total_virtual_tokens: 10
      virtual_token_splits: [10]
      answer_only_loss: true
      answer_field: speaker
      truncate_field: line
    - taskname: play
      prompt_template: "<|VIRTUAL_PROMPT_0|> {line}<|VIRTUAL_PROMPT_1|> Play:{play}"
      prompt_template_fields: [line, play]
      total_virtual_tokens: 6
      virtual_token_splits: [4, 2]
  p_tuning:
    encoder_type: lstm
    encoder_hidden: 64
  data:
    train_ds: [data/ptune/train.jsonl]
    validation_ds: [data/ptune/valid.jsonl]
  optim:
    lr: 1.0e-4
)";

Recipe load_prompt(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return load_recipe_from_string(yaml, "p.yaml", overrides, RecipeKind::kPromptLearning);
}

std::vector<std::string> prompt_errors(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    load_prompt(yaml, overrides);
  } catch (const RecipeError& e) {
    return e.errors;
  }
  return {};
}

bool has(const std::vector<std::string>& lines, const std::string& text) {
  const bool found =
      std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(text) != std::string::npos; });
  if (!found) {
    std::string all;
    for (const auto& l : lines) all += "\n  " + l;
    UNSCOPED_INFO("errors were:" << all);
  }
  return found;
}

}  // namespace

TEST_CASE("a prompt-learning recipe reads NeMo's keys", "[config][ptune]") {
  const Recipe r = load_prompt(kPromptRecipe);
  CHECK(r.kind == RecipeKind::kPromptLearning);
  const auto& p = r.model.prompt;
  CHECK(p.language_model_path == "runs/gpt3_tiny_cpu");
  CHECK(p.virtual_prompt_style == VirtualPromptStyle::kPTuning);
  REQUIRE(p.task_templates.size() == 2);
  CHECK(p.task_templates[0].taskname == "speaker");
  CHECK(p.task_templates[0].prompt_template_fields == std::vector<std::string>{"line", "speaker"});
  CHECK(p.task_templates[0].answer_field == std::optional<std::string>("speaker"));
  CHECK(p.task_templates[0].answer_only_loss);
  CHECK(p.task_templates[1].virtual_token_splits == std::vector<int64_t>{4, 2});
  CHECK_FALSE(p.task_templates[1].answer_field);
  CHECK(p.new_tasks == std::vector<std::string>{"speaker", "play"});  // derived: every task
  CHECK(p.p_tuning.encoder_type == PromptEncoderType::kLstm);
  CHECK(p.p_tuning.encoder_hidden == std::optional<int64_t>(64));
  CHECK(r.model.data.train_ds == std::vector<std::string>{"data/ptune/train.jsonl"});
  CHECK(r.model.data.add_eos);
  CHECK_FALSE(r.model.data.add_bos);
  CHECK(r.model.tokenizer.vocab_file.empty());  // from the base's run
}

TEST_CASE("a prompt-learning recipe has no model shape or pretraining data of its own", "[config][ptune]") {
  auto errors = prompt_errors(std::string(kPromptRecipe) + "  num_layers: 4\n");
  REQUIRE(errors.size() == 1);
  CHECK(errors[0] == "p.yaml:34:3: model.num_layers: not a key of a prompt-learning recipe: the model's shape "
                     "comes from the base checkpoint (model.language_model_path)");
  // And a pretraining recipe knows none of the prompt keys.
  errors = test::errors_of(std::string(test::kMinimalRecipe) + "  language_model_path: x\n");
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0], Catch::Contains("model.language_model_path: a key of prompt-learning recipes (loom ptune), "
                                        "not of a pretraining recipe"));
}

TEST_CASE("task templates: unknown and missing keys are located", "[config][ptune]") {
  std::string yaml = kPromptRecipe;
  yaml.replace(yaml.find("      truncate_field: line\n"), 27, "      truncate_feild: line\n");
  auto errors = prompt_errors(yaml);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0] == "p.yaml:20:7: model.task_templates[0].truncate_feild: unknown key of a task template, found "
                     "'truncate_feild' (did you mean 'truncate_field'?)");
  yaml = kPromptRecipe;
  yaml.replace(yaml.find("      total_virtual_tokens: 6\n"), 30, "");
  errors = prompt_errors(yaml);
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0], Catch::Contains("model.task_templates[1].total_virtual_tokens: expected a value (required key "
                                        "of a task template)"));
}

TEST_CASE("prompt-learning rules name the field", "[config][ptune]") {
  CHECK(has(prompt_errors(kPromptRecipe, {"model.new_tasks=[speaker, poem]"}),
            "model.new_tasks: expected names of model.task_templates (speaker, play), found 'poem'"));
  CHECK(has(prompt_errors(kPromptRecipe, {"model.new_tasks=[speaker]", "model.existing_tasks=[play]"}),
            "model.restore_path (not set; default): expected the earlier prompt-learning run that holds "
            "model.existing_tasks, found null"));
  CHECK(has(prompt_errors(kPromptRecipe, {"model.existing_tasks=[speaker]", "model.restore_path=runs/x"}),
            "model.existing_tasks: expected tasks not trained again, found 'speaker' in new_tasks too"));
  CHECK(has(prompt_errors(kPromptRecipe, {"model.p_tuning.encoder_type=mlp", "model.p_tuning.num_layers=1"}),
            "model.p_tuning.num_layers: expected an integer >= 2, found 1"));
  CHECK(has(prompt_errors(kPromptRecipe, {"model.virtual_prompt_style=prompt-tuning",
                                          "model.prompt_tuning.new_prompt_init_methods=[text]"}),
            "model.prompt_tuning.new_prompt_init_text (not set; default): expected an init text for new task 0 "
            "(its method is text)"));
  CHECK(has(prompt_errors(kPromptRecipe, {"model.prompt_tuning.new_prompt_init_methods=[text, random, text]"}),
            "model.prompt_tuning.new_prompt_init_methods: expected one entry, or one per new task (2), found 3"));
  CHECK(has(prompt_errors(kPromptRecipe, {"model.data.train_ds=[]"}),
            "model.data.train_ds: expected at least one JSONL file of training records, found none"));
  CHECK(has(prompt_errors(kPromptRecipe, {"model.virtual_prompt_style=ptuning"}),
            "model.virtual_prompt_style: expected one of p-tuning | prompt-tuning, found ptuning"));
  // Layout rules that need no model shape still apply.
  CHECK(has(prompt_errors(kPromptRecipe, {"trainer.devices=3"}), "trainer.devices: expected the world size"));
}

TEST_CASE("a resolved prompt-learning recipe loads back to the same recipe", "[config][ptune]") {
  const Recipe a = load_prompt(kPromptRecipe, {"model.virtual_prompt_style=prompt-tuning",
                                               "model.prompt_tuning.new_prompt_init_methods=[text, random]",
                                               "model.prompt_tuning.new_prompt_init_text=[\"speak, Romeo\", \"\"]"});
  const std::string yaml = to_yaml(a);
  CHECK(yaml.find("\n  num_layers:") == std::string::npos);
  const Recipe b = load_prompt(yaml);
  CHECK(b.model.prompt.task_templates == a.model.prompt.task_templates);
  CHECK(b.model.prompt.prompt_tuning.new_prompt_init_methods ==
        std::vector<PromptInitMethod>{PromptInitMethod::kText, PromptInitMethod::kRandom});
  CHECK(b.model.prompt.prompt_tuning.new_prompt_init_text == std::vector<std::string>{"speak, Romeo", ""});
  CHECK(to_yaml(b).substr(to_yaml(b).find("run:")) == yaml.substr(yaml.find("run:")));
  // Every prompt-learning key is dumped.
  for (const auto& path : detail::key_index(RecipeKind::kPromptLearning).fields) {
    INFO(path);
    CHECK(yaml.find(" " + path.substr(path.rfind('.') + 1) + ":") != std::string::npos);
  }
}

TEST_CASE("overrides address list items by index, their keys are checked with suggestions", "[config]") {
  const Recipe r = load_prompt(kPromptRecipe, {"model.task_templates.1.prompt_template=<|VIRTUAL_PROMPT_0|> {line}"
                                               "<|VIRTUAL_PROMPT_1|> Which play:{play}",
                                               "model.task_templates.0.total_virtual_tokens=12",
                                               "model.task_templates.0.virtual_token_splits=[12]",
                                               "model.data.train_ds.0=data/other.jsonl"});
  REQUIRE(r.model.prompt.task_templates.size() == 2);
  CHECK(r.model.prompt.task_templates[1].prompt_template ==
        "<|VIRTUAL_PROMPT_0|> {line}<|VIRTUAL_PROMPT_1|> Which play:{play}");
  CHECK(r.model.prompt.task_templates[0].total_virtual_tokens == 12);
  CHECK(r.model.prompt.task_templates[1].taskname == "play");  // the rest of the item is kept
  CHECK(r.model.data.train_ds == std::vector<std::string>{"data/other.jsonl"});
  CHECK(r.origin.locations.at("model.task_templates").str() == "p.yaml:13:5");

  CHECK(has(prompt_errors(kPromptRecipe, {"model.task_templates.2.taskname=x"}),
            "model.task_templates.2.taskname: 'model.task_templates' has 2 item(s), numbered from 0; found index 2"));
  for (const char* bad : {"-1", "01", "+1"})
    CHECK(has(prompt_errors(kPromptRecipe, {std::string("model.task_templates.") + bad + ".taskname=x"}),
              std::string("'") + bad + "' is not an index: the items of a list are numbered 0, 1, 2"));
  CHECK(has(prompt_errors(kPromptRecipe, {"model.task_templates.0.prompt_templat=x"}),
            "unknown key of a task template, found 'prompt_templat' (did you mean 'prompt_template'?)"));
  CHECK(has(prompt_errors(kPromptRecipe, {"model.existing_tasks.0=speaker"}),
            "an index addresses an item of a list, but 'model.existing_tasks' is not set"));
}
