// `loom plan --measure` building blocks and the recipe bridge: failure classification, metrics
// parsing, which layouts are run, measured ranking, recipe → plan inputs → runnable overrides,
// and measured profiles that define their own device (CPU ranks).
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <sys/stat.h>

#include "config/recipe.h"
#include "planner/hardware.h"
#include "planner/measure.h"
#include "planner/measure_report.h"
#include "planner/memory_model.h"
#include "planner/recipe_input.h"

using namespace loom::planner;

namespace {
const std::string kRecipe = std::string(LOOM_SOURCE_DIR) + "/recipes/gpt3_tiny_cpu.yaml";

MeasuredLayout row(std::size_t predicted_rank, double predicted_s, RunStatus status, double measured_s) {
  MeasuredLayout r;
  r.predicted_rank = predicted_rank;
  r.candidate.time.gemm = predicted_s;
  r.candidate.layout.micro_batch = int(predicted_rank);
  r.measured.status = status;
  r.measured.step_seconds = measured_s;
  return r;
}
}  // namespace

TEST_CASE("failed runs are classified from the first failing rank, memory from all", "[planner][measure]") {
  const std::string peers = "[rank 1] [gloo/transport/tcp/pair.cc:534] Connection closed by peer";
  CHECK(classify_failure("anything", "", true, false) == RunStatus::timeout);
  CHECK(classify_failure(peers, "[rank 0] terminate called after throwing an instance of 'std::bad_alloc'\n" + peers,
                         false, false) == RunStatus::out_of_memory);
  CHECK(classify_failure("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", "", false, false) ==
        RunStatus::out_of_memory);
  CHECK(classify_failure(peers, peers, false, true) == RunStatus::out_of_memory);  // silent SIGKILL first
  CHECK(classify_failure("loom train: error: loss became nan at step 3", peers, false, false) == RunStatus::nan);
  CHECK(classify_failure(peers, peers, false, false) == RunStatus::comm_error);
  CHECK(classify_failure("Gloo recv: Timed out waiting 10000ms", "", false, false) == RunStatus::timeout);
  // A layout-specific error is not blamed on the peers' closed connections.
  CHECK(classify_failure("loom train: error: model.data.data_prefix: no such file", peers, false, false) ==
        RunStatus::error);
}

namespace {
// A stand-in for `loom` that every rank runs: a shell script (argv: train RECIPE overrides...).
std::string fake_loom(const std::string& name, const std::string& body) {
  const std::string path = std::string(LOOM_BINARY_DIR) + "/test_measure_" + name + ".sh";
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  chmod(path.c_str(), 0755);
  return path;
}

Measurement run_fake(const std::string& name, const std::string& body, double timeout_s = 30) {
  MeasureOptions opt;
  opt.loom_exe = fake_loom(name, body);
  opt.recipe_path = kRecipe;
  opt.timeout_s = timeout_s;
  opt.work_dir = std::string(LOOM_BINARY_DIR) + "/test_measure_runs";
  const auto base = loom::config::load_recipe(kRecipe, {"trainer.devices=2", "model.pipeline_model_parallel_size=1"});
  Layout L;
  L.tp = 2; L.micro_batch = 2; L.sequence_parallel = true;
  return measure_layout(opt, base, L, 1);
}
}  // namespace

