#include "planner/model_shape.h"

#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace loom::planner {

double gpt3_size_formula(int num_layers, int hidden_size, int seq_length, int vocab_size) {
  const double L = num_layers, h = hidden_size;
  return 12 * L * h * h * (1 + 13 / (12 * h) + (double(vocab_size) + seq_length) / (12 * L * h));
}

ModelShape gpt3_shape_for_size(double billions, int seq_length, int vocab_size) {
  if (!(billions > 0) || billions > 1105)
    throw std::invalid_argument(fmt::format(
        "--size: GPT-3 shapes are defined for 0 < size <= 1105 billion parameters, found {}",
        billions));
  struct Band { double below; int hidden, heads; };
  static const Band bands[] = {
      {0.25, 768, 12},    {0.5, 1024, 16},    {1, 1536, 16},     {2, 2048, 16},
      {3, 2560, 32},      {4.5, 3072, 32},    {8, 4096, 32},     {15, 5120, 40},
      {25, 6144, 48},     {52, 8192, 64},     {105, 10240, 80},  {205, 12288, 96},
      {805, 20480, 128},  {1105.0001, 25600, 160}};
  const Band* band = nullptr;
  for (const auto& b : bands)
    if (billions < b.below) { band = &b; break; }

  // Candidate layer counts by preference; each family is tried with a margin widening in
  // 1% steps (powers of two get ten steps, the others six, as the reference tool does).
  std::vector<std::pair<std::vector<int>, int>> families;
  std::vector<int> pow2, mult16, mult2, mult5, any;
  for (int e = 1; e < 10; ++e) pow2.push_back(1 << e);
  for (int l = 16; l <= 200; l += 16) mult16.push_back(l);
  for (int l = 2; l <= 200; l += 2) mult2.push_back(l);
  for (int l = 5; l <= 200; l += 5) mult5.push_back(l);
  for (int l = 1; l < 200; ++l) any.push_back(l);
  families = {{pow2, 10}, {mult16, 6}, {mult2, 6}, {mult5, 6}, {any, 10}};
  const double target = billions * 1e9;
  for (const auto& [counts, steps] : families) {
    for (int step = 0; step < steps; ++step) {
      const double margin = 0.01 * (step + 1);
      for (int layers : counts) {
        const double size = gpt3_size_formula(layers, band->hidden, seq_length, vocab_size);
        if (size > target * (1 - margin) && size < target * (1 + margin)) {
          ModelShape shape;
          shape.num_layers = layers;
          shape.hidden_size = band->hidden;
          shape.num_attention_heads = band->heads;
          shape.seq_length = shape.max_position_embeddings = seq_length;
          shape.vocab_size = vocab_size;
          return shape;
        }
      }
    }
  }
  throw std::invalid_argument(fmt::format(
      "--size {}: no layer count in 1..199 gives a GPT-3 model within 10% of that size at "
      "hidden size {}", billions, band->hidden));
}

}  // namespace loom::planner
