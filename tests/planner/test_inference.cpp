// Inference planner: hand-computed decode time, KV-cache and memory terms, the effect of tensor
// size and batch, constraint handling, the CLI, and FasterTransformer's published latencies.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "planner/inference_cli.h"
#include "planner/inference_search.h"

using namespace loom::planner;

namespace {
constexpr double kGiB = double(1ull << 30);

ModelShape gpt(int L, int h, int a) {
  ModelShape m;
  m.num_layers = L; m.hidden_size = h; m.num_attention_heads = a;
  return m;
}
Cluster a100(int nodes, const char* gpu = "A100-80GB") {
  Cluster c;
  c.gpu = find_gpu(gpu);
  c.num_nodes = nodes;
  c.gpus_per_node = 8;
  return c;
}
InferenceWorkload requests(int prompt, int output) {
  InferenceWorkload w;
  w.prompt_tokens = prompt;
  w.output_tokens = output;
  return w;
}
InferenceLayout layout(const Cluster& c, int t, int p, int b) {
  InferenceLayout L;
  L.parallel.tp = t; L.parallel.pp = p; L.batch = b; L.replicas = c.world() / (t * p);
  return L;
}
int run(std::vector<std::string> args) {
  args.insert(args.begin(), "loom plan infer");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return run_plan_inference_command(int(argv.size()), argv.data());
}
std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

TEST_CASE("175B decode at batch 1 on 8 A100s is bound by reading the weights", "[planner][inference]") {
  const ModelShape m = gpt(96, 12288, 96);
  const Cluster c = a100(1);
  const InferenceWorkload w = requests(128, 8);
  const InferenceLayout L = layout(c, 8, 1, 1);
  const InferenceTime t = inference_time(m, c, w, L);

  const GpuSpec& g = c.gpu;
  const double h = 12288, t8 = 8, v_shard = 51200 / 8;
  const double bw = g.memory_bandwidth_gbs * 1e9 * g.efficiency.memory_fraction;  // 2039 GB/s × 0.65
  const double launch = g.efficiency.kernel_launch_us * 1e-6;
  // Four linear layers per layer: 12h²/t weights (QKV 3h², proj h², fc1 and fc2 4h² each) read
  // once, plus the tiny [1, K] input and [1, N] output; the vocab shard of the logits layer.
  const double weights = 96 * 12 * h * h / t8 + v_shard * h;
  const double act = 96 * (h + 3 * h / t8 + h / t8 + h + h + 4 * h / t8 + 4 * h / t8 + h) + h + v_shard;
  const double expected_gemm = 2 * (weights + act) / bw + (96 * 4 + 1) * launch;
  CHECK(t.decode.gemm == Approx(expected_gemm).epsilon(1e-9));
  CHECK(2 * weights / bw == Approx(0.0329).epsilon(0.01));  // ≈ 2·P/8 bytes at 1.33 TB/s

  // Two all-reduces of [1, h] per layer: ring term 2(n−1)/n·B/bw + 2(n−1)·3 µs + 25 µs base;
  // one embedding all-reduce and one fp32 logits all-gather.
  const double nvlink = g.intra_node_gbs * g.efficiency.intra_node_comm_fraction * 1e9;
  const auto ar = [&](double bytes) { return 2 * 7.0 / 8 * bytes / nvlink + 14 * 3e-6 + 25e-6; };
  const double ag = 7.0 / 8 * 4 * 51200 / nvlink + 7 * 3e-6 + 25e-6;
  CHECK(t.decode.tp_comm == Approx(96 * 2 * ar(2 * h) + ar(2 * h) + ag).epsilon(1e-9));

  // Per token: the terms add up (p = 1); the weight read is two thirds of it.
  CHECK(t.per_token == Approx(t.decode.total()));
  CHECK(t.decode.pp_comm == 0);
  CHECK(t.per_token == Approx(expected_gemm + t.decode.tp_comm + t.decode.attention + t.decode.memory_bound));
  CHECK(t.per_token > 0.045);
  CHECK(t.per_token < 0.055);
  CHECK(t.request == Approx(t.ttft + 7 * t.per_token));
  CHECK(t.tokens_per_s_replica == Approx(8 / t.request));  // one batch of one sequence
}

TEST_CASE("KV cache bytes and the memory terms of a stage", "[planner][inference]") {
  const ModelShape m = gpt(96, 12288, 96);
  // 2 (K, V) · layers · sequences · context · h/t · 2 B.
  CHECK(kv_cache_bytes(m, 8, 96, 1, 2048) == Approx(2.0 * 96 * 2048 * 1536 * 2));
  CHECK(kv_cache_bytes(m, 4, 12, 16, 1000) == Approx(2.0 * 12 * 16 * 1000 * 3072 * 2));

  const Cluster c = a100(2);
  const InferenceWorkload w = requests(512, 512);
  const InferenceLayout L = layout(c, 8, 2, 4);
  const InferenceMemory first = inference_stage_memory(m, w, L, 0);
  const InferenceMemory last = inference_stage_memory(m, w, L, 1);
  // Two batches of four in flight, 48 layers, full context 1024.
  CHECK(first.kv_cache == Approx(kv_cache_bytes(m, 8, 48, 8, 1024)));
  CHECK(inflight_batches(L) == 2);
  // Weights: 2 B per parameter; the first stage has word + position embeddings, the last the
  // tied output copy (same vocab shard) and the final LayerNorm.
  const double layer = (12.0 * 12288 * 12288 + 7.0 * 12288) / 8 + 6 * 12288;
  CHECK(first.weights == Approx(2 * (48 * layer + 6400.0 * 12288 + 2048.0 * 12288)));
  CHECK(last.weights == Approx(2 * (48 * layer + 6400.0 * 12288 + 2 * 12288.0)));
  // Last stage adds the fp32 last-token logits b·V/t.
  CHECK(last.activations - first.activations == Approx(4.0 * 4 * 6400));
  CHECK(first.reserve == Approx(2 * kGiB));
  CHECK(first.total() == Approx(first.weights + first.kv_cache + first.activations + first.reserve));
  // 2048 prompt tokens: residual + LayerNorm output, then the larger of attention (QKV, scores of
  // 4·12 heads, context) and MLP (fc1 shard, fc2 output) — here the MLP.
  const double n = 2048, att = 3 * n * 1536 + 4 * 12.0 * 512 * 512 + n * 1536, mlp = n * 6144 + n * 12288;
  CHECK(mlp > att);
  CHECK(prefill_activation_bytes(m, 8, 4, 512) == Approx(2 * (2 * n * 12288 + mlp)));
}

TEST_CASE("memory fits or names the binding term", "[planner][inference]") {
  const ModelShape m = gpt(96, 12288, 96);
  const InferenceWorkload w = requests(128, 128);
  const InferenceSearchSpace none;
  // 175B in bf16 is ~326 GiB: 40.8 GiB of weights per GPU at t = 8.
  const Cluster big = a100(1);
  const InferenceCandidate fit = evaluate_inference(m, big, w, layout(big, 8, 1, 1), none);
  CHECK(fit.fits);
  CHECK(fit.memory.terms.weights / kGiB == Approx(40.71).margin(0.01));
  const Cluster small = a100(1, "A100-40GB");
  const InferenceCandidate unfit = evaluate_inference(m, small, w, layout(small, 8, 1, 1), none);
  CHECK_FALSE(unfit.fits);
  CHECK(std::string(unfit.memory.terms.largest_term()) == "weights");

  // 20B at batch 256 with 1024 + 1024 tokens on one GPU: the KV cache binds.
  const ModelShape m20 = gpt(44, 6144, 48);
  const Cluster one = [] { Cluster c = a100(1); c.gpus_per_node = 1; return c; }();
  const InferenceCandidate kv = evaluate_inference(m20, one, requests(1024, 1024), layout(one, 1, 1, 256), none);
  CHECK_FALSE(kv.fits);
  CHECK(std::string(kv.memory.terms.largest_term()) == "kv cache");
  // A one-layer model with long prompts: the prefill attention scores bind.
  const ModelShape tiny = gpt(1, 1024, 16);
  const InferenceCandidate act = evaluate_inference(tiny, one, requests(2000, 1), layout(one, 1, 1, 1024), none);
  CHECK_FALSE(act.fits);
  CHECK(std::string(act.memory.terms.largest_term()) == "activations");

  // Nothing fits: the message names the smallest need and its binding term.
  InferenceSearchSpace only_b1;
  only_b1.batch = {1};
  const InferenceSearchResult r = search_inference(m, small, w, only_b1);
  CHECK(r.ranked.empty());
  CHECK(explain_no_layout(r, only_b1, small).find("binding term: weights") != std::string::npos);
}

TEST_CASE("a larger tensor size lowers the 175B per-token latency at batch 1", "[planner][inference]") {
  const ModelShape m = gpt(96, 12288, 96);
  const Cluster c = a100(1);
  const InferenceWorkload w = requests(128, 32);
  double previous = 1e9;
  for (int t : {1, 2, 4, 8}) {
    const double token = inference_time(m, c, w, layout(c, t, 8 / t, 1)).per_token;
    CHECK(token < previous);
    previous = token;
  }
  // t1 p8 streams 1/8 of the weights per stage like t8, but its 8 stages run one after another.
  const double p8 = inference_time(m, c, w, layout(c, 1, 8, 1)).per_token;
  CHECK(p8 / previous > 4);
}

TEST_CASE("throughput per GPU rises with batch while memory allows", "[planner][inference]") {
  const ModelShape m = gpt(44, 6144, 48);
  const Cluster c = a100(1);
  const InferenceWorkload w = requests(128, 128);
  const InferenceSearchSpace none;
  double previous = 0;
  for (int b : {1, 2, 4, 8, 16, 32, 64}) {
    const InferenceCandidate x = evaluate_inference(m, c, w, layout(c, 8, 1, b), none);
    REQUIRE(x.fits);
    CHECK(x.time.tokens_per_s_per_gpu > previous);
    previous = x.time.tokens_per_s_per_gpu;
  }
  // Pipeline with p batches in flight: p·b tokens per p slowest-stage decode times.
  const InferenceLayout pipe = layout(c, 4, 2, 8);
  const InferenceTime tp = inference_time(m, c, w, pipe);
  double max_decode = 0, max_prefill = 0, ttft = 0;
  for (int s = 0; s < 2; ++s) {
    max_decode = std::max(max_decode, decode_stage_cost(m, c, w, pipe, s, 128 + 64).total());
    const double pre = prefill_stage_cost(m, c, w, pipe, s).total();
    max_prefill = std::max(max_prefill, pre);
    ttft += pre;
  }
  CHECK(tp.ttft == Approx(ttft));
  CHECK(tp.per_token == Approx(2 * max_decode));
  CHECK(tp.tokens_per_s_replica == Approx(8.0 * 128 / (max_prefill + 127 * max_decode)));
  CHECK(tp.tokens_per_s_cluster == Approx(tp.tokens_per_s_replica));  // one replica: 4·2 = 8 GPUs
  CHECK(tp.prefill.pp_comm > 0);
}

TEST_CASE("limits are honoured and the binding limit is named", "[planner][inference]") {
  const ModelShape m = gpt(44, 6144, 48);
  const Cluster c = a100(1);
  const InferenceWorkload w = requests(256, 64);
  InferenceSearchSpace space;
  space.max_latency_ms = 1500;
  const InferenceSearchResult r = search_inference(m, c, w, space);
  REQUIRE(r.ranked.size() > 3);
  CHECK(r.objective == InferenceObjective::tokens_per_gpu);
  for (std::size_t i = 0; i < r.ranked.size(); ++i) {
    CHECK(r.ranked[i].fits);
    CHECK(r.ranked[i].time.request * 1e3 <= 1500);
    if (i) CHECK(r.ranked[i].time.tokens_per_s_per_gpu <= r.ranked[i - 1].time.tokens_per_s_per_gpu);
  }
  // Some fitting layouts are slower than the limit (large batches), so the limit did prune.
  CHECK(r.fitting.size() > r.ranked.size());

  InferenceSearchSpace floor;
  floor.min_throughput = 2000;
  const InferenceSearchResult f = search_inference(m, c, w, floor);
  REQUIRE(!f.ranked.empty());
  CHECK(f.objective == InferenceObjective::request_latency);
  for (std::size_t i = 0; i < f.ranked.size(); ++i) {
    CHECK(f.ranked[i].time.tokens_per_s_cluster >= 2000);
    if (i) CHECK(f.ranked[i].time.request >= f.ranked[i - 1].time.request);
  }

  InferenceSearchSpace tight;
  tight.max_latency_ms = 1;
  tight.min_throughput = 100;
  const InferenceSearchResult none = search_inference(m, c, w, tight);
  CHECK(none.ranked.empty());
  const std::string why = explain_no_layout(none, tight, c);
  CHECK(why.find("--max-latency-ms 1 binds: the lowest request latency is") != std::string::npos);
  CHECK(why.find("--min-throughput") == std::string::npos);  // reachable on its own

  InferenceSearchSpace token;
  token.max_token_latency_ms = 0.5;
  const InferenceSearchResult t = search_inference(m, c, w, token);
  CHECK(t.ranked.empty());
  CHECK(explain_no_layout(t, token, c).find("--max-token-latency-ms 0.5 binds") != std::string::npos);
}

TEST_CASE("loom plan infer: table, CSV and errors", "[planner][inference]") {
  const std::string csv = std::string("/tmp/loom_test_infer_") + std::to_string(getpid()) + ".csv";
  REQUIRE(run({"--size", "20", "--prompt-tokens", "128", "--output-tokens", "32", "--tp", "2,4,8", "--batch",
               "1,8,64", "--max-latency-ms", "2000", "--csv", csv}) == 0);
  const std::string text = slurp(csv);
  CHECK(text.rfind("rank,tp,pp,batch,replicas,fits,meets_limits,worst_stage,memory_gib", 0) == 0);
  std::size_t lines = 0;
  for (char ch : text) lines += ch == '\n';
  CHECK(lines > 2);
  std::remove(csv.c_str());

  const std::string table = format_inference_table({}, 5);
  CHECK(table.find("TTFT ms") != std::string::npos);
  CHECK(table.find("tokens/s/GPU") != std::string::npos);

  CHECK(run({"--size", "20", "--prompt-tokens", "128", "--output-tokens", "32", "--max-latency-ms", "1"}) == 1);
  CHECK(run({"--size", "20", "--output-tokens", "32"}) == 2);                       // missing prompt
  CHECK(run({"--prompt-tokens", "8", "--output-tokens", "8"}) == 2);                // missing model
  CHECK(run({"--size", "20", "--prompt-tokens", "8", "--output-tokens", "8", "--precision", "fp8"}) == 2);
  CHECK(run({"--size", "20", "--prompt-tokens", "8", "--output-tokens", "8", "--tp", "5"}) == 2);
  CHECK(run({"--size", "20", "--prompt-tokens", "2000", "--output-tokens", "100"}) == 2);  // > 2048
  CHECK(run({"--size", "20", "--prompt-tokens", "8", "--output-tokens", "8", "--batch", "0"}) == 2);
  CHECK(run({"--size", "20", "--prompt-tokens", "8", "--output-tokens", "0"}) == 2);
  CHECK(run({"--size", "20", "--prompt-tokens", "8", "--output-tokens", "8", "--gpu", "Z80"}) == 2);
  CHECK(run({"--size", "20", "--prompt-tokens", "8", "--output-tokens", "8", "--max-latency-ms", "-5"}) == 2);
  CHECK(run({"--size", "20", "--num-layers", "4", "--prompt-tokens", "8", "--output-tokens", "8"}) == 2);

  const ModelShape m = gpt(44, 6144, 48);
  InferenceSearchSpace bad;
  bad.tp = {5};
  try {
    search_inference(m, a100(5), requests(8, 8), bad);  // 40 GPUs: t = 5 divides the world
    FAIL("expected std::invalid_argument");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("t = 5 does not divide 48 attention heads") != std::string::npos);
  }
}