TEST_CASE("runs that fail are stopped and classified, never stall", "[planner][measure]") {
  // Rank 0 killed by SIGKILL (as by the OOM killer), the other sees the peer gone and fails.
  auto m = run_fake("oom", "if [ \"$RANK\" = 0 ]; then kill -9 $$; fi; sleep 1; echo 'Connection closed by peer' >&2; exit 1");
  CHECK(m.status == RunStatus::out_of_memory);
  m = run_fake("nan", "echo 'loom train: error: loss became nan at step 2' >&2; exit 1");
  CHECK(m.status == RunStatus::nan);
  CHECK_THAT(m.detail, Catch::Contains("loss became nan at step 2"));
  m = run_fake("hang", "sleep 60", 1.0);
  CHECK(m.status == RunStatus::timeout);
  CHECK(m.wall_seconds < 20);
  m = run_fake("bad", "echo 'loom train: error: model.data.data_prefix: no such file' >&2; exit 2");
  CHECK(m.status == RunStatus::error);
  // Success: the run directory's metrics.jsonl (the explicit_log_dir override) is read.
  m = run_fake("ok",
               "for a in \"$@\"; do case $a in exp_manager.explicit_log_dir=*) d=${a#*=};; esac; done\n"
               "if [ \"$RANK\" = 0 ]; then mkdir -p $d; for s in 1 2 3 4 5 6; do "
               "echo '{\"kind\":\"train\",\"step\":'$s',\"step_time_s\":0.'$s'}' >> $d/metrics.jsonl; done; fi");
  CHECK(m.status == RunStatus::ok);
  CHECK(m.steps_timed == 4);
  CHECK(m.step_seconds == Approx((0.3 + 0.4 + 0.5 + 0.6) / 4));
}

TEST_CASE("measured step time is the mean after the warm-up steps", "[planner][measure]") {
  const std::string jsonl =
      R"({"kind":"validation","step":0,"val_loss":10.9})" "\n"
      R"({"kind":"train","step":1,"step_time_s":2.0})" "\n"
      R"({"kind":"train","step":2,"step_time_s":0.5})" "\n"
      "not json\n"
      R"({"kind":"train","step":3,"step_time_s":0.25})" "\n"
      R"({"kind":"train","step":4,"step_time_s":0.75})" "\n";
  int n = 0;
  CHECK(mean_step_seconds(jsonl, 1, &n) == Approx(0.5));
  CHECK(n == 3);
  CHECK(mean_step_seconds(jsonl, 0, &n) == Approx(0.875));
  CHECK(n == 4);
  CHECK(mean_step_seconds(jsonl, 9, &n) == Approx(0.875));  // fewer steps than skipped: all
  CHECK(mean_step_seconds("", 1, &n) == 0);
  CHECK(n == 0);
}

TEST_CASE("the measured memory of a GPU run is its peak device memory", "[planner][measure]") {
  CHECK(peak_device_mib(R"({"kind":"train","step":1,"max_rss_mib":900})" "\n") == -1);
  CHECK(peak_device_mib(R"({"kind":"train","step":1,"peak_device_memory_mib":512.5})" "\n"
                        "garbage\n"
                        R"({"kind":"train","step":2,"peak_device_memory_mib":640})" "\n") == 640);
}

TEST_CASE("measured layouts: top, or spread evenly over the predicted times", "[planner][measure]") {
  const std::vector<double> t = {1.0, 1.01, 1.02, 1.03, 1.2, 1.45, 1.5, 1.9, 2.0};
  CHECK(pick_for_measurement(t, 3, false) == std::vector<std::size_t>{0, 1, 2});
  // Targets 1.25, 1.5, 1.75 between 1.0 and 2.0: nearest 1.2, 1.5, 1.9 (near-ties skipped).
  CHECK(pick_for_measurement(t, 5, true) == std::vector<std::size_t>{0, 4, 6, 7, 8});
  // Targets 4 and 7 between 1 and 10: both nearest 1.3 (index 3); the second gets index 2.
  CHECK(pick_for_measurement({1.0, 1.1, 1.2, 1.3, 10.0}, 4, true) == std::vector<std::size_t>{0, 2, 3, 4});
  CHECK(pick_for_measurement({1.0, 1.5, 2.0}, 6, true) == std::vector<std::size_t>{0, 1, 2});
  CHECK(pick_for_measurement({}, 6, true).empty());
  CHECK(pick_for_measurement({1.0}, 6, true) == std::vector<std::size_t>{0});
}

