// Every recipe in recipes/ validates; shapes and layouts match NeMo's GPT-3 recipes
// (docs/design/planner_sources.md) and Meta's Llama 3 configs; parameter counts match the analytic
// formula and the nominal (GPT-3) or released (Llama 3) sizes.
#include <catch2/catch.hpp>

#include <filesystem>

#include "config/derived.h"
#include "config_test_util.h"

using namespace loom::config;
using loom::config::test::recipe_file;

namespace {
// The one parameter count (rules::ModelShape, the planner's) of a recipe with GPT-2's vocabulary.
int64_t recipe_parameters(const Recipe& r) {
  return static_cast<int64_t>(recipe_model_shape(r, kGpt2VocabSize).parameter_count());
}
}  // namespace

TEST_CASE("every recipe in recipes/ loads and validates", "[config]") {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(LOOM_SOURCE_DIR) + "/recipes")) {
    if (entry.path().extension() != ".yaml") continue;
    INFO(entry.path().string());
    // ptune_*.yaml are prompt-learning recipes (loom ptune), lora_*.yaml and sft_*.yaml
    // fine-tuning recipes (loom finetune), the rest pretraining recipes.
    const std::string file = entry.path().filename().string();
    const RecipeKind kind = file.rfind("ptune_", 0) == 0  ? RecipeKind::kPromptLearning
                            : file.rfind("lora_", 0) == 0 || file.rfind("sft_", 0) == 0 ? RecipeKind::kFinetuning
                                                          : RecipeKind::kPretraining;
    Recipe r;
    REQUIRE_NOTHROW(r = load_recipe(entry.path().string(), {}, kind));
    CHECK(r.origin.warnings.empty());
    // The resolved dump loads back to the same dump.
    CHECK(to_yaml(load_recipe_from_string(to_yaml(r), r.origin.file, {}, kind)) == to_yaml(r));
    ++count;
  }
  CHECK(count >= 6);
}

TEST_CASE("gpt3_tiny_cpu: 4 CPU ranks, t=2 p=2 d=1, SP and selective recompute", "[config]") {
  const Recipe r = load_recipe(recipe_file("gpt3_tiny_cpu.yaml"));
  CHECK(r.trainer.accelerator == Accelerator::kCpu);
  CHECK(r.trainer.precision == Precision::kFp32);
  CHECK(world_size(r) == 4);
  CHECK(r.model.tensor_model_parallel_size == 2);
  CHECK(r.model.pipeline_model_parallel_size == 2);
  CHECK(data_parallel_size(r) == 1);
  CHECK(num_microbatches(r) == 4);
  CHECK(r.model.sequence_parallel);
  CHECK(r.model.activations_checkpoint_granularity == RecomputeGranularity::kSelective);
  CHECK(r.model.data.data_prefix ==
        std::vector<DataBlendEntry>{{1.0, "data/preprocessed/tinyshakespeare_text_document"}});
  CHECK(r.model.tokenizer.vocab_file == "data/gpt2-vocab.json");
  CHECK(r.model.tokenizer.merge_file == "data/gpt2-merges.txt");
  CHECK(run_directory(r) == "runs/gpt3_tiny_cpu");
  CHECK(r.exp_manager.checkpoint_callback_params.every_n_steps == 100);
  CHECK(r.trainer.val_check_interval == 50);
  CHECK(padded_vocab_size(r) == 50304);  // lcm(128, t=2) = 128
  // V*h + s*h + L*(12h^2 + 13h) + 2h with V=50304, s=128, h=128, L=4.
  CHECK(recipe_parameters(r) == 50304 * 128 + 128 * 128 + 4 * (12 * 128 * 128 + 13 * 128) + 2 * 128);
}

namespace {
struct Published {
  const char* file;
  int64_t nodes, mbs, gbs, t, p, v, layers, hidden, heads;
  bool sp;
  int64_t params;    // our formula, computed by hand (see derived.h)
  double nominal;    // the size in the recipe's name
};
}  // namespace

