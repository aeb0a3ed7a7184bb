// Calibration of the planner's speed model on the machine at hand (`loom plan calibrate`):
// every rank measures at once (so shared cores and memory are measured as training sees them)
// GEMM throughput at several shapes, copy bandwidth, the fixed cost of one small op and the
// all-reduce bus bandwidth and per-step latency over all ranks. The result is the measured
// profile JSON that `loom plan --profile FILE` reads (docs/planner.md, "Measured profiles").
// calibrate_on_rank is one rank of `loom plan calibrate`, started by runtime::start_rank_session
// (docs/architecture.md, "One rank session").
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "launch/env_rendezvous.h"
#include "runtime/run_device.h"

namespace loom::runtime {
class Communicator;
}

namespace loom::calibrate {

/// One measured GEMM C[m,n] = A[m,k]·B[k,n].
struct GemmMeasurement {
  int64_t m = 0, n = 0, k = 0;
  double tflops = 0;  ///< 2mnk / seconds of the slowest rank, 1e12 FLOP/s
};

/// One measured fused attention: at::scaled_dot_product_attention, causal, q/k/v
/// [batch, heads, seq, head_dim] in the training dtype (flash / memory-efficient / cuDNN on
/// CUDA, the flash kernel on CPU). TFLOP/s count the causal tiles the kernel executes
/// (planner::fused_attention_fwd_flops; backward 2.5×), as the planner's time model does.
struct AttentionMeasurement {
  int64_t batch = 0, heads = 0, seq = 0, head_dim = 0;
  double fwd_tflops = 0, bwd_tflops = 0;  ///< slowest rank's
};

enum class CollectiveKind { all_reduce, all_gather, reduce_scatter };
const char* to_string(CollectiveKind k);

/// One collective measurement over the ranks; `bytes` is the full (reduced or gathered)
/// tensor, as the planner counts it; `seconds` is the slowest rank's.
struct CollectiveSample {
  CollectiveKind kind = CollectiveKind::all_reduce;
  int64_t bytes = 0;
  double seconds = 0;
};

/// The planner's ring model (time_model.h): all-reduce 2(n−1)·α + 2(n−1)/n·B/bw, all-gather and
/// reduce-scatter (n−1)·α + (n−1)/n·B/bw.
struct RingFit {
  double latency_s = 0;  ///< α, per ring step
  double bus_gbs = 0;    ///< bw, GB/s
};

/// Least-squares fit of α and bw to samples of every kind at once, minimising the relative
/// error (small and large messages count alike); both kept positive. Throws
/// std::invalid_argument with fewer than 2 samples or ranks.
RingFit fit_ring_model(const std::vector<CollectiveSample>& samples, int ranks);

struct CalibrationOptions {
  c10::Device device = c10::Device(c10::kCPU);
  c10::ScalarType dtype = c10::kFloat;  ///< GEMM and copy element type (training dtype)
  double target_seconds = 0.15;         ///< wall time each measurement aims for
  /// GEMM shapes {m, n, k}; empty = a default set for the device (CPU: 64..1024, GPU: 512..8192).
  std::vector<std::vector<int64_t>> gemm_shapes;
  /// Fused-attention shapes {batch, heads, seq, head_dim}; empty = a default set (CPU: s 128..512
  /// at head dimension 64; GPU: s 1024..8192 at 128).
  std::vector<std::vector<int64_t>> attention_shapes;
};

struct CalibrationResult {
  std::string device_name;      ///< "cpu" or the CUDA device name
  bool cuda = false;
  std::string dtype;            ///< "fp32", "bf16", "fp16"
  int ranks = 1;                ///< ranks measured together (all on this node)
  int threads_per_rank = 1;     ///< ATen intra-op threads of each rank (CPU)
  double memory_gib = 0;        ///< device memory (GPU) or this node's RAM / ranks (CPU), GiB
  std::vector<GemmMeasurement> gemm;
  std::vector<AttentionMeasurement> attention;  ///< fused attention forward and backward
  double copy_gbs = 0;          ///< achieved bandwidth of a large copy, read + write, GB/s
  double op_overhead_us = 0;    ///< one small elementwise op (dispatch, launch), µs
  std::vector<CollectiveSample> collectives;  ///< by kind and size (more than one rank)
  double allreduce_busbw_gbs = 0;    ///< fitted ring bus bandwidth (0: one rank)
  double collective_latency_us = 0;  ///< fitted latency per ring step (0: one rank)
};

/// Runs every measurement; collective over `world` (every rank must call it with the same
/// options). Each figure is that of the slowest rank. Throws what the collectives throw.
CalibrationResult run_calibration(runtime::Communicator& world, const CalibrationOptions& options);

/// One rank of `loom plan calibrate` (collective over the job's ranks, every one with the same
/// arguments; calibration measures whatever world was started): starts the rank
/// (runtime::start_rank_session: this rank's share of the node's cores, the device of `device`,
/// std::invalid_argument when the host lacks it; every collective bounded by `timeout`), runs
/// run_calibration on that device (options.device is replaced) and shuts the groups down.
/// Every rank returns the same result.
CalibrationResult calibrate_on_rank(const launch::RendezvousInfo& info, runtime::DeviceKind device,
                                    std::chrono::milliseconds timeout, CalibrationOptions options);

/// The measured profile JSON: "device" (a GPU-table entry: the built-in entry of a recognised
/// GPU, else one built from the measurements with `efficiency` fractions of 1 and the measured
/// latencies), "gemm" samples, "fused_attention" samples, "memory_bandwidth_gbs", "allreduce_busbw_gbs" {"intra_node"},
/// "collective_latency_us", "kernel_launch_us" and "measured" (the raw figures incl. every collective sample, ranks, dtype).
std::string to_profile_json(const CalibrationResult& result);

}  // namespace loom::calibrate
