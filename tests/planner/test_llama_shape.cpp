// The planner's formulas for Llama-family shapes (rules/model_shape.h; docs/planner.md, "Llama-family
// models"): parameter counts against the published Llama 3 8B / 70B totals, the FLOPs count
// against its closed form, per-stage parameters with an untied output layer, grouped-query KV
// cache, the activation terms that change (RMSNorm, SwiGLU, RoPE, grouped K/V) and the layouts
// grouped-query attention rules out.
#include <catch2/catch.hpp>

#include <string>

#include "planner/inference_model.h"
#include "planner/memory_breakdown.h"
#include "planner/memory_model.h"
#include "planner/search.h"

using namespace loom;
using namespace loom::planner;

namespace {

ModelShape llama(int layers, int hidden, int ffn, int heads, int groups, int seq = 8192, int vocab = 128256) {
  ModelShape m{layers, hidden, heads, ffn, seq, seq, vocab};
  m.normalization = Normalization::kRmsNorm;
  m.position_embedding_type = PositionEmbedding::kRope;
  m.rotary_base = 500000;
  m.activation = Activation::kSwiglu;
  m.num_query_groups = groups;
  m.bias = false;
  m.share_embeddings_and_output_weights = false;
  return m;
}

Layout layout(int t, int p) {
  Layout L;
  L.tp = t;
  L.pp = p;
  return L;
}

}  // namespace

TEST_CASE("Llama 3 parameter counts equal the published model sizes", "[planner][llama]") {
  // Meta-Llama-3-8B and -70B as their safetensors hold them (every tensor of the checkpoint summed).
  CHECK(llama(32, 4096, 14336, 32, 8).parameter_count() == 8030261248.0);
  CHECK(llama(80, 8192, 28672, 64, 8).parameter_count() == 70553706496.0);
  // Term by term for the 8B: q and o 4096², k and v 1024·4096 each, gate, up and down 4096·14336,
  // two RMSNorm weights per layer; embedding and untied output 128256·4096; the final norm.
  const ModelShape m = llama(32, 4096, 14336, 32, 8);
  const auto lp = layer_parameters(m);
  CHECK(lp.weights == 2.0 * 4096 * 4096 + 2.0 * 1024 * 4096 + 3.0 * 4096 * 14336);
  CHECK(lp.split_biases == 0);
  CHECK(lp.replicated == 2 * 4096);
  CHECK(qkv_width(m) == 4096 + 2 * 1024);
  CHECK(fc1_width(m) == 2 * 14336);
  CHECK(m.summary() == "32L h4096 a32 g8 ffn14336 s8192 V128256 rmsnorm rope fast-swiglu no-bias untied (8.03B params)");
  // The options that change no name above are named after it.
  ModelShape qwen = m;
  qwen.qkv_bias = true;
  qwen.kv_channels = 64;
  qwen.rotary_percentage = 0.5;
  qwen.rope_scaling.enabled = true;
  qwen.rope_scaling.factor = 8;
  CHECK_THAT(qwen.summary(), Catch::Contains("no-bias untied qkv-bias d64 rotary0.5 rope-scaled8 ("));
}

TEST_CASE("each Llama option changes the parameter count by its own tensors", "[planner][llama]") {
  ModelShape gpt{2, 64, 4, 256, 32, 32, 1000};  // V = 1000 (already padded)
  const double h = 64, f = 256, V = 1000, s = 32, L = 2;
  const double gpt_count = L * (4 * h * h + 2 * h * f + 3 * h + f + h + h + 4 * h) + V * h + s * h + 2 * h;
  CHECK(gpt.parameter_count() == gpt_count);
  ModelShape m = gpt;
  m.position_embedding_type = PositionEmbedding::kRope;  // no position table
  CHECK(m.parameter_count() == gpt_count - s * h);
  m = gpt;
  m.normalization = Normalization::kRmsNorm;  // no norm biases: 2 per layer and the final one
  CHECK(m.parameter_count() == gpt_count - (2 * L + 1) * h);
  m = gpt;
  m.bias = false;  // no linear biases, no LayerNorm biases
  CHECK(m.parameter_count() == gpt_count - L * (3 * h + f + h + h) - (2 * L + 1) * h);
  m = gpt;
  m.activation = Activation::kSwiglu;  // gate and up: one more h x ffn matrix and its bias
  CHECK(m.parameter_count() == gpt_count + L * (h * f + f));
  m = gpt;
  m.num_query_groups = 1;  // multi-query: K and V one head of 16 each
  CHECK(m.parameter_count() == gpt_count - L * 2 * (h - 16) * (h + 1));
  m = gpt;
  m.share_embeddings_and_output_weights = false;  // the output layer's own V x h
  CHECK(m.parameter_count() == gpt_count + V * h);
}

