// Command-line flags that `loom plan` and `loom plan infer` share: the model (--size or an
// explicit shape) and the hardware (--nodes, --gpus-per-node, --gpu, --gpu-table, --profile,
// --gpu-memory-gib), with one resolution and one set of error messages.
#pragma once
#include <string>

#include "planner/hardware.h"
#include "planner/model_shape.h"

namespace CLI {
class App;
}

namespace loom::planner {

struct ModelFlags {
  double size_b = 0;  ///< --size, billions of parameters (0: not given)
  ModelShape shape;   ///< --num-layers ... (layers/hidden/heads 0: not given)

  /// Adds --size, --num-layers, --hidden-size, --num-attention-heads, --ffn-hidden-size,
  /// --seq-length (described by `seq_length_help`) and --vocab-size.
  void add_to(CLI::App& app, const std::string& seq_length_help);
  /// Whether any model flag other than --seq-length/--vocab-size/--ffn-hidden-size was given.
  bool given() const;
  /// The validated shape: NeMo's GPT-3 bands for --size (keeping --ffn-hidden-size), else the
  /// explicit sizes. Throws std::invalid_argument naming the flag when both or neither are
  /// given, --size < 0, or a size is beyond its bound (--num-layers 16384, --hidden-size 2^20,
  /// --num-attention-heads 2^16, --ffn-hidden-size 2^22, --seq-length and --vocab-size 2^24).
  ModelShape resolve() const;
};

struct HardwareFlags {
  int nodes = 1;
  int gpus_per_node = 0;  ///< 0: the GPU entry's default node size
  std::string gpu_name = "A100-80GB", gpu_table, profile;
  double gpu_memory_gib = 0;  ///< 0: the GPU entry's memory

  /// Adds --nodes, --gpus-per-node, --gpu, --gpu-table, --gpu-memory-gib and --profile.
  void add_to(CLI::App& app);
  /// The device: --gpu from the built-in table and --gpu-table (or, when `builtin_device` is
  /// false, e.g. CPU ranks, only what --profile's "device" entry says), the --profile applied,
  /// --gpu-memory-gib. `profile_text` receives the profile's JSON when one was read. Throws
  /// std::invalid_argument naming the flag (unknown GPU, unreadable or invalid files, a profile
  /// without a device where one is needed, memory < 0).
  GpuSpec resolve_gpu(bool builtin_device = true, std::string* profile_text = nullptr) const;
  /// nodes × GPUs per node of `gpu`. Throws std::invalid_argument for sizes < 1.
  Cluster cluster(const GpuSpec& gpu) const;
};

}  // namespace loom::planner
