// Fine-tuning recipes (`loom finetune`, docs/design/finetune.md, lora.md): NeMo 1.x's
// model.restore_from_path, model.peft and model.data.train_ds keys with their defaults, every bad peft field named with file:line, and no
// model shape of their own (it is the base's).
#include <catch2/catch.hpp>

#include "config_test_util.h"

using namespace loom::config;

namespace {

const char* kLoraRecipe = R"(trainer:
  devices: 1
  accelerator: cpu
  max_steps: 20
model:
  micro_batch_size: 2
  global_batch_size: 8
  restore_from_path: runs/gpt3_tiny_cpu
  peft:
    peft_scheme: lora
    lora_tuning:
      target_modules: [attention_qkv, mlp_fc2]
      adapter_dim: 8
  data:
    train_ds:
      file_names: [data/sft/train.jsonl]
      max_seq_length: 64
    validation_ds:
      file_names: [data/sft/valid.jsonl]
  optim:
    lr: 1.0e-4
)";

std::vector<std::string> errors_of(const std::vector<std::string>& overrides) {
  try {
    load_recipe_from_string(kLoraRecipe, "lora.yaml", overrides, RecipeKind::kFinetuning);
  } catch (const RecipeError& e) {
    return e.errors;
  }
  return {};
}

bool any_contains(const std::vector<std::string>& lines, const std::string& a, const std::string& b) {
  for (const auto& l : lines)
    if (l.find(a) != std::string::npos && l.find(b) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("a fine-tuning recipe reads NeMo's peft keys with their defaults", "[config][finetune]") {
  const Recipe r = load_recipe_from_string(kLoraRecipe, "lora.yaml", {}, RecipeKind::kFinetuning);
  CHECK(r.model.restore_from_path == "runs/gpt3_tiny_cpu");
  CHECK(r.model.peft.peft_scheme == "lora");
  CHECK(r.model.peft.lora_tuning.target_modules == std::vector<std::string>{"attention_qkv", "mlp_fc2"});
  CHECK(r.model.peft.lora_tuning.adapter_dim == 8);
  CHECK(!r.model.peft.lora_tuning.alpha);  // null: adapter_dim, as NeMo's ${adapter_dim}
  CHECK(r.model.peft.lora_tuning.adapter_dropout == 0.0);
  // NeMo's SFT data fields and defaults.
  const auto& t = r.model.data.sft_train;
  CHECK(t.file_names == std::vector<std::string>{"data/sft/train.jsonl"});
  CHECK(r.model.data.sft_validation.file_names == std::vector<std::string>{"data/sft/valid.jsonl"});
  CHECK(t.max_seq_length == 64);
  CHECK(t.prompt_template == "{input} {output}");
  CHECK(t.label_key == "output");
  CHECK(t.truncation_field == "input");
  CHECK(t.truncation_method == "right");
  CHECK(!t.packed_sequence);
  CHECK(t.add_eos);
  CHECK(!t.add_bos);
  CHECK(r.model.answer_only_loss);
  // The resolved YAML loads back to the same fields.
  const Recipe again = load_recipe_from_string(to_yaml(r), "again.yaml", {}, RecipeKind::kFinetuning);
  CHECK(again.model.peft.lora_tuning.target_modules == r.model.peft.lora_tuning.target_modules);
  CHECK(again.model.restore_from_path == r.model.restore_from_path);
}

TEST_CASE("bad peft fields are named with what was expected", "[config][finetune]") {
  CHECK(any_contains(errors_of({"model.peft.lora_tuning.target_modules=[attention_qkv,mlp_fc3]"}),
                     "model.peft.lora_tuning.target_modules", "found 'mlp_fc3'"));
  CHECK(any_contains(errors_of({"model.peft.lora_tuning.target_modules=[]"}), "model.peft.lora_tuning.target_modules",
                     "found none"));
  CHECK(any_contains(errors_of({"model.peft.lora_tuning.adapter_dim=0"}), "model.peft.lora_tuning.adapter_dim",
                     "expected an integer >= 1"));
  CHECK(any_contains(errors_of({"model.peft.lora_tuning.alpha=0"}), "model.peft.lora_tuning.alpha", "expected a number > 0"));
  CHECK(any_contains(errors_of({"model.peft.lora_tuning.adapter_dropout=1"}), "model.peft.lora_tuning.adapter_dropout",
                     "probability"));
  CHECK(any_contains(errors_of({"model.peft.peft_scheme=adapter"}), "model.peft.peft_scheme", "expected lora"));
  CHECK(errors_of({"model.peft.peft_scheme=none"}).empty());  // full-parameter SFT
  CHECK(any_contains(errors_of({"model.data.train_ds.file_names=[]"}), "model.data.train_ds.file_names",
                     "at least one JSONL file"));
  CHECK(any_contains(errors_of({"model.data.train_ds.truncation_method=left"}), "model.data.train_ds.truncation_method",
                     "expected right"));
  CHECK(any_contains(errors_of({"model.data.train_ds.max_seq_length=1"}), "model.data.train_ds.max_seq_length",
                     "expected"));
  // Pretraining data is not a fine-tuning recipe's.
  CHECK(any_contains(errors_of({"model.data.data_prefix=[1.0,x]"}), "model.data.data_prefix", "fine-tuning"));
  CHECK(any_contains(errors_of({"model.restore_from_path="}), "model.restore_from_path", "required field"));
  CHECK(any_contains(errors_of({"model.restore_from_path=''"}), "model.restore_from_path", "non-empty"));
  CHECK(any_contains(errors_of({"model.peft.lora_tuning.adapter_dimm=4"}), "adapter_dimm", "did you mean"));
  // The model's shape is the base's; a pretraining key says so.
  CHECK(any_contains(errors_of({"model.num_layers=4"}), "model.num_layers", "model.restore_from_path"));
  // And a pretraining recipe has no peft section.
  bool refused = false;
  try {
    load_recipe_from_string(kLoraRecipe, "lora.yaml", {}, RecipeKind::kPretraining);
  } catch (const RecipeError& e) {
    refused = any_contains(e.errors, "model.peft", "loom finetune");
  }
  CHECK(refused);
}