TEST_CASE("re-ranking by measurement puts failures last and reports agreement", "[planner][measure]") {
  std::vector<MeasuredLayout> rows = {row(1, 1.0, RunStatus::ok, 1.30), row(2, 1.1, RunStatus::ok, 1.20),
                                      row(3, 1.5, RunStatus::out_of_memory, 0), row(4, 2.0, RunStatus::ok, 2.5)};
  rank_by_measurement(rows);
  CHECK(rows[0].predicted_rank == 2);
  CHECK(rows[1].predicted_rank == 1);
  CHECK(rows[2].predicted_rank == 4);
  CHECK(rows[3].predicted_rank == 3);
  // Predicted order 1,2,4 vs measured order 2,1,4: one swap of three → ρ = 1 − 6·2/(3·8) = 0.5.
  CHECK(spearman_rank_correlation(rows) == Approx(0.5));
  MeasureOptions opt;
  const std::string table = format_measured_table(rows, opt);
  CHECK_THAT(table, Catch::Contains("predicted best is measured best: no; predicted worst is measured worst: yes"));
  CHECK_THAT(table, Catch::Contains("out of memory"));
  const std::string csv = format_measured_csv(rows);
  CHECK(csv.rfind("measured_rank,predicted_rank,tp,pp,vp,dp,mbs,sp,recompute,dist_opt,predicted_s,measured_s,", 0) == 0);
  CHECK_THAT(csv, Catch::Contains("\n1,2,1,1,1,1,2,0,none,0,1.100000,1.200000,"));
  CHECK_THAT(csv, Catch::Contains("\n,3,"));  // the failed run has no measured rank
}

TEST_CASE("a recipe gives the plan's model, batch, precision and its own layout", "[planner][recipe]") {
  const auto recipe = loom::config::load_recipe(kRecipe);
  const RecipePlanInput in = plan_input_from_recipe(recipe);
  CHECK(in.shape.num_layers == 4);
  CHECK(in.shape.hidden_size == 128);
  CHECK(in.shape.num_attention_heads == 4);
  CHECK(in.shape.ffn() == 512);
  CHECK(in.shape.seq_length == 128);
  CHECK(in.shape.vocab_size == 50304);  // 50257 rounded up to make_vocab_size_divisible_by 128
  CHECK(in.setup.global_batch == 8);
  CHECK(in.setup.precision == Precision::kFp32);
  CHECK(in.cpu);
  CHECK(in.devices == 4);
  CHECK(in.layout.tp == 2);
  CHECK(in.layout.pp == 2);
  CHECK(in.layout.dp == 1);
  CHECK(in.layout.micro_batch == 2);
  CHECK(in.layout.sequence_parallel);
  CHECK(in.layout.recompute.granularity == RecomputeGranularity::kSelective);
  CHECK_FALSE(in.layout.distributed_optimizer);
  // The time model's DP overlap follows model.optim.overlap_grad_sync (default false).
  CHECK_FALSE(in.setup.overlap_dp_comm);
  CHECK(plan_input_from_recipe(loom::config::load_recipe(kRecipe, {"model.optim.overlap_grad_sync=true"}))
            .setup.overlap_dp_comm);
}

TEST_CASE("a planned layout applied to a recipe as overrides round-trips", "[planner][recipe]") {
  const auto base = loom::config::load_recipe(kRecipe);
  Layout L;
  L.tp = 1; L.pp = 2; L.vp = 2; L.dp = 2; L.micro_batch = 1;
  L.recompute.granularity = RecomputeGranularity::kFull; L.recompute.method = RecomputeMethod::kBlock; L.recompute.num_layers = 1;
  L.distributed_optimizer = true;
  const auto applied = loom::config::load_recipe(kRecipe, layout_overrides(L, base));
  const RecipePlanInput back = plan_input_from_recipe(applied);
  CHECK(back.layout.tp == 1);
  CHECK(back.layout.pp == 2);
  CHECK(back.layout.vp == 2);
  CHECK(back.layout.dp == 2);
  CHECK(back.layout.micro_batch == 1);
  CHECK_FALSE(back.layout.sequence_parallel);
  CHECK(back.layout.recompute.granularity == RecomputeGranularity::kFull);
  CHECK(back.layout.recompute.method == RecomputeMethod::kBlock);
  CHECK(back.layout.recompute.num_layers == 1);
  CHECK(back.layout.distributed_optimizer);
  CHECK(applied.model.data.data_prefix == base.model.data.data_prefix);  // the rest is kept

  // A base recipe with distributed_fused_adam loses the sharding when the layout has none.
  const auto dist = loom::config::load_recipe(kRecipe, {"model.optim.name=distributed_fused_adam",
                                                        "model.tensor_model_parallel_size=1", "trainer.devices=2"});
  Layout plain;
  plain.tp = 2; plain.pp = 1; plain.dp = 1; plain.micro_batch = 2; plain.sequence_parallel = true;
  auto o = layout_overrides(plain, dist);
  o.insert(o.begin(), {"model.optim.name=distributed_fused_adam", "trainer.devices=2"});
  CHECK_FALSE(plan_input_from_recipe(loom::config::load_recipe(kRecipe, o)).layout.distributed_optimizer);
}

