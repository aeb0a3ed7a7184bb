// GPU and cluster description for the planner: peak figures from a data table
// (csrc/planner/data/gpus.json, compiled in; extendable by a user JSON file) and the speed-model
// efficiencies that turn peaks into achieved throughput (docs/planner.md, "Speed model").
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace loom::planner {

/// How much of a peak the hardware achieves; the few physical parameters of the speed model.
struct Efficiency {
  /// GEMM compute throughput = peak · gemm_max_fraction · Π_{x∈{M,N,K}} x/(x + gemm_half_dim);
  /// the result's write is charged on top at memory_fraction (time_model.h).
  /// Defaults are the A100 calibration (docs/planner.md), used for user GPUs without one.
  double gemm_max_fraction = 0.78;
  double gemm_half_dim = 16;            ///< matrix dimension at which one factor is 1/2
  /// Achieved / peak HBM bandwidth of memory-bound kernels (and of a GEMM's result write).
  double memory_fraction = 0.65;
  double intra_node_comm_fraction = 0.8;  ///< NCCL bus bandwidth / NVLink bandwidth
  double inter_node_comm_fraction = 0.7;  ///< NCCL bus bandwidth / network bandwidth
  double collective_latency_us = 10;    ///< per ring step of a collective or per p2p message
  double kernel_launch_us = 4;          ///< fixed cost per kernel (launch and tail)
  /// Share of a collective that hides behind the GEMM it is overlapped with (backward TP
  /// collectives, DP reduction when overlapped); the rest is exposed (SM and HBM contention).
  double comm_overlap_fraction = 0.5;
  /// Fused (flash) attention kernel throughput / peak at head dimension 128, for the FLOPs it
  /// executes (causal: half the s² products), forward and backward; short sequences under-fill
  /// it by s/(s + gemm_half_dim). Defaults: FlashAttention-2 on A100 (docs/planner.md).
  double fused_attention_fwd_fraction = 0.70;
  double fused_attention_bwd_fraction = 0.55;
};

/// One GPU model. Bandwidths are per GPU and per direction, in GB/s (1e9 bytes/s).
struct GpuSpec {
  std::string name;
  double peak_tflops = 0;          ///< dense bf16/fp16 tensor-core TFLOP/s
  double memory_gib = 0;           ///< device memory, GiB
  double memory_bandwidth_gbs = 0; ///< HBM bandwidth
  double intra_node_gbs = 0;       ///< NVLink/NVSwitch bandwidth
  double inter_node_gbs = 0;       ///< network bandwidth (one NIC per GPU)
  int gpus_per_node = 8;           ///< default node size for this GPU
  Efficiency efficiency;
};

/// The built-in table parsed from data/gpus.json (A100-40GB, A100-80GB, H100, H200).
const std::vector<GpuSpec>& builtin_gpus();

/// Parses a GPU table in the gpus.json format ({"gpus": [...], "efficiency": {...}}) or a
/// single GPU object. `source` names the file in error messages. Each entry needs name,
/// peak_tflops, memory_gib, memory_bandwidth_gbs, intra_node_gbs, inter_node_gbs; efficiency is
/// either an object with Efficiency's fields (missing ones default) or the name of an entry in
/// the table's "efficiency" object. Throws std::invalid_argument naming source and field.
std::vector<GpuSpec> parse_gpu_table(const std::string& json_text, const std::string& source);

/// Finds a GPU by name (case-insensitive) in `extra` first, then in the built-in table.
/// Throws std::invalid_argument listing the known names when absent.
GpuSpec find_gpu(const std::string& name, const std::vector<GpuSpec>& extra = {});

/// The built-in table's peak_tflops for an accelerator's name as the device reports it (e.g.
/// torch's "NVIDIA H200", "NVIDIA A100-SXM4-80GB"): the first entry whose family, its name up
/// to the first '-' ("A100", "H100", "H200"), the device's name contains, case-insensitively.
/// nullopt when none does (CPUs): the step log then reports no MFU. The one table of peaks:
/// the planner and the trainer's MFU both read data/gpus.json.
std::optional<double> peak_tflops_for_device(const std::string& device_name);

/// Reads a file and parses it with parse_gpu_table. Throws std::runtime_error if unreadable.
std::vector<GpuSpec> load_gpu_table_file(const std::string& path);

/// A measured GEMM: C[M,N] = A[M,K]·B[K,N] at `tflops` achieved.
struct GemmSample {
  double m = 0, n = 0, k = 0, tflops = 0;
};

/// Replaces the GEMM curve of `gpu` by the least-squares fit (in log throughput) of
/// gemm_max_fraction and gemm_half_dim to measured samples (at least 2), so that a measured
/// profile from the real machine overrides the built-in efficiencies. The result write the time
/// model adds (C[m,n] of `element_bytes` at `gpu`'s memory-bound bandwidth) is taken out of each
/// sample first. Returns the fitted GPU.
GpuSpec fit_gemm_curve(GpuSpec gpu, const std::vector<GemmSample>& samples, double element_bytes = 2);

/// Applies a measured profile JSON (written by `loom plan calibrate`) to a GPU:
/// {"device": {GPU-table entry}, "gemm": [{"m","n","k","tflops"}...], "memory_bandwidth_gbs":
/// achieved, "allreduce_busbw_gbs": {"intra_node": x, "inter_node": y}, "collective_latency_us",
/// "kernel_launch_us", "fused_attention": [{"seq", "fwd_tflops", "bwd_tflops"}...]} (all keys
/// optional). A "device" entry replaces `gpu` as the base (CPU ranks, or a GPU not in the
/// table); measured bandwidths set the matching *_fraction as measured/peak; the latencies
/// replace the efficiency's (the bandwidth is applied before the GEMM fit, which uses it; the
/// samples' element type is "measured": {"dtype"}, bf16 when absent); fused-attention samples set fused_attention_{fwd,bwd}_fraction to
/// their mean of tflops / (peak · seq/(seq + gemm_half_dim)). Throws std::invalid_argument
/// naming `source` and the key.
GpuSpec apply_measured_profile(GpuSpec gpu, const std::string& json_text, const std::string& source);

/// The cluster: nodes × GPUs per node of one GPU type.
struct Cluster {
  GpuSpec gpu;
  int num_nodes = 1;
  int gpus_per_node = 8;
  int world() const { return num_nodes * gpus_per_node; }
};

}  // namespace loom::planner
