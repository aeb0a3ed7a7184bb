#include "config/derived.h"

#include <cctype>
#include <limits>

#include <numeric>

#include <stdexcept>
#include <string>

namespace loom::config {

int64_t world_size(const Recipe& r) { return r.trainer.num_nodes * r.trainer.devices; }

int64_t data_parallel_size(const Recipe& r) {
  const int64_t tp = r.model.tensor_model_parallel_size * r.model.pipeline_model_parallel_size;
  if (tp <= 0) throw std::invalid_argument("data_parallel_size: t*p must be positive");
  return world_size(r) / tp;
}

int64_t num_microbatches(const Recipe& r) {
  const int64_t per_step = r.model.micro_batch_size * data_parallel_size(r);
  if (per_step <= 0) throw std::invalid_argument("num_microbatches: micro_batch_size*d must be positive");
  return r.model.global_batch_size / per_step;
}

int64_t virtual_pipeline_size(const Recipe& r) {
  return r.model.virtual_pipeline_model_parallel_size.value_or(1);
}

int64_t layers_per_chunk(const Recipe& r) {
  return r.model.num_layers / (r.model.pipeline_model_parallel_size * virtual_pipeline_size(r));
}

ModelShape recipe_model_shape(const Recipe& r, int64_t vocab_size) {
  const auto& m = r.model;
  ModelShape shape{m.num_layers,       m.hidden_size,
                   m.num_attention_heads, m.ffn_hidden_size,
                   m.encoder_seq_length,  m.max_position_embeddings,
                   vocab_size,            m.make_vocab_size_divisible_by};
  shape.normalization = m.normalization;
  shape.position_embedding_type = m.position_embedding_type;
  shape.rotary_base = m.rotary_base;
  shape.rotary_percentage = m.rotary_percentage;
  shape.rope_scaling = {m.rope_scaling, m.rope_scaling_factor, m.low_freq_factor, m.high_freq_factor, m.old_context_len};
  shape.kv_channels = m.kv_channels.value_or(0);
  shape.activation = m.activation;
  shape.num_query_groups = m.num_query_groups.value_or(0);
  shape.bias = m.bias;
  shape.qkv_bias = m.qkv_bias;
  shape.share_embeddings_and_output_weights = m.share_embeddings_and_output_weights;
  return shape;
}

namespace {
/// An int-sized layout field; 0 (rejected by the rules, which the recipe check then skips) when
/// the recipe's value does not fit.
int int_size(int64_t value) {
  return value >= std::numeric_limits<int>::min() && value <= std::numeric_limits<int>::max() ? int(value) : 0;
}
std::optional<int> int_size(const std::optional<int64_t>& value) {
  if (!value) return std::nullopt;
  return int_size(*value);
}
}  // namespace

Layout recipe_layout(const Recipe& r) {
  const auto& m = r.model;
  Layout l;
  l.tp = int_size(m.tensor_model_parallel_size);
  l.pp = int_size(m.pipeline_model_parallel_size);
  l.vp = int_size(m.virtual_pipeline_model_parallel_size.value_or(1));
  // The recipe check calls this before rejecting sizes: overflowing products give d = 0.
  int64_t model_parallel = 0, world = 0;
  if (!__builtin_mul_overflow(m.tensor_model_parallel_size, m.pipeline_model_parallel_size, &model_parallel) &&
      !__builtin_mul_overflow(r.trainer.num_nodes, r.trainer.devices, &world) && model_parallel > 0)
    l.dp = int_size(world / model_parallel);
  else
    l.dp = 0;
  l.micro_batch = int_size(m.micro_batch_size);
  l.global_batch = m.global_batch_size;
  l.sequence_parallel = m.sequence_parallel && m.tensor_model_parallel_size > 1;
  l.recompute = {m.activations_checkpoint_granularity, m.activations_checkpoint_method,
                 m.activations_checkpoint_num_layers};
  l.distributed_optimizer = uses_distributed_optimizer(r);
  l.first_stage_layers = int_size(m.num_layers_in_first_pipeline_stage);
  l.last_stage_layers = int_size(m.num_layers_in_last_pipeline_stage);
  return l;
}

int64_t padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tensor_parallel_size) {
  if (vocab_size < 1 || divisible_by < 1 || tensor_parallel_size < 1) {
    throw std::invalid_argument("padded_vocab_size: expected positive arguments, found vocab_size=" +
                                std::to_string(vocab_size) + ", divisible_by=" + std::to_string(divisible_by) +
                                ", tensor_parallel_size=" + std::to_string(tensor_parallel_size));
  }
  const int64_t multiple = std::lcm(divisible_by, tensor_parallel_size);
  return (vocab_size + multiple - 1) / multiple * multiple;
}

int64_t padded_vocab_size(const Recipe& r, int64_t vocab_size) {
  return padded_vocab_size(vocab_size, r.model.make_vocab_size_divisible_by,
                           r.model.tensor_model_parallel_size);
}

bool uses_distributed_optimizer(const Recipe& r) {
  return r.model.use_distributed_optimizer ||
         r.model.optim.name == OptimizerName::kDistributedFusedAdam;
}

std::optional<int64_t> parse_max_time(const std::string& s) {
  // DD:HH:MM:SS: colons at fixed distances from the end, digits elsewhere.
  if (s.size() < 10) return std::nullopt;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool colon_pos = i == s.size() - 3 || i == s.size() - 6 || i == s.size() - 9;
    if (colon_pos ? s[i] != ':' : std::isdigit(static_cast<unsigned char>(s[i])) == 0) return std::nullopt;
  }
  const auto field = [&](size_t from, size_t n) { return std::stoll(s.substr(from, n)); };
  const size_t n = s.size();
  if (n - 9 > 12) return std::nullopt;  // days beyond 10^12 would overflow the seconds
  return ((field(0, n - 9) * 24 + field(n - 8, 2)) * 60 + field(n - 5, 2)) * 60 + field(n - 2, 2);
}

std::string run_directory(const Recipe& r) {
  if (r.exp_manager.explicit_log_dir && !r.exp_manager.explicit_log_dir->empty()) {
    return *r.exp_manager.explicit_log_dir;
  }
  const std::string base = r.exp_manager.exp_dir.value_or("runs");
  return base + "/" + r.exp_manager.name;
}

}  // namespace loom::config