TEST_CASE("a measured profile may define its own device and latencies", "[planner][profile]") {
  const std::string profile = R"({
    "device": {"name": "cpu-2x1t", "peak_tflops": 0.06, "memory_gib": 11.5, "memory_bandwidth_gbs": 9.0,
               "intra_node_gbs": 1.5, "inter_node_gbs": 1.5, "gpus_per_node": 2,
               "efficiency": {"memory_fraction": 1, "intra_node_comm_fraction": 1, "inter_node_comm_fraction": 1,
                              "comm_overlap_fraction": 0}},
    "gemm": [{"m": 128, "n": 128, "k": 128, "tflops": 0.02}, {"m": 1024, "n": 1024, "k": 1024, "tflops": 0.045}],
    "memory_bandwidth_gbs": 9.0, "kernel_launch_us": 7.5, "collective_latency_us": 60,
    "allreduce_busbw_gbs": {"intra_node": 1.5}})";
  const GpuSpec g = apply_measured_profile(find_gpu("H100"), profile, "cpu.json");
  CHECK(g.name == "cpu-2x1t");
  CHECK(g.peak_tflops == 0.06);
  CHECK(g.memory_gib == 11.5);
  CHECK(g.gpus_per_node == 2);
  CHECK(g.efficiency.kernel_launch_us == 7.5);
  CHECK(g.efficiency.collective_latency_us == 60);
  CHECK(g.efficiency.comm_overlap_fraction == 0);
  CHECK(g.efficiency.memory_fraction == Approx(1.0));
  CHECK(g.efficiency.intra_node_comm_fraction == Approx(1.0));
  // The fitted curve reproduces both samples (two points, two parameters; fraction 0.86 < 1).
  for (auto [n, tf] : {std::pair{128.0, 0.02}, std::pair{1024.0, 0.045}}) {
    const double shape = std::pow(n / (n + g.efficiency.gemm_half_dim), 3);
    CHECK(g.peak_tflops * g.efficiency.gemm_max_fraction * shape == Approx(tf).epsilon(0.02));
  }
  CHECK_THROWS_WITH(apply_measured_profile(find_gpu("H100"), R"({"kernel_launch_us": "fast"})", "p.json"),
                    Catch::Contains("p.json: 'kernel_launch_us' must be a number"));
  CHECK_THROWS_WITH(apply_measured_profile(find_gpu("H100"), R"({"device": {"name": "x"}})", "p.json"),
                    Catch::Contains("missing field 'peak_tflops'"));
}

TEST_CASE("fp32 training (CPU ranks) counts 16 bytes per parameter and 4-byte activations", "[planner][memory]") {
  CHECK(bytes_per_param(Precision::kFp32, false, 1) == 16);
  CHECK(bytes_per_param(Precision::kFp32, true, 4) == 11);  // the main shard is a copy: 8 + 12/d
  ModelShape m;
  m.num_layers = 4; m.hidden_size = 128; m.num_attention_heads = 4; m.seq_length = 128; m.vocab_size = 50304;
  TrainingSetup bf16, fp32;
  bf16.global_batch = fp32.global_batch = 8;
  fp32.precision = Precision::kFp32;
  Layout L;
  L.micro_batch = 2;
  const MemoryTerms a = stage_memory(m, bf16, L, 0, 1e12), b = stage_memory(m, fp32, L, 0, 1e12);
  // 4-byte elements, the same fp32 LayerNorm statistics.
  const double stats = (4.0 * 16 + 8) * 128 * 2;  // 16 B per token and layer, 8 of the final LayerNorm
  CHECK(b.activations - stats == Approx(2 * (a.activations - stats)));
  CHECK(b.weights_optimizer == Approx(a.weights_optimizer * 16.0 / 18.0));
}

