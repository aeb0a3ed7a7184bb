#include "planner/run_memory.h"

#include <fmt/format.h>

#include <algorithm>

#include "config/derived.h"
#include "launch/machine_resources.h"
#include "planner/hardware.h"
#include "planner/memory_model.h"
#include "planner/recipe_input.h"

namespace loom::planner {
namespace {

// Private memory of a CPU rank of the tiny recipe before its model (heap, Gloo and OpenMP
// threads), measured at ~100 MiB; 64 MiB keeps the estimate a lower bound. A GPU rank adds its
// CUDA context on the host.
constexpr double kRankProcessBytes = 64.0 * 1048576;
constexpr double kGpuContextHostBytes = 256.0 * 1048576;

// Bytes per sample of the cached indices: sample_index (2 x int64), shuffle_index (int64),
// and, for a blend, dataset_index (int16) + dataset_sample_index (int64). They are held twice
// while built and written (the vectors and the .npy image).
constexpr double kGptIndexBytesPerSample = 24;
constexpr double kBlendIndexBytesPerSample = 10;
constexpr double kBuildCopies = 2;

}  // namespace

RunMemoryEstimate estimate_run_memory(const config::Recipe& r) {
  RunMemoryEstimate e;
  const RecipePlanInput in = plan_input_from_recipe(r);
  TrainingSetup setup = in.setup;
  setup.reserve_gib = 0;
  setup.fragmentation_fraction = 0;
  const WorstStage worst = worst_stage_memory(in.shape, setup, in.layout, 0);
  e.model_state = worst.terms.weights_optimizer;
  e.activations = worst.terms.activations + worst.terms.embedding_logits + worst.terms.transient;
  e.on_device = r.trainer.accelerator == config::Accelerator::kGpu;
  e.process = kRankProcessBytes + (e.on_device ? kGpuContextHostBytes : 0);
  e.local_ranks = int(r.trainer.devices);

  // Every rank loads the indices of the training and validation samples it may draw.
  const double gbs = double(r.model.global_batch_size);
  const double samples = double(r.trainer.max_steps) * gbs + std::max<double>(1, double(r.trainer.limit_val_batches)) * gbs;
  const bool blended = r.model.data.data_prefix.size() > 1;
  e.data_indices = kBuildCopies * samples * (kGptIndexBytesPerSample + (blended ? kBlendIndexBytesPerSample : 0));
  return e;
}

std::optional<std::string> run_does_not_fit(const config::Recipe& r, std::optional<double> host_available,
                                            std::optional<int64_t> process_limit) {
  using launch::format_bytes;
  const RunMemoryEstimate e = estimate_run_memory(r);
  const int ranks = e.local_ranks;
  if (process_limit && ranks > *process_limit) {
    return fmt::format("trainer.devices = {} local ranks exceed this user's process limit (ulimit -u) of {}", ranks,
                       *process_limit);
  }
  const std::string per_rank = fmt::format(
      "per rank: model state {} (weights, gradients, optimizer){}, activations {}{}, data indices {}, process {}",
      format_bytes(e.model_state), e.on_device ? " on the GPU" : "", format_bytes(e.activations),
      e.on_device ? " on the GPU" : "", format_bytes(e.data_indices), format_bytes(e.process));
  const char* remedy =
      "reduce model.num_layers/hidden_size/encoder_seq_length, model.micro_batch_size, trainer.max_steps or "
      "trainer.devices, or raise model.tensor_model_parallel_size/pipeline_model_parallel_size";
  if (host_available && e.host_per_rank() * ranks > *host_available) {
    return fmt::format("the run does not fit this machine: {} local rank{} need at least {} of host memory ({}); "
                       "{} are available: {}",
                       ranks, ranks == 1 ? "" : "s", format_bytes(e.host_per_rank() * ranks), per_rank,
                       format_bytes(*host_available), remedy);
  }
  if (e.on_device && r.cluster.gpu) {
    GpuSpec gpu;
    try {
      gpu = find_gpu(*r.cluster.gpu);
    } catch (const std::exception&) {
      return std::nullopt;  // a GPU the table does not know: nothing to compare with
    }
    const double capacity = gpu.memory_gib * 1073741824.0;
    if (e.device_per_rank() > capacity) {
      return fmt::format("the run does not fit its GPUs: each rank needs at least {} of device memory ({}), "
                         "cluster.gpu {} has {}: {}",
                         format_bytes(e.device_per_rank()), per_rank, gpu.name, format_bytes(capacity), remedy);
    }
  }
  return std::nullopt;
}

}  // namespace loom::planner
