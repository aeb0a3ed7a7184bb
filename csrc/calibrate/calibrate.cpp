#include "calibrate/calibrate.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <nlohmann/json.hpp>

#include "planner/hardware.h"
#include "planner/time_model.h"
#include "runtime/communicator.h"
#include "runtime/rank_session.h"
#include "runtime/run_device.h"

namespace loom::calibrate {
namespace {

using Clock = std::chrono::steady_clock;

void sync(const c10::Device& device) { runtime::synchronize(device); }

double elapsed(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Seconds per call of `fn` on the slowest rank. Rank 0 picks the iteration count from one
// timed call so that the measurement lasts about `target` seconds; all ranks then start
// together after a barrier, so shared cores, memory and links are measured under load.
// `fn` may itself be a collective: every rank calls it the same number of times.
template <class F>
double seconds_per_call(runtime::Communicator& world, const c10::Device& device, double target, F&& fn) {
  for (int i = 0; i < 3; ++i) fn();  // warm-up: allocations, code paths, connections
  sync(device);
  auto t0 = Clock::now();
  fn();
  sync(device);
  const double one = std::max(elapsed(t0), 1e-7);
  const auto opts = at::TensorOptions().device(device);
  at::Tensor iters = at::full({1}, int64_t(std::clamp(target / one, 1.0, 20000.0)), opts.dtype(at::kLong));
  world.broadcast(iters, 0);
  const int64_t n = iters.item<int64_t>();
  world.barrier();
  t0 = Clock::now();
  for (int64_t i = 0; i < n; ++i) fn();
  sync(device);
  at::Tensor per_call = at::full({1}, elapsed(t0) / double(n), opts.dtype(at::kDouble));
  world.all_reduce(per_call, runtime::ReduceOp::kMax);
  return per_call.item<double>();
}

std::vector<std::vector<int64_t>> default_shapes(bool cuda) {
  if (cuda)
    return {{1024, 1024, 1024}, {2048, 2048, 2048}, {4096, 4096, 4096}, {8192, 8192, 8192},
            {8192, 1536, 12288}, {2048, 128, 2048}, {16384, 6144, 1536}};
  // Shapes of small models on CPU ranks: square GEMMs and the tall/skinny ones of layers and
  // vocabulary logits (few hundred tokens × a wide N).
  // (A small-M, small-N, long-K product stays in cache and runs far above the rest; it is
  // left out because training has none and it would skew the fitted curve.)
  return {{64, 64, 64},       {128, 128, 128},  {256, 256, 256},   {512, 512, 512},
          {1024, 1024, 1024}, {512, 512, 128},  {512, 4096, 128},  {1024, 8192, 128}};
}

std::vector<std::vector<int64_t>> default_attention_shapes(bool cuda) {
  // {batch, heads, seq, head_dim}: the FlashAttention papers' sweep (batch·seq fixed, 16 heads
  // of 128) on GPUs; sequences of small CPU models at head dimension 64.
  if (cuda) return {{8, 16, 1024, 128}, {4, 16, 2048, 128}, {2, 16, 4096, 128}, {1, 16, 8192, 128}};
  return {{1, 4, 128, 64}, {1, 4, 256, 64}, {1, 4, 512, 64}};
}

std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kBFloat16: return "bf16";
    case c10::kHalf: return "fp16";
    default: return "fp32";
  }
}

// A built-in GPU entry for a CUDA device name ("NVIDIA H100 80GB HBM3" → H100) with matching
// memory, or nullptr.
const planner::GpuSpec* recognise(const std::string& device_name, double memory_gib) {
  for (const auto& g : planner::builtin_gpus()) {
    const std::string family = g.name.substr(0, g.name.find('-'));
    if (device_name.find(family) == std::string::npos) continue;
    if (std::abs(memory_gib - g.memory_gib) <= 0.2 * g.memory_gib) return &g;
  }
  return nullptr;
}

}  // namespace

const char* to_string(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::all_gather: return "all_gather";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
  }
  return "?";
}