TEST_CASE("Llama model FLOPs: 6 per linear weight per token plus the attention scores", "[planner][llama]") {
  const ModelShape m = llama(32, 4096, 14336, 32, 8);
  const double L = 32, s = 8192, h = 4096, V = 128256;
  const double W = layer_parameters(m).weights;
  CHECK(m.model_flops_per_sample() == Approx(6 * s * (L * W + h * V) + 12 * L * s * s * h).epsilon(1e-12));
  CHECK(m.full_recompute_flops_per_sample() ==
        Approx(8 * s * L * W + 16 * L * s * s * h + 6 * s * h * V).epsilon(1e-12));
  // Per token (÷ s): 6·(non-embedding weights incl. the output layer) + 12·L·s·h, the count
  // torchtitan's MFU uses (its N excludes only the input embedding; the norms' 2·h·L + h are
  // not multiplied in either count here).
  const double non_embedding = m.parameter_count() - V * h - (2 * L + 1) * h;
  CHECK(m.model_flops_per_sample() / s == Approx(6 * non_embedding + 12 * L * h * s).epsilon(1e-12));
}

TEST_CASE("untied output layer: its own shard on the last stage, not all-reduced with the embedding",
          "[planner][llama]") {
  ModelShape m = llama(4, 128, 352, 4, 2, 128, 50304);
  const double word = 50304.0 * 128;
  const double layer1 = layer_parameters(m).per_rank(1);
  // One stage: the embedding and the output layer both.
  CHECK(stage_params(m, layout(1, 1), 0) == 4 * layer1 + word + 128 + word);
  CHECK(stage_params(m, layout(1, 1), 0) == m.parameter_count());
  // p = 2: the embedding on stage 0, the output layer and the final norm on stage 1.
  CHECK(stage_params(m, layout(1, 2), 0) == 2 * layer1 + word);
  CHECK(stage_params(m, layout(1, 2), 1) == 2 * layer1 + 128 + word);
  // t = 2: the linear weights and the vocabulary split, the norms whole on each rank.
  const auto lp = layer_parameters(m);
  CHECK(stage_params(m, layout(2, 2), 1) == 2 * (lp.weights / 2 + 2 * 128) + 128 + word / 2);
  // A tied GPT on one stage holds no output copy; the untied model's gradient buffer holds the
  // output layer like any other weight, and no tied all-reduce happens at the optimizer step.
  m.share_embeddings_and_output_weights = true;
  CHECK(stage_params(m, layout(1, 1), 0) == 4 * layer1 + word + 128);
  CHECK(stage_params(m, layout(1, 2), 1) == 2 * layer1 + 128 + word);  // the tied copy
}