TEST_CASE("GPT-3 recipes have NeMo's shapes, layouts and sizes", "[config]") {
  const Published table[] = {
      // 126m: V=50304 (t=1): 50304*768 + 2048*768 + 12*(12*768^2 + 13*768) + 2*768
      {"gpt3_126m.yaml", 8, 4, 256, 1, 1, 1, 12, 768, 12, false, 125262336, 126e6},
      // 5b: V=50304: 50304*4096 + 2048*4096 + 24*(12*4096^2 + 13*4096) + 2*4096
      {"gpt3_5b.yaml", 16, 4, 2048, 1, 1, 1, 24, 4096, 32, false, 5047558144, 5e9},
      // 20b: V=50304 (lcm(128, 2) = 128): 50304*6144 + 2048*6144 + 44*(12*6144^2 + 13*6144) + 2*6144
      {"gpt3_20b.yaml", 64, 2, 2048, 2, 1, 1, 44, 6144, 48, true, 20256509952, 20e9},
      // 175b: V=50304 (lcm(128, 4) = 128): 50304*12288 + 2048*12288 + 96*(12*12288^2 + 13*12288) + 2*12288
      {"gpt3_175b.yaml", 128, 1, 2048, 4, 8, 12, 96, 12288, 96, true, 174604836864, 175e9},
  };
  for (const auto& want : table) {
    INFO(want.file);
    const Recipe r = load_recipe(recipe_file(want.file));
    CHECK(r.trainer.accelerator == Accelerator::kGpu);
    CHECK(r.trainer.precision == Precision::kBf16);
    CHECK(r.trainer.devices == 8);
    CHECK(r.trainer.num_nodes == want.nodes);
    CHECK(r.model.encoder_seq_length == 2048);
    CHECK(r.model.micro_batch_size == want.mbs);
    CHECK(r.model.global_batch_size == want.gbs);
    CHECK(r.model.tensor_model_parallel_size == want.t);
    CHECK(r.model.pipeline_model_parallel_size == want.p);
    CHECK(virtual_pipeline_size(r) == want.v);
    CHECK(r.model.sequence_parallel == want.sp);
    CHECK(r.model.num_layers == want.layers);
    CHECK(r.model.hidden_size == want.hidden);
    CHECK(r.model.ffn_hidden_size == 4 * want.hidden);
    CHECK(r.model.num_attention_heads == want.heads);
    CHECK(uses_distributed_optimizer(r));
    CHECK(recipe_parameters(r) == want.params);
    CHECK(std::abs(static_cast<double>(recipe_parameters(r)) - want.nominal) / want.nominal < 0.015);
  }
}

TEST_CASE("175b layout: d=32, 64 micro-batches, 1 layer per virtual stage", "[config]") {
  const Recipe r = load_recipe(recipe_file("gpt3_175b.yaml"));
  CHECK(world_size(r) == 1024);
  CHECK(data_parallel_size(r) == 32);
  CHECK(num_microbatches(r) == 64);
  CHECK(layers_per_chunk(r) == 1);
  CHECK(run_directory(r) == "runs/gpt3_175b/results");
}

TEST_CASE("Llama 3 recipes have Meta's shapes, NeMo's launcher settings and the published sizes", "[config]") {
  struct Llama {
    const char* file;
    int64_t nodes, t, p, v, layers, hidden, ffn, heads;
    bool sp;
    double params;  // Meta-Llama-3-8B / -70B: every tensor of the released checkpoint
  };
  const Llama table[] = {
      {"llama3_8b.yaml", 16, 2, 1, 1, 32, 4096, 14336, 32, true, 8030261248.0},
      {"llama3_70b.yaml", 128, 4, 4, 5, 80, 8192, 28672, 64, true, 70553706496.0},
  };
  for (const auto& want : table) {
    INFO(want.file);
    const Recipe r = load_recipe(recipe_file(want.file));
    CHECK(r.trainer.accelerator == Accelerator::kGpu);
    CHECK(r.trainer.precision == Precision::kBf16);
    CHECK(r.trainer.devices == 8);
    CHECK(r.trainer.num_nodes == want.nodes);
    CHECK(r.model.encoder_seq_length == 8192);
    CHECK(r.model.max_position_embeddings == 8192);
    CHECK(r.model.micro_batch_size == 1);
    CHECK(r.model.global_batch_size == 2048);
    CHECK(r.model.tensor_model_parallel_size == want.t);
    CHECK(r.model.pipeline_model_parallel_size == want.p);
    CHECK(virtual_pipeline_size(r) == want.v);
    CHECK(r.model.sequence_parallel == want.sp);
    CHECK(r.model.num_layers == want.layers);
    CHECK(r.model.hidden_size == want.hidden);
    CHECK(r.model.ffn_hidden_size == want.ffn);
    CHECK(r.model.num_attention_heads == want.heads);
    CHECK(r.model.num_query_groups == std::optional<int64_t>(8));
    CHECK(r.model.normalization == loom::Normalization::kRmsNorm);
    CHECK(r.model.position_embedding_type == loom::PositionEmbedding::kRope);
    CHECK(r.model.rotary_base == 500000.0);
    CHECK(r.model.activation == loom::Activation::kSwiglu);
    CHECK_FALSE(r.model.bias);
    CHECK_FALSE(r.model.share_embeddings_and_output_weights);
    CHECK(r.model.use_flash_attention);
    CHECK(r.model.attention_dropout == 0.0);
    CHECK(r.model.tokenizer.library == TokenizerLibrary::kHuggingFace);
    CHECK(uses_distributed_optimizer(r));
    // Llama 3's tokenizer has 128256 tokens (a multiple of 128: no padding); the one count.
    CHECK(padded_vocab_size(r, 128256) == 128256);
    CHECK(recipe_model_shape(r, 128256).parameter_count() == want.params);
  }
}