RingFit fit_ring_model(const std::vector<CollectiveSample>& samples, int ranks) {
  if (samples.size() < 2 || ranks < 2)
    throw std::invalid_argument("fit_ring_model: needs >= 2 samples and >= 2 ranks");
  // t = α·x1 + β·x2 with x1 = ring steps, x2 = steps/n·B and β = 1/bw; weights 1/t² make it
  // the least squares of the relative error (normal equations of a two-feature linear fit).
  const double n = ranks;
  double s11 = 0, s12 = 0, s22 = 0, s1t = 0, s2t = 0;
  for (const auto& s : samples) {
    const double steps = s.kind == CollectiveKind::all_reduce ? 2 * (n - 1) : n - 1;
    const double w = 1.0 / (s.seconds * s.seconds), x1 = steps, x2 = steps / n * double(s.bytes);
    s11 += w * x1 * x1; s12 += w * x1 * x2; s22 += w * x2 * x2;
    s1t += w * x1 * s.seconds; s2t += w * x2 * s.seconds;
  }
  const double det = s11 * s22 - s12 * s12;
  double alpha = det > 0 ? (s1t * s22 - s12 * s2t) / det : 0;
  double beta = det > 0 ? (s11 * s2t - s12 * s1t) / det : 0;
  // Keep the model physical: a positive latency and bandwidth (refit the other term alone).
  if (beta <= 0) { beta = 1e-15; alpha = std::max(1e-9, (s1t - beta * s12) / s11); }
  if (alpha <= 0) { alpha = 1e-9; beta = std::max(1e-15, (s2t - alpha * s12) / s22); }
  return {alpha, 1.0 / beta / 1e9};
}

namespace {

// The device's name and memory (per rank: CPU ranks and the stand-in share the host's RAM).
void describe_device(CalibrationResult& r, c10::Device dev) {
  if (r.cuda) {
    const auto* prop = at::cuda::getDeviceProperties(dev.index());
    r.device_name = prop->name;
    r.memory_gib = double(prop->totalGlobalMem) / 1073741824.0;
  } else {
    // CPU ranks, or a device plugin's device (its memory is the host's for the stand-in).
    r.device_name = c10::DeviceTypeName(dev.type(), /*lower_case=*/true);
    const double ram = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
    r.memory_gib = ram / 1073741824.0 / std::max(1, r.ranks);  // ranks share the node's RAM
  }
}

void measure_gemms(runtime::Communicator& world, const CalibrationOptions& opt, at::TensorOptions opts,
                   CalibrationResult& r) {
  for (const auto& s : opt.gemm_shapes.empty() ? default_shapes(r.cuda) : opt.gemm_shapes) {
    at::Tensor a = at::randn({s[0], s[2]}, opts), b = at::randn({s[2], s[1]}, opts);
    at::Tensor c = at::empty({s[0], s[1]}, opts);
    const double sec = seconds_per_call(world, opt.device, opt.target_seconds, [&] { at::mm_out(c, a, b); });
    r.gemm.push_back({s[0], s[1], s[2], 2.0 * double(s[0]) * double(s[1]) * double(s[2]) / sec / 1e12});
  }
}

// Fused attention (model.use_flash_attention's kernel): forward alone, then forward and
// backward; the backward is the difference.
void measure_fused_attention(runtime::Communicator& world, const CalibrationOptions& opt, at::TensorOptions opts,
                             CalibrationResult& r) {
  const c10::Device dev = opt.device;
  for (const auto& s : opt.attention_shapes.empty() ? default_attention_shapes(r.cuda) : opt.attention_shapes) {
    const auto leaf = [&] { return at::randn({s[0], s[1], s[2], s[3]}, opts).requires_grad_(true); };
    at::Tensor q = leaf(), k = leaf(), v = leaf();
    at::Tensor grad = at::randn({s[0], s[1], s[2], s[3]}, opts);
    const double fwd = seconds_per_call(world, dev, opt.target_seconds, [&] {
      at::NoGradGuard no_grad;
      at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, /*is_causal=*/true);
    });
    const double both = seconds_per_call(world, dev, opt.target_seconds, [&] {
      at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, /*is_causal=*/true).backward(grad);
    });
    const double flops = planner::fused_attention_fwd_flops(double(s[0] * s[1]), double(s[2]), double(s[3]));
    r.attention.push_back({s[0], s[1], s[2], s[3], flops / fwd / 1e12,
                           2.5 * flops / std::max(both - fwd, 1e-9) / 1e12});
  }
}

