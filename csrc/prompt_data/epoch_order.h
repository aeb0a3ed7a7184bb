// The sample stream of a prompt-learning run: example ids for as many epochs as training
// takes. Stream index i is epoch e = i / n, position i % n of that epoch's permutation of the
// n examples; epoch e's permutation depends only on (seed, e), so the stream is a pure function
// of the index and a run resumes exactly from its consumed sample count (data::PretrainingSampler
// hands out stream indices, prompt_batch.h turns the examples into rows).
//
// Permutation of epoch e: a std::mt19937_64 seeded with splitmix64(splitmix64(seed) ^ e), then
// a Fisher-Yates shuffle (for i = n-1 down to 1, swap i with j uniform in [0, i], drawn by
// rejection from the generator's 64-bit outputs). Everything is specified here (no
// std::uniform_int_distribution or std::shuffle, whose algorithms differ between standard
// libraries), so the order is the same on every platform. With shuffle off every epoch is
// 0, 1, ..., n-1.
#pragma once
#include <cstdint>
#include <vector>

namespace loom::prompt_data {

class EpochOrder {
 public:
  /// Throws std::invalid_argument when num_examples < 1.
  EpochOrder(int64_t num_examples, uint64_t seed, bool shuffle = true);

  int64_t num_examples() const { return n_; }
  /// Example id at stream index i >= 0 (throws std::out_of_range for i < 0). Keeps the last
  /// epoch's permutation, so consecutive indices cost O(1); not thread-safe.
  int64_t operator[](int64_t i) const;
  /// Epoch of stream index i.
  int64_t epoch_of(int64_t i) const { return i / n_; }
  /// The stream length of `epochs` whole epochs.
  int64_t samples_in(int64_t epochs) const { return epochs * n_; }
  /// Epoch e's permutation of 0..n-1.
  std::vector<int64_t> permutation(int64_t epoch) const;

 private:
  int64_t n_;
  uint64_t seed_;
  bool shuffle_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_;
};

}  // namespace loom::prompt_data
