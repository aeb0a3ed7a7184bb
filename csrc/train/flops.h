// Model FLOPs of a GPT training iteration and the utilisation figures derived from them
// (docs/design/sp_sar.md, "FLOPs"; Korthikanti et al. 2022, §6; Narayanan et al. 2021, §5.1).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace loom::train {

struct GptFlopsShape {
  int64_t global_batch = 0;  ///< B, sequences per iteration
  int64_t seq_length = 0;    ///< s
  int64_t hidden = 0;        ///< h
  int64_t layers = 0;        ///< L
  int64_t vocab = 0;         ///< V (padded vocabulary, as the logits GEMM computes it)
};

/// Model FLOPs per iteration (no recomputation counted): 72·B·L·s·h²·(1 + s/(6h) + V/(12hL)).
double model_flops_per_iteration(const GptFlopsShape& s);

/// Hardware FLOPs with selective recomputation as the paper prints it:
/// 72·B·L·s·h²·(1 + s/(3h) + V/(12hL)).
double selective_recompute_flops_per_iteration(const GptFlopsShape& s);

/// Hardware FLOPs with full recomputation: 96·B·L·s·h²·(1 + s/(6h) + V/(16hL)).
double full_recompute_flops_per_iteration(const GptFlopsShape& s);

/// Peak dense bf16/fp16 tensor TFLOP/s of a known accelerator name ("A100", "H100", "H200",
/// case-insensitive substring match of e.g. torch's device name); nullopt when unknown (CPUs).
std::optional<double> peak_tflops_for_device(const std::string& device_name);

}  // namespace loom::train