// Memory bandwidth (a copy) and the cost of one tiny operation.
void measure_memory_bound(runtime::Communicator& world, const CalibrationOptions& opt, at::TensorOptions opts,
                          CalibrationResult& r) {
  const c10::Device dev = opt.device;
  // Larger than the last-level cache on CPUs, large enough for full speed on GPUs.
  const int64_t copy_bytes = r.cuda ? (int64_t(1) << 30) : (int64_t(64) << 20);
  {
    at::Tensor src = at::randn({copy_bytes / int64_t(c10::elementSize(opt.dtype))}, opts);
    at::Tensor dst = at::empty_like(src);
    const double sec = seconds_per_call(world, dev, opt.target_seconds, [&] { dst.copy_(src); });
    r.copy_gbs = 2.0 * double(copy_bytes) / sec / 1e9;
  }
  at::Tensor x = at::ones({1}, opts), y = at::ones({1}, opts);
  at::Tensor out;
  const double sec = seconds_per_call(world, dev, opt.target_seconds, [&] { out = at::add(x, y); });
  r.op_overhead_us = sec * 1e6;
}

// All-reduce, all-gather and reduce-scatter over the sizes training sends (activations of
// tensor parallelism up to gradient buckets). Gloo's cost per byte falls with size (chunking,
// thread hand-offs: on 2 cores 64 KiB and 1 MiB both take ~1.6 ms) and its all-gather and
// reduce-scatter cost about what an all-reduce does, so the ring model is fitted to all of them.
void measure_collectives(runtime::Communicator& world, const CalibrationOptions& opt, at::TensorOptions opts,
                         CalibrationResult& r) {
  const c10::Device dev = opt.device;
  const std::vector<int64_t> sizes =
      r.cuda ? std::vector<int64_t>{4096, 1 << 20, 16 << 20, 64 << 20, 256 << 20}
             : std::vector<int64_t>{4096, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20};
  const int64_t n = r.ranks;
  for (int64_t full : sizes) {
    const int64_t elems = std::max<int64_t>(n, full / 4 / n * n);  // divisible by the ranks
    at::Tensor whole = at::ones({elems}, opts.dtype(at::kFloat));
    at::Tensor part = at::ones({elems / n}, opts.dtype(at::kFloat));
    at::Tensor out;
    const double ar = seconds_per_call(world, dev, opt.target_seconds, [&] { world.all_reduce(whole); });
    const double ag = seconds_per_call(world, dev, opt.target_seconds, [&] { out = world.all_gather_dim0(part); });
    const double rs = seconds_per_call(world, dev, opt.target_seconds, [&] { out = world.reduce_scatter_dim0(whole); });
    r.collectives.push_back({CollectiveKind::all_reduce, elems * 4, ar});
    r.collectives.push_back({CollectiveKind::all_gather, elems * 4, ag});
    r.collectives.push_back({CollectiveKind::reduce_scatter, elems * 4, rs});
  }
  // The fit covers the sizes the step time depends on (activations and gradient buckets,
  // 64 KiB and up; the 4 KiB samples stay in the profile as the bare call cost).
  std::vector<CollectiveSample> fitted;
  for (const auto& s : r.collectives)
    if (s.bytes >= (64 << 10)) fitted.push_back(s);
  const RingFit fit = fit_ring_model(fitted, r.ranks);
  r.collective_latency_us = fit.latency_s * 1e6;
  r.allreduce_busbw_gbs = fit.bus_gbs;
}

}  // namespace

CalibrationResult run_calibration(runtime::Communicator& world, const CalibrationOptions& opt) {
  CalibrationResult r;
  r.cuda = opt.device.is_cuda();
  r.dtype = dtype_name(opt.dtype);
  r.ranks = world.size();
  r.threads_per_rank = at::get_num_threads();
  describe_device(r, opt.device);
  const auto opts = at::TensorOptions().device(opt.device).dtype(opt.dtype);
  at::manual_seed(1234);
  measure_gemms(world, opt, opts, r);
  measure_fused_attention(world, opt, opts, r);
  measure_memory_bound(world, opt, opts, r);
  if (r.ranks > 1) measure_collectives(world, opt, opts, r);
  return r;
}