// NVIDIA FasterTransformer, docs/gpt_guide.md ("Performance", A100-80GB SXM, NVSwitch, FP16,
// top_p 0.9; github.com/NVIDIA/FasterTransformer, commit 07fdd2f): whole-request latency in ms.
// The collective parameters (25 µs + 3 µs per ring step) were chosen from the growth of the
// GPT-20B batch-1 rows with t; the 175B rows and the batch-64 rows were not used to choose them.
TEST_CASE("FasterTransformer GPT-20B and GPT-175B latencies within 20%", "[planner][inference]") {
  struct Row { int layers, hidden, heads, t, batch, prompt, output; double ms; };
  const Row rows[] = {
      {96, 12288, 96, 8, 1, 128, 8, 488.86},   {96, 12288, 96, 8, 1, 512, 32, 1719.96},
      {96, 12288, 96, 8, 8, 128, 8, 749.86},   {96, 12288, 96, 8, 16, 512, 32, 3706.23},
      {96, 12288, 96, 8, 32, 128, 8, 1547.44},
      {44, 6144, 48, 1, 1, 60, 20, 560},       {44, 6144, 48, 2, 1, 60, 20, 358},
      {44, 6144, 48, 4, 1, 60, 20, 248},       {44, 6144, 48, 8, 1, 60, 20, 212},
      {44, 6144, 48, 1, 1, 80, 200, 5609},     {44, 6144, 48, 2, 1, 80, 200, 3532},
      {44, 6144, 48, 4, 1, 80, 200, 2438},     {44, 6144, 48, 8, 1, 80, 200, 2053},
      {44, 6144, 48, 1, 64, 128, 20, 2157},    {44, 6144, 48, 2, 64, 128, 20, 1379},
      {44, 6144, 48, 4, 64, 128, 20, 832},     {44, 6144, 48, 8, 64, 128, 20, 634},
  };
  double sum = 0, worst = 0;
  for (const Row& r : rows) {
    const ModelShape m = gpt(r.layers, r.hidden, r.heads);
    const Cluster c = a100(1);
    InferenceLayout L;
    L.parallel.tp = r.t; L.parallel.pp = 1; L.batch = r.batch; L.replicas = 8 / r.t;
    const double ms = inference_time(m, c, requests(r.prompt, r.output), L).request * 1e3;
    const double err = ms / r.ms - 1;
    INFO(r.layers << "L t" << r.t << " b" << r.batch << " " << r.prompt << "/" << r.output << ": predicted "
                  << ms << " ms, published " << r.ms << " ms");
    CHECK(std::abs(err) < 0.20);
    sum += std::abs(err);
    worst = std::max(worst, std::abs(err));
  }
  const double mean = sum / (sizeof(rows) / sizeof(rows[0]));
  CHECK(mean < 0.12);
  CHECK(worst < 0.18);
}
