// Defaults and derived values of a minimal recipe follow NeMo's GPT config.
#include <catch2/catch.hpp>

#include "config/derived.h"
#include "config_test_util.h"

using namespace loom::config;
using loom::config::test::errors_of;
using loom::config::test::kMinimalRecipe;

TEST_CASE("minimal recipe: NeMo defaults are filled in", "[config]") {
  const Recipe r = load_recipe_from_string(kMinimalRecipe, "min.yaml");
  CHECK(r.run.name == "megatron_gpt");
  CHECK(r.trainer.num_nodes == 1);
  CHECK(r.trainer.log_every_n_steps == 10);
  CHECK(r.trainer.val_check_interval == 100);
  CHECK(r.trainer.limit_val_batches == 50);
  CHECK(r.trainer.gradient_clip_val == 1.0);
  CHECK_FALSE(r.trainer.max_time.has_value());
  CHECK(r.exp_manager.name == "megatron_gpt");
  CHECK(r.exp_manager.resume_if_exists);
  CHECK(r.exp_manager.create_checkpoint_callback);
  CHECK(r.exp_manager.checkpoint_callback_params.save_last);
  CHECK(r.model.init_method_std == 0.02);
  CHECK(r.model.hidden_dropout == 0.1);
  CHECK(r.model.attention_dropout == 0.1);
  CHECK(r.model.ffn_dropout == 0.0);
  CHECK(r.model.layernorm_epsilon == 1e-5);
  CHECK(r.model.make_vocab_size_divisible_by == 128);
  CHECK(r.model.seed == 1234);
  CHECK(r.model.activations_checkpoint_granularity == RecomputeGranularity::kNone);
  CHECK(r.model.activations_checkpoint_method == RecomputeMethod::kNone);
  CHECK_FALSE(r.model.activations_checkpoint_num_layers.has_value());
  CHECK_FALSE(r.model.virtual_pipeline_model_parallel_size.has_value());
  CHECK(r.model.collective_timeout_s == 600.0);
  CHECK(r.model.data.splits_string == "900,50,50");
  CHECK(r.model.data.num_workers == 2);
  CHECK(r.model.data.data_prefix == std::vector<DataBlendEntry>{{1.0, "data/x_text_document"}});
  CHECK(r.model.tokenizer.library == TokenizerLibrary::kMegatron);
  CHECK(r.model.tokenizer.type == std::optional<std::string>("GPT2BPETokenizer"));
  CHECK_FALSE(r.model.tokenizer.model.has_value());
  CHECK(r.model.optim.name == OptimizerName::kFusedAdam);
  CHECK(r.model.optim.weight_decay == 0.01);
  CHECK(r.model.optim.betas == std::array<double, 2>{0.9, 0.98});
  CHECK(r.model.optim.eps == 1e-8);
  CHECK(r.model.optim.sched.name == SchedulerName::kCosineAnnealing);
  CHECK(r.model.optim.sched.warmup_steps == 500);
  CHECK(r.model.optim.sched.constant_steps == 50000);
  CHECK(r.model.optim.sched.min_lr == 2e-5);
  CHECK(r.cluster.job_name_prefix == "loom-");
  CHECK(r.cluster.container_mounts.empty());
}

TEST_CASE("minimal recipe: derived fields", "[config]") {
  const Recipe r = load_recipe_from_string(kMinimalRecipe, "min.yaml");
  CHECK(r.model.ffn_hidden_size == 4 * 128);
  CHECK(r.model.max_position_embeddings == 128);
  CHECK(r.model.data.seq_length == 128);
  CHECK(r.model.optim.sched.max_steps == 10);
  CHECK(r.exp_manager.checkpoint_callback_params.every_n_steps == 100);
  CHECK(r.cluster.gpus_per_node == 4);
  CHECK_FALSE(r.model.use_distributed_optimizer);
  // The schedule (500 warm-up + 50000 constant) is longer than the run: a warning, not an error.
  REQUIRE(r.origin.warnings.size() == 1);
  CHECK(r.origin.warnings[0] ==
        "min.yaml: model.optim.sched.warmup_steps (not set; default): warmup_steps + constant_steps = 50500 exceeds "
        "the schedule's max_steps 10: the run ends before the decay phase");
}