CalibrationResult calibrate_on_rank(const launch::RendezvousInfo& info, runtime::DeviceKind device,
                                    std::chrono::milliseconds timeout, CalibrationOptions options) {
  runtime::RankSessionRequest ranks;
  ranks.layout.dp = info.world_size;  // any number of ranks: they are what is measured
  ranks.device = device;
  ranks.timeout = timeout;
  const runtime::RankSession session = runtime::start_rank_session(info, ranks);
  options.device = session.device.device;
  CalibrationResult result = run_calibration(session.groups->world(), options);
  session.groups->shutdown();
  return result;
}

std::string to_profile_json(const CalibrationResult& r) {
  using nlohmann::json;
  double best = 0;
  json gemm = json::array();
  for (const auto& g : r.gemm) {
    gemm.push_back({{"m", g.m}, {"n", g.n}, {"k", g.k}, {"tflops", g.tflops}});
    best = std::max(best, g.tflops);
  }
  json attention = json::array();
  for (const auto& a : r.attention)
    attention.push_back({{"batch", a.batch}, {"heads", a.heads}, {"seq", a.seq}, {"head_dim", a.head_dim},
                         {"fwd_tflops", a.fwd_tflops}, {"bwd_tflops", a.bwd_tflops}});
  const double link = r.ranks > 1 ? r.allreduce_busbw_gbs : r.copy_gbs;
  json device;
  if (const planner::GpuSpec* g = r.cuda ? recognise(r.device_name, r.memory_gib) : nullptr) {
    // A known GPU: its data-sheet peaks stay; the measurements set the efficiencies.
    device = {{"name", g->name},
              {"peak_tflops", g->peak_tflops},
              {"memory_gib", g->memory_gib},
              {"memory_bandwidth_gbs", g->memory_bandwidth_gbs},
              {"intra_node_gbs", g->intra_node_gbs},
              {"inter_node_gbs", g->inter_node_gbs},
              {"gpus_per_node", g->gpus_per_node}};
  } else {
    // Unknown device (CPU ranks): the measurements are the peaks. Loom's Gloo collectives are
    // synchronous on CPU, so nothing overlaps with compute there.
    device = {{"name", r.cuda ? r.device_name
                              : fmt::format("{}-{}x{}t", r.device_name, r.ranks, r.threads_per_rank)},
              {"peak_tflops", best},
              {"memory_gib", r.memory_gib},
              {"memory_bandwidth_gbs", r.copy_gbs},
              {"intra_node_gbs", link},
              {"inter_node_gbs", link},
              {"gpus_per_node", r.ranks},
              {"efficiency",
               {{"memory_fraction", 1.0},
                {"intra_node_comm_fraction", 1.0},
                {"inter_node_comm_fraction", 1.0},
                {"comm_overlap_fraction", r.cuda ? 0.5 : 0.0}}}};
  }
  json doc = {{"device", device},
              {"gemm", gemm},
              {"memory_bandwidth_gbs", r.copy_gbs},
              {"kernel_launch_us", r.op_overhead_us},
              {"measured",
               {{"device_name", r.device_name},
                {"dtype", r.dtype},
                {"ranks", r.ranks},
                {"threads_per_rank", r.threads_per_rank},
                {"copy_gbs", r.copy_gbs},
                {"op_overhead_us", r.op_overhead_us}}}};
  if (!attention.empty()) doc["fused_attention"] = attention;
  if (!r.collectives.empty()) {
    json samples = json::array();
    for (const auto& s : r.collectives)
      samples.push_back({{"kind", to_string(s.kind)}, {"bytes", s.bytes}, {"seconds", s.seconds}});
    doc["measured"]["collectives"] = samples;
  }
  if (r.ranks > 1) {
    doc["allreduce_busbw_gbs"] = {{"intra_node", r.allreduce_busbw_gbs}};
    doc["collective_latency_us"] = r.collective_latency_us;
    doc["measured"]["allreduce_busbw_gbs"] = r.allreduce_busbw_gbs;
    doc["measured"]["collective_latency_us"] = r.collective_latency_us;
  }
  return doc.dump(2) + "\n";
}

}  // namespace loom::calibrate
