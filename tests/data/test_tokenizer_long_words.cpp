// A long word without spaces is one pre-tokenisation piece: BPE over it must stay O(n log n)
// (the former scan of every pair per merge took 38 s for 0.5 MB) and give the ids the
// reference gives (tests/python/test_data_tokenizer.py compares them live).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>

#include "data/gpt2_tokenizer.h"
#include "data_test_util.h"

using namespace loom::data;
using namespace loom::data::test;

namespace {

/// `n` pseudo-random lower-case letters (a fixed LCG, so every run encodes the same word).
std::string letters(size_t n, uint32_t seed) {
  std::string s(n, 'a');
  for (auto& c : s) {
    seed = seed * 1664525u + 1013904223u;
    c = static_cast<char>('a' + (seed >> 24) % 26);
  }
  return s;
}

}  // namespace

TEST_CASE("half a megabyte without spaces encodes in well under a second per megabyte", "[tokenizer][hostile]") {
  const Gpt2Tokenizer tok(vocab_file(), merges_file());
  for (const std::string& word : {letters(500000, 7), std::string(500000, 'a'), std::string(250000, '7') + "x"}) {
    const auto start = std::chrono::steady_clock::now();
    const auto ids = tok.encode(word);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    INFO("word of " << word.size() << " bytes starting '" << word.substr(0, 8) << "': " << seconds << " s");
    CHECK(seconds < 5.0);
    CHECK(tok.decode(ids) == word);
    CHECK(ids.size() < word.size());  // merges did apply
  }
}

TEST_CASE("long words merge like short ones: the same ids for a word and its repetitions", "[tokenizer]") {
  const Gpt2Tokenizer tok(vocab_file(), merges_file());
  // Pieces separated by spaces are encoded independently; the heap-based merge must agree with
  // the result for the piece alone, whatever its length.
  const std::string word = letters(40, 3);
  const auto alone = tok.encode(word);
  std::string many;
  for (int i = 0; i < 1000; ++i) many += (i ? " " : "") + word;
  const auto ids = tok.encode(many);
  const auto spaced = tok.encode(" " + word);
  std::vector<int32_t> want = alone;
  for (int i = 1; i < 1000; ++i) want.insert(want.end(), spaced.begin(), spaced.end());
  CHECK(ids == want);
}
