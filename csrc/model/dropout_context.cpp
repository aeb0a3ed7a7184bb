#include "model/dropout_context.h"

#include <stdexcept>
#include <string>

namespace loom::model {

int64_t DropoutContext::global_rows(int64_t b_local) const {
  const int64_t rows = global_batch < 0 ? b_local : global_batch;
  if (batch_offset < 0 || batch_offset + b_local > rows)
    throw std::invalid_argument("DropoutContext: micro-batch rows [" +
                                std::to_string(batch_offset) + ", " +
                                std::to_string(batch_offset + b_local) +
                                ") do not fit a global batch of " + std::to_string(rows));
  return rows;
}

ops::DropoutSpec DropoutContext::hidden(double p, int64_t layer, uint32_t site,
                                        int64_t seq_length, int64_t seq_offset, int64_t b_local,
                                        int64_t hidden_size) const {
  ops::DropoutSpec spec;
  spec.p = training ? p : 0.0;
  spec.key.seed = seed;
  spec.key.stream = ops::make_dropout_stream(step, layer, site);
  spec.block.global_shape = {seq_length, global_rows(b_local), hidden_size};
  spec.block.offset = {seq_offset, batch_offset, 0};
  return spec;
}

ops::DropoutSpec DropoutContext::attention(double p, int64_t layer, int64_t b_local,
                                           int64_t heads, int64_t head_offset,
                                           int64_t s) const {
  ops::DropoutSpec spec;
  spec.p = training ? p : 0.0;
  spec.key.seed = seed;
  spec.key.stream = ops::make_dropout_stream(step, layer, ops::kDropoutSiteAttentionProbs);
  spec.block.global_shape = {global_rows(b_local), heads, s, s};
  spec.block.offset = {batch_offset, head_offset, 0, 0};
  return spec;
}

}  // namespace loom::model