TEST_CASE("derived fields written as null are derived and explicit values win", "[config]") {
  const Recipe r = load_recipe_from_string(kMinimalRecipe, "min.yaml",
                                           {"model.ffn_hidden_size=null", "model.max_position_embeddings=512",
                                            "model.optim.sched.max_steps=7", "model.optim.name=distributed_fused_adam"});
  CHECK(r.model.ffn_hidden_size == 512);
  CHECK(r.model.max_position_embeddings == 512);
  CHECK(r.model.optim.sched.max_steps == 7);
  CHECK(r.model.use_distributed_optimizer);
  CHECK(uses_distributed_optimizer(r));
}

TEST_CASE("precision spellings", "[config]") {
  const std::vector<std::pair<std::string, Precision>> cases = {
      {"32", Precision::kFp32},       {"\"32\"", Precision::kFp32}, {"32-true", Precision::kFp32},
      {"bf16", Precision::kBf16},     {"bf16-mixed", Precision::kBf16}, {"16", Precision::kFp16},
      {"16-mixed", Precision::kFp16}, {"'16'", Precision::kFp16}};
  for (const auto& [text, want] : cases) {
    INFO(text);
    const Recipe r = load_recipe_from_string(kMinimalRecipe, "min.yaml", {"trainer.precision=" + text});
    CHECK(r.trainer.precision == want);
  }
  CHECK(errors_of(kMinimalRecipe, {"trainer.precision=fp8"}) ==
        std::vector<std::string>{"override 'trainer.precision=fp8': trainer.precision: expected one of 32 | 32-true | "
                                 "bf16 | bf16-mixed | 16 | 16-mixed, found fp8"});
}

TEST_CASE("sequence parallelism with t=1 is turned off with a warning", "[config]") {
  const Recipe r = load_recipe_from_string(
      kMinimalRecipe, "min.yaml",
      {"model.tensor_model_parallel_size=1", "model.sequence_parallel=true", "trainer.devices=2"});
  CHECK_FALSE(r.model.sequence_parallel);
  bool warned = false;
  for (const auto& w : r.origin.warnings) {
    warned = warned || w == "override 'model.sequence_parallel=true': model.sequence_parallel: sequence_parallel has "
                            "no effect with tensor_model_parallel_size 1; turned off (as Megatron-LM does)";
  }
  CHECK(warned);
}

TEST_CASE("recompute settings NeMo ships are accepted", "[config]") {
  // NeMo's GPT-3 recipes write selective + block + 0 layers.
  Recipe r = load_recipe_from_string(kMinimalRecipe, "min.yaml",
                                     {"model.activations_checkpoint_granularity=selective",
                                      "model.activations_checkpoint_method=block",
                                      "model.activations_checkpoint_num_layers=0"});
  CHECK(r.model.activations_checkpoint_granularity == RecomputeGranularity::kSelective);
  // Full recompute, uniform over 2 layers (= layers per pipeline chunk with p=2).
  r = load_recipe_from_string(kMinimalRecipe, "min.yaml",
                              {"model.activations_checkpoint_granularity=full",
                               "model.activations_checkpoint_method=uniform",
                               "model.activations_checkpoint_num_layers=2"});
  CHECK(r.model.activations_checkpoint_method == RecomputeMethod::kUniform);
  CHECK(*r.model.activations_checkpoint_num_layers == 2);
}

TEST_CASE("an empty document reports every required field", "[config]") {
  const auto errors = errors_of("", {}, "empty.yaml");
  const std::vector<std::string> want = {
      "empty.yaml: trainer.max_steps: expected a value (required field), found no key 'max_steps' in section 'trainer'",
      "empty.yaml: model.micro_batch_size: expected a value (required field), found no key 'micro_batch_size' in section 'model'",
      "empty.yaml: model.global_batch_size: expected a value (required field), found no key 'global_batch_size' in section 'model'",
      "empty.yaml: model.encoder_seq_length: expected a value (required field), found no key 'encoder_seq_length' in section 'model'",
      "empty.yaml: model.num_layers: expected a value (required field), found no key 'num_layers' in section 'model'",
      "empty.yaml: model.hidden_size: expected a value (required field), found no key 'hidden_size' in section 'model'",
      "empty.yaml: model.num_attention_heads: expected a value (required field), found no key 'num_attention_heads' in section 'model'",
      "empty.yaml: model.data.data_prefix: expected a value (required field), found no key 'data_prefix' in section 'model.data'",
      "empty.yaml: model.tokenizer.vocab_file: expected a value (required field), found no key 'vocab_file' in section 'model.tokenizer'",
      "empty.yaml: model.tokenizer.merge_file: expected a value (required field), found no key 'merge_file' in section 'model.tokenizer'",
      "empty.yaml: model.optim.lr: expected a value (required field), found no key 'lr' in section 'model.optim'"};
  CHECK(errors == want);
}
