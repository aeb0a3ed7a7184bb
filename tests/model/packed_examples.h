// Examples of random lengths packed into rows (docs/design/finetune.md, "Packed sequences") and
// the same examples unpacked (each alone in its own padded row), for the packed = unpacked
// tests of the model (test_packed_attention.cpp) and the training step (test_packed_pipeline.cpp).
// Built here from the layout rules directly, so that the tests do not lean on the packer.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace loom::model::test {

/// Where example k sits in the packed rows.
struct PackedPlace {
  int64_t row, start, length;
};

struct PackedExamples {
  // Packed: [rows, s] int64 (loss_mask float32): positions restart at 0 per example, segment ids
  // 0, 1, ... per row with the padding after the last example taking the next id.
  at::Tensor tokens, labels, loss_mask, positions, segments;
  // Unpacked: [examples, s], example k in row k from position 0, padding after it (loss 0),
  // positions 0..s-1.
  at::Tensor tokens1, labels1, loss_mask1, positions1;
  std::vector<PackedPlace> places;
};

/// `rows` lists each packed row's example lengths (each row's sum <= s; a shorter row is
/// padded). Tokens and labels are random below `vocab`, a random ~20% of each example's tokens
/// carry no loss (as a prompt's would), padding carries token 0 and no loss.
inline PackedExamples pack_examples(const std::vector<std::vector<int64_t>>& rows, int64_t s, int64_t vocab,
                                    uint64_t seed = 17) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto n_rows = static_cast<int64_t>(rows.size());
  int64_t n_examples = 0;
  for (const auto& r : rows) n_examples += static_cast<int64_t>(r.size());
  PackedExamples p;
  p.tokens = at::zeros({n_rows, s}, at::kLong);
  p.labels = at::zeros({n_rows, s}, at::kLong);
  p.loss_mask = at::zeros({n_rows, s}, at::kFloat);
  p.positions = at::zeros({n_rows, s}, at::kLong);
  p.segments = at::zeros({n_rows, s}, at::kLong);
  p.tokens1 = at::zeros({n_examples, s}, at::kLong);
  p.labels1 = at::zeros({n_examples, s}, at::kLong);
  p.loss_mask1 = at::zeros({n_examples, s}, at::kFloat);
  p.positions1 = at::arange(s, at::kLong).unsqueeze(0).expand({n_examples, s}).contiguous();
  int64_t k = 0;
  for (int64_t row = 0; row < n_rows; ++row) {
    int64_t start = 0, id = 0;
    for (int64_t n : rows[row]) {
      const at::Tensor tokens = at::randint(1, vocab, {n}, gen, at::kLong);
      const at::Tensor labels = at::randint(vocab, {n}, gen, at::kLong);
      const at::Tensor mask = (at::rand({n}, gen) > 0.2).to(at::kFloat);
      p.tokens[row].narrow(0, start, n).copy_(tokens);
      p.labels[row].narrow(0, start, n).copy_(labels);
      p.loss_mask[row].narrow(0, start, n).copy_(mask);
      p.positions[row].narrow(0, start, n).copy_(at::arange(n, at::kLong));
      p.segments[row].narrow(0, start, n).fill_(id);
      p.tokens1[k].narrow(0, 0, n).copy_(tokens);
      p.labels1[k].narrow(0, 0, n).copy_(labels);
      p.loss_mask1[k].narrow(0, 0, n).copy_(mask);
      p.places.push_back({row, start, n});
      start += n;
      ++id;
      ++k;
    }
    if (start < s) p.segments[row].narrow(0, start, s - start).fill_(id);
  }
  return p;
}

/// Three rows of s = 8: two examples and padding, two filling the row, three and padding.
inline std::vector<std::vector<int64_t>> sample_packing() { return {{3, 4}, {5, 3}, {2, 3, 1}}; }

}  // namespace loom::model::test