TEST_CASE("repeats keep each layout's fastest successful run and report the run-to-run spread", "[planner][measure]") {
  Measurement slow, fast, failed;
  slow.status = fast.status = RunStatus::ok;
  slow.step_seconds = 1.2; slow.run_seconds = {1.2}; slow.peak_mib = 900;
  fast.step_seconds = 1.0; fast.run_seconds = {1.0}; fast.peak_mib = 800;
  failed.status = RunStatus::timeout; failed.peak_mib = 950;
  const Measurement both = keep_fastest(slow, fast);
  CHECK(both.status == RunStatus::ok);
  CHECK(both.step_seconds == 1.0);
  CHECK(both.run_seconds == std::vector<double>{1.2, 1.0});
  CHECK(both.spread() == Approx(0.2));
  CHECK(both.peak_mib == 900);  // the peak over every run
  const Measurement later_ok = keep_fastest(failed, slow);
  CHECK(later_ok.status == RunStatus::ok);
  CHECK(later_ok.step_seconds == 1.2);
  CHECK(later_ok.spread() == 0);
  CHECK(keep_fastest(failed, failed).status == RunStatus::timeout);
}

TEST_CASE("a recipe's tokenizer gives the plan's padded vocabulary", "[planner][recipe]") {
  // A byte-level tokenizer.json of 256 bytes and 44 added tokens: 300 entries, padded to 384.
  const std::string dir = std::string(LOOM_BINARY_DIR) + "/planner_tokenizer";
  ::mkdir(dir.c_str(), 0755);
  std::string vocab = "{";
  const std::string hex = "0123456789abcdef";
  int unprintable = 0x100;  // GPT-2's bytes_to_unicode: other bytes get U+0100, U+0101, ... in order
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = printable ? b : unprintable++;
    vocab += std::string(b ? "," : "") + "\"\\u0" + hex[(cp >> 8) & 15] + hex[(cp >> 4) & 15] + hex[cp & 15] + "\":" +
             std::to_string(b);
  }
  vocab += "}";
  std::string added;
  for (int i = 0; i < 44; ++i)
    added += std::string(i ? "," : "") + "{\"id\":" + std::to_string(256 + i) + ",\"content\":\"<|x" + std::to_string(i) + "|>\"}";
  std::ofstream(dir + "/tokenizer.json") << "{\"model\":{\"type\":\"BPE\",\"vocab\":" << vocab
                                         << ",\"merges\":[]},\"pre_tokenizer\":{\"type\":\"ByteLevel\"},"
                                            "\"added_tokens\":[" << added << "]}";
  const auto hf = loom::config::load_recipe(kRecipe, {"model.tokenizer.library=huggingface",
                                                      "model.tokenizer.model=" + dir + "/tokenizer.json"});
  CHECK(recipe_vocab_size(hf) == 300);
  CHECK(plan_input_from_recipe(hf).shape.vocab_size == 384);
  // GPT-2 files not on this machine: GPT-2's size, as before.
  const auto far = loom::config::load_recipe(kRecipe, {"model.tokenizer.vocab_file=/nonexistent/vocab.json"});
  CHECK(plan_input_from_recipe(far).shape.vocab_size == 50304);
  // A SentencePiece model that is not there: an error naming the field, not GPT-2's size.
  const auto sp = loom::config::load_recipe(kRecipe, {"model.tokenizer.library=sentencepiece",
                                                      "model.tokenizer.model=/nonexistent/spm.model"});
  CHECK_THROWS_WITH(plan_input_from_recipe(sp), Catch::Contains("model.tokenizer") && Catch::Contains("spm.model"));
}