TEST_CASE("grouped-query attention: the KV cache holds the query groups", "[planner][llama]") {
  const ModelShape m = llama(32, 4096, 14336, 32, 8);
  // 2 (K, V) x 32 layers x 1 sequence x 8192 tokens x 8 groups x 128 dims / t x 2 bytes.
  CHECK(kv_cache_bytes(m, 1, 32, 1, 8192) == 2.0 * 32 * 8192 * 1024 * 2);
  CHECK(kv_cache_bytes(m, 8, 32, 1, 8192) == 2.0 * 32 * 8192 * 128 * 2);
  ModelShape mha = m;
  mha.num_query_groups = 0;
  CHECK(kv_cache_bytes(mha, 1, 32, 1, 8192) == 4 * kv_cache_bytes(m, 1, 32, 1, 8192));
  // t must divide the groups (each rank holds whole K/V heads): t = 16 divides the 32 heads, not the 8 groups.
  Cluster c;
  c.gpu = find_gpu("H100");
  c.num_nodes = 2;
  c.gpus_per_node = 8;
  InferenceLayout L;
  L.parallel.tp = 16;
  L.replicas = 1;
  CHECK(check_inference_layout(m, c, L) == "t = 16 does not divide 8 query groups (K/V heads)");
}

TEST_CASE("Loom's stored activations per Llama layer, part by part", "[planner][llama]") {
  // fp32, b = 2, s = 128, h = 128, a = 4 heads of 32 in g = 2 groups, ffn 352, no recompute,
  // unfused core without attention dropout (one s x s tensor per head).
  const ModelShape m = llama(4, 128, 352, 4, 2, 128, 50304);
  const double s = 128, b = 2, h = 128, a = 4, f = 352, e = 4, sb = s * b;
  // Two RMSNorms: input (fp32) and normalised tensor, rstd; the QKV and fc1 inputs; RoPE'd Q and
  // the expanded K and V (3·a·d); the projection input; SwiGLU: fc1 output (2f), silu(gate), product.
  const double norms = 2 * (sb * h * (4 + e) + 4 * sb);
  const double expected = norms + 2 * sb * h * e + (3 * h + h + 4 * f) * sb * e + a * s * s * b * e;
  CHECK(loom_layer_activation_bytes(m, 2, 1, false, RecomputeGranularity::kNone, false, Precision::kFp32, false) ==
        Approx(expected).epsilon(1e-12));
  CHECK(saved_qkv_width(m, 1) == 3 * h);
  // At t = 2 each rank holds one group: Q (2 heads), K and V expanded to 2 heads.
  CHECK(saved_qkv_width(m, 2) == 3 * h / 2);
  // Without grouping (g = a) V stays a view of the QKV output, which is kept whole, beside the
  // rotated Q and K.
  ModelShape mha = m;
  mha.num_query_groups = 0;
  CHECK(saved_qkv_width(mha, 1) == 3 * h + h + h);
  // GPT: the QKV output only (3h), LayerNorm's input and fp32 mean and rstd.
  ModelShape gpt{4, 128, 4, 512, 128, 128, 50304};
  CHECK(saved_qkv_width(gpt, 2) == 3 * h / 2);
  CHECK(norm_saved_bytes(gpt, sb, 2) == sb * (h * 2 + 8));
  CHECK(norm_saved_bytes(m, sb, 2) == sb * (h * 6 + 4));  // bf16: the fp32 copy of the input, then bf16
  // RoPE's tables: cos and sin, [b, 1, s, d] each.
  CHECK(rotary_table_bytes(m, 2, Precision::kBf16) == 2 * 2 * 128 * 32 * 2);
  CHECK(rotary_table_bytes(gpt, 2, Precision::kBf16) == 0);
}

TEST_CASE("the search keeps t within the query groups", "[planner][llama]") {
  const ModelShape m = llama(80, 8192, 28672, 64, 8);
  Cluster c;
  c.gpu = find_gpu("H100");
  c.num_nodes = 4;
  c.gpus_per_node = 8;
  TrainingSetup setup;
  setup.global_batch = 64;
  setup.fused_attention = true;
  setup.attention_dropout = false;
  Layout L;
  L.tp = 16;
  L.pp = 2;
  L.micro_batch = 1;
  L.global_batch = 64;
  L.sequence_parallel = true;
  CHECK_THAT(check_layout(m, c, setup, L), Catch::Contains("num_query_groups"));
  SearchSpace space;
  space.tp = {16};
  const SearchResult r = search(m, c, setup, space, 3);
  CHECK(r.enumerated == 0);
}
