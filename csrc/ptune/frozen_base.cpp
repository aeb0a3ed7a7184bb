#include "ptune/frozen_base.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstring>
#include <stdexcept>

#include "generate/model_loader.h"
#include "train/checkpoint.h"
#include "train/model_setup.h"

namespace loom::ptune {

FrozenBase find_frozen_base(const config::Recipe& recipe) {
  const std::string& path = recipe.model.prompt.language_model_path;
  generate::GenerateRequest request;
  request.checkpoint = path;
  request.vocab_file = recipe.model.tokenizer.vocab_file;  // empty: the base run's
  request.merge_file = recipe.model.tokenizer.merge_file;
  FrozenBase base;
  base.path = path;
  try {
    base.plan = generate::plan_generation(request);
  } catch (const std::exception& e) {
    // Missing folders, trackers and tokenizer files are bad input of this recipe's field; the
    // tokenizer is named by recipe fields here, not by generate's flags.
    std::string why = e.what();
    for (const std::string flags : {"pass --vocab-file and --merge-file", "--vocab-file is needed", "--merge-file is needed"}) {
      const auto at = why.find(flags);
      if (at != std::string::npos) why.replace(at, flags.size(), "set model.tokenizer.vocab_file and merge_file");
    }
    throw std::invalid_argument(fmt::format("model.language_model_path '{}': {}", path, why));
  }
  return base;
}

void adopt_base_shape(config::Recipe& recipe, const FrozenBase& base, int64_t seq_length) {
  const model::GptConfig shape = generate::inference_config(base.plan.info.layout.model_shape, base.plan.model_options);
  auto& m = recipe.model;
  m.num_layers = shape.num_layers;
  m.hidden_size = shape.hidden_size;
  m.ffn_hidden_size = shape.ffn();
  m.num_attention_heads = shape.num_attention_heads;
  m.max_position_embeddings = shape.max_position_embeddings;
  m.layernorm_epsilon = shape.layernorm_epsilon;
  m.make_vocab_size_divisible_by = shape.make_vocab_size_divisible_by;
  m.encoder_seq_length = seq_length;
  m.data.seq_length = seq_length;
  // The frozen base is a fixed function of its input.
  m.hidden_dropout = 0.0;
  m.attention_dropout = 0.0;
  m.ffn_dropout = 0.0;
  // The base's tokenizer unless the recipe names one (the ids must be the base's).
  if (m.tokenizer.vocab_file.empty()) m.tokenizer.vocab_file = base.plan.vocab_file;
  if (m.tokenizer.merge_file.empty()) m.tokenizer.merge_file = base.plan.merge_file;
}

std::vector<model::GptStage> build_frozen_chunks(const generate::FullCheckpoint& full, const model::GptConfig& config,
                                                 runtime::ProcessGroups& groups, int virtual_stages) {
  auto chunks = train::build_model_chunks(config, groups, virtual_stages, groups.device());
  for (const auto& chunk : chunks) {
    generate::fill_stage_parameters(full, chunk, groups.coords().tp, groups.layout().tensor_parallel());
    for (const auto& p : chunk.parameters()) p.tensor.requires_grad_(false);
  }
  return chunks;
}

namespace {

// FNV-1a over (name, shape, bytes) of named tensors, in the order given.
class TensorDigest {
 public:
  void add(const std::string& name, const at::Tensor& tensor) {
    mix(name.data(), name.size());
    // host: the digest reads every byte once (start and end of a run)
    const at::Tensor host = tensor.detach().to(at::kCPU).contiguous();
    for (int64_t d : host.sizes()) mix(&d, sizeof d);
    mix(host.data_ptr(), host.nbytes());
  }
  std::string hex() const { return fmt::format("{:016x}", h_); }

 private:
  void mix(const void* data, size_t n) {
    const auto* b = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ b[i]) * 1099511628211ull;
  }
  uint64_t h_ = 1469598103934665603ull;
};

}  // namespace

std::string parameters_digest(const std::vector<model::GptStage>& chunks) {
  TensorDigest d;
  for (const auto& chunk : chunks)
    for (const auto& p : chunk.parameters()) d.add(p.name, p.tensor);
  return d.hex();
}

std::string checkpoint_digest(const generate::FullCheckpoint& checkpoint) {
  TensorDigest d;
  for (const auto& [name, tensor] : checkpoint.params) d.add(name, tensor);  // std::map: name order
  return d.hex();
}

}  // namespace loom::ptune
