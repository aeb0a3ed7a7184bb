#include "planner/plan_flags.h"

#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "planner/text_io.h"

namespace loom::planner {

void ModelFlags::add_to(CLI::App& app, const std::string& seq_length_help) {
  app.add_option("--size", size_b, "GPT-3 model size in billions of parameters (shape from NeMo's bands)");
  app.add_option("--num-layers", shape.num_layers, "Transformer layers L");
  app.add_option("--hidden-size", shape.hidden_size, "Hidden size h");
  app.add_option("--num-attention-heads", shape.num_attention_heads, "Attention heads a");
  app.add_option("--ffn-hidden-size", shape.ffn_hidden_size, "MLP inner size (default 4h)");
  app.add_option("--seq-length", shape.seq_length, seq_length_help)->capture_default_str();
  app.add_option("--vocab-size", shape.vocab_size, "Padded vocabulary size V")->capture_default_str();
}

bool ModelFlags::given() const {
  return size_b != 0 || shape.num_layers || shape.hidden_size || shape.num_attention_heads;
}

namespace {

// Largest sizes the flags accept: beyond any model planned today (GPT-3 175B is L96 h12288),
// and small enough that the planner's products (4h, h², s·V) stay far from overflowing.
struct SizeFlag {
  const char* flag;
  int64_t value, min, max;
};

void check_sizes(std::initializer_list<SizeFlag> flags) {
  for (const SizeFlag& f : flags)
    if (f.value < f.min || f.value > f.max)
      throw std::invalid_argument(fmt::format("{}: expected an integer in [{}, {}], found {}", f.flag, f.min, f.max,
                                              f.value));
}

}  // namespace

ModelShape ModelFlags::resolve() const {
  check_sizes({{"--num-layers", shape.num_layers, 0, 16384},
               {"--hidden-size", shape.hidden_size, 0, 1 << 20},
               {"--num-attention-heads", shape.num_attention_heads, 0, 1 << 16},
               {"--ffn-hidden-size", shape.ffn_hidden_size, 0, 1 << 22},
               {"--seq-length", shape.seq_length, 1, 1 << 24},
               {"--vocab-size", shape.vocab_size, 1, 1 << 24}});
  const bool explicit_shape = shape.num_layers || shape.hidden_size || shape.num_attention_heads;
  if (size_b > 0 && explicit_shape)
    throw std::invalid_argument("give either --size or --num-layers/--hidden-size/--num-attention-heads, not both");
  if (size_b < 0) throw std::invalid_argument(fmt::format("--size must be > 0, found {}", size_b));
  if (size_b == 0 && !explicit_shape)
    throw std::invalid_argument(
        "the model is missing: give --size or --num-layers, --hidden-size and --num-attention-heads");
  if (size_b == 0) {  // an explicit shape needs all three sizes
    std::string missing;
    for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"--num-layers", shape.num_layers},
                                      {"--hidden-size", shape.hidden_size},
                                      {"--num-attention-heads", shape.num_attention_heads}})
      if (value == 0) missing += std::string(missing.empty() ? "" : ", ") + flag;
    if (!missing.empty())
      throw std::invalid_argument(fmt::format("the model's shape is incomplete: give {} too (or --size)", missing));
  }
  ModelShape out = shape;
  if (size_b > 0) {
    out = gpt3_shape_for_size(size_b, shape.seq_length, shape.vocab_size);
    out.ffn_hidden_size = shape.ffn_hidden_size;
  }
  out.max_position_embeddings = out.seq_length;  // the position table of the recipe the planner writes
  out.validate();
  return out;
}

void HardwareFlags::add_to(CLI::App& app) {
  app.add_option("--nodes", nodes, "Number of nodes")->capture_default_str();
  app.add_option("--gpus-per-node", gpus_per_node, "GPUs per node (default: the GPU profile's)");
  app.add_option("--gpu", gpu_name, "GPU type: A100-40GB, A100-80GB, H100, H200 or one from --gpu-table")
      ->capture_default_str();
  app.add_option("--gpu-table", gpu_table, "JSON file of extra GPU profiles (format of csrc/planner/data/gpus.json)");
  app.add_option("--gpu-memory-gib", gpu_memory_gib, "Override the GPU's memory (GiB); any size is accepted");
  app.add_option("--profile", profile,
                 "Measured profile JSON from `loom plan calibrate` (device entry, gemm samples, bandwidths, "
                 "latencies) that replaces the built-in efficiencies");
}

GpuSpec HardwareFlags::resolve_gpu(bool builtin_device, std::string* profile_text) const {
  std::vector<GpuSpec> extra;
  if (!gpu_table.empty()) extra = load_gpu_table_file(gpu_table);
  GpuSpec gpu = builtin_device ? find_gpu(gpu_name, extra) : GpuSpec{};
  if (!profile.empty()) {
    const std::string text = read_text(profile, "--profile");
    gpu = apply_measured_profile(gpu, text, profile);
    if (profile_text) *profile_text = text;
  }
  if (gpu.peak_tflops <= 0)
    throw std::invalid_argument(fmt::format("--profile {}: has no 'device' entry to plan CPU ranks with", profile));
  if (gpu_memory_gib < 0)
    throw std::invalid_argument(fmt::format("--gpu-memory-gib must be > 0, found {}", gpu_memory_gib));
  if (gpu_memory_gib > 0) gpu.memory_gib = gpu_memory_gib;
  return gpu;
}

Cluster HardwareFlags::cluster(const GpuSpec& gpu) const {
  if (nodes < 1) throw std::invalid_argument(fmt::format("--nodes must be >= 1, found {}", nodes));
  if (gpus_per_node < 0)
    throw std::invalid_argument(fmt::format("--gpus-per-node must be >= 1, found {}", gpus_per_node));
  Cluster c;
  c.gpu = gpu;
  c.num_nodes = nodes;
  c.gpus_per_node = gpus_per_node > 0 ? gpus_per_node : gpu.gpus_per_node;
  return c;
}

}  // namespace loom::planner
