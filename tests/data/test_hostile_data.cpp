// Damaged or hostile data files (docs/design/hardening.md): a corrupted index cache is rebuilt,
// never trusted; an .idx whose dtype byte was changed is refused; an empty split is named by
// splits_string; sizes that overflow are errors.
#include <catch2/catch.hpp>

#include "data/blended_dataset.h"
#include "data/data_error.h"
#include "data/gpt_data_factory.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/npy.h"
#include "data_test_util.h"
#include "launch/file_util.h"

using namespace loom::data;
using namespace loom::data::test;

namespace {

GptDataConfig small_config(const std::string& cache) {
  GptDataConfig g;
  g.data_prefix = {golden("mcore/corpus_a_text_document")};
  g.splits_string = "1";
  g.seq_length = 8;
  g.seed = 5;
  g.num_samples = {300, std::nullopt, std::nullopt};
  g.index_cache_dir = cache;
  return g;
}

std::vector<std::vector<int64_t>> all_texts(const SampleDataset& ds) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < ds.size(); ++i) out.push_back(ds.text(i));
  return out;
}

/// The one cache file of `dir` whose name ends with `suffix`.
std::string cache_file(const std::string& dir, const std::string& suffix) {
  for (const auto& file : loom::launch::list_directory(dir)) {
    const std::string name = dir + "/" + file;
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return name;
  }
  FAIL("no cache file *" << suffix << " in " << dir);
  return "";
}

}  // namespace

TEST_CASE("a shuffle index cache with out-of-range values is rebuilt, not read", "[data][hostile]") {
  TempDir cache;
  const auto fresh = build_gpt_datasets(small_config(cache.path));
  const auto want = all_texts(*fresh.train);
  const std::string shuffle = cache_file(cache.path, "shuffle_index.npy");
  NpyArray a = read_npy(shuffle);
  a.data[3] = 1 << 30;  // was a segfault in GptDataset::text
  write_npy(shuffle, a.data, a.shape, a.descr);

  const auto again = build_gpt_datasets(small_config(cache.path));
  REQUIRE(again.warnings.size() == 1);
  CHECK_THAT(again.warnings[0], Catch::Contains("is damaged") && Catch::Contains("shuffle_index[3] = 1073741824") &&
                                    Catch::Contains("rebuilt it"));
  CHECK(all_texts(*again.train) == want);
  // Rebuilt on disk too: the next open trusts it again.
  const auto third = build_gpt_datasets(small_config(cache.path));
  CHECK(third.warnings.empty());
  CHECK(std::dynamic_pointer_cast<const GptDataset>(third.train)->loaded_from_cache());
}

TEST_CASE("sample and document index caches that cannot be the data are rebuilt", "[data][hostile]") {
  TempDir cache;
  const auto fresh = build_gpt_datasets(small_config(cache.path));
  const auto want = all_texts(*fresh.train);
  struct Damage {
    const char* file;
    int64_t index, value;
    const char* says;
  };
  for (const Damage& d : {Damage{"sample_index.npy", 9, 100000, "token offsets"},
                          Damage{"sample_index.npy", 8, -5, "document positions"},
                          Damage{"document_index.npy", 0, 999999, "outside the split's sequences"}}) {
    INFO(d.file << "[" << d.index << "] = " << d.value);
    const std::string path = cache_file(cache.path, d.file);
    NpyArray a = read_npy(path);
    const NpyArray original = a;
    a.data[static_cast<size_t>(d.index)] = d.value;
    write_npy(path, a.data, a.shape, a.descr == "<i4" && d.value > INT32_MAX ? "<i8" : a.descr);
    const auto again = build_gpt_datasets(small_config(cache.path));
    REQUIRE(again.warnings.size() == 1);
    CHECK_THAT(again.warnings[0], Catch::Contains(d.says));
    CHECK(all_texts(*again.train) == want);
  }
}

TEST_CASE("a cache whose header's dtype was changed is rebuilt", "[data][hostile]") {
  TempDir cache;
  const auto fresh = build_gpt_datasets(small_config(cache.path));
  const std::string path = cache_file(cache.path, "shuffle_index.npy");
  std::string bytes = read_bytes(path);
  const size_t at = bytes.find("'<i4'");
  REQUIRE(at != std::string::npos);
  bytes.replace(at, 5, "'<i2'");  // the same bytes read as twice as many int16 values
  write_bytes(path, bytes);
  const auto again = build_gpt_datasets(small_config(cache.path));
  REQUIRE(again.warnings.size() == 1);
  CHECK_THAT(again.warnings[0], Catch::Contains("bytes after the") && Catch::Contains("disagree with the file size"));
  CHECK(all_texts(*again.train) == all_texts(*fresh.train));
}

TEST_CASE("a blending index cache naming a missing component is rebuilt", "[data][hostile]") {
  TempDir cache;
  GptDataConfig g = small_config(cache.path);
  g.data_prefix = {"0.3", golden("mcore/corpus_a_text_document"), "0.7", golden("mcore/corpus_b_text_document")};
  const auto fresh = build_gpt_datasets(g);
  const auto want = all_texts(*fresh.train);
  const std::string path = cache_file(cache.path, "BlendedDataset-dataset_index.npy");
  NpyArray a = read_npy(path);
  a.data[7] = 5;  // only components 0 and 1 exist: was an out-of-bounds write while counting
  write_npy(path, a.data, a.shape, a.descr);
  const auto again = build_gpt_datasets(g);
  REQUIRE(again.warnings.size() == 1);
  CHECK_THAT(again.warnings[0], Catch::Contains("dataset_index[7] = 5 names no component"));
  CHECK(all_texts(*again.train) == want);
}

TEST_CASE("an .idx whose dtype byte was changed to another valid code is refused", "[data][hostile]") {
  TempDir dir;
  {
    IndexedDatasetWriter w(dir / "ok", DType::kUInt16);
    w.add_document({5, 6, 7});
    w.add_document({8, 9});
  }
  const std::string idx = read_bytes(dir / "ok.idx"), bin = read_bytes(dir / "ok.bin");
  for (const auto& [code, name] : std::vector<std::pair<int, std::string>>{{4, "int32"}, {1, "uint8"}, {5, "int64"}}) {
    INFO("dtype code " << code);
    std::string s = idx;
    s[17] = static_cast<char>(code);
    write_bytes(dir / "x.idx", s);
    write_bytes(dir / "x.bin", bin);
    CHECK_THROWS_WITH(IndexedDataset(dir / "x"),
                      Catch::Contains("x.idx") && Catch::Contains("dtype code " + std::to_string(code) + " (" + name) &&
                          Catch::Contains("the sequence pointers advance 2 bytes per token"));
  }
  // One sequence gives no pointer stride: the .bin's size per token tells.
  {
    IndexedDatasetWriter w(dir / "one", DType::kUInt16);
    w.add_document({5, 6, 7, 8});
  }
  std::string one = read_bytes(dir / "one.idx");
  one[17] = 4;
  write_bytes(dir / "one.idx", one);
  CHECK_THROWS_WITH(IndexedDataset(dir / "one"),
                    Catch::Contains("dtype code 4 (int32") && Catch::Contains("holds 8 bytes for 4 tokens"));
  // uint16 -> int16 keeps the size: token ids above 32767 turn negative, and the range check says why.
  {
    IndexedDatasetWriter w(dir / "big", DType::kUInt16);
    w.add_document({5, 50000});
  }
  std::string big = read_bytes(dir / "big.idx");
  big[17] = 3;
  write_bytes(dir / "big.idx", big);
  IndexedDataset signed_view(dir / "big");
  CHECK_THROWS_WITH(signed_view.check_token_range(50257),
                    Catch::Contains("holds token id -15536") && Catch::Contains("signed dtype int16"));
}

TEST_CASE("a float token with no integer value is an error naming the file", "[data][hostile]") {
  // Megatron's float dtypes are valid .idx codes; a value beyond int64 cannot be converted.
  TempDir dir;
  IndexedDatasetWriter::write_index(dir / "f.idx", DType::kFloat32, {2}, {0, 1});
  const float tokens[2] = {5.0f, 1e30f};
  write_bytes(dir / "f.bin", std::string(reinterpret_cast<const char*>(tokens), sizeof tokens));
  IndexedDataset ds(dir / "f");
  std::vector<int64_t> out;
  ds.read(0, 0, 1, out);
  CHECK(out == std::vector<int64_t>{5});
  CHECK_THROWS_WITH(ds.read(0), Catch::Contains("f.bin") && Catch::Contains("position 1") &&
                                    Catch::Contains("not a token id"));
}

TEST_CASE("an empty split is named by splits_string and the split", "[data][hostile]") {
  GptDataConfig g;
  g.data_prefix = {golden("mcore/corpus_a_text_document")};
  g.splits_string = "949,50,1";  // 120 documents: the test split rounds to none
  g.seq_length = 8;
  g.num_samples = {10, 10, 10};
  CHECK_THROWS_WITH(build_gpt_datasets(g), Catch::Contains("splits_string \"949,50,1\" gives the test split of") &&
                                               Catch::Contains("0 tokens; a split needs at least 2"));
}

TEST_CASE("sample counts whose tokens overflow 64 bits are an error", "[data][hostile]") {
  GptDataConfig g = small_config("");
  g.num_samples = {int64_t{1} << 61, std::nullopt, std::nullopt};
  CHECK_THROWS_WITH(build_gpt_datasets(g), Catch::Contains("overflow a 64-bit token count"));
}

TEST_CASE(".npy headers with overflowing or non-numeric shapes are refused", "[data][hostile]") {
  TempDir dir;
  write_npy(dir / "a.npy", {1, 2, 3}, {3}, "<i8");
  const std::string good = read_bytes(dir / "a.npy");
  auto with_shape = [&](const std::string& shape) {
    std::string s = good;
    const size_t at = s.find("(3,)");
    s.replace(at, 4, shape);
    // Keep the header length: pad or trim the spaces before the newline.
    const size_t nl = s.find('\n');
    const long diff = static_cast<long>(shape.size()) - 4;
    if (diff > 0) s.erase(nl - static_cast<size_t>(diff), static_cast<size_t>(diff));
    if (diff < 0) s.insert(nl, static_cast<size_t>(-diff), ' ');
    write_bytes(dir / "b.npy", s);
    return dir / "b.npy";
  };
  CHECK_THROWS_WITH(read_npy(with_shape("(4294967296, 4294967296)")), Catch::Contains("overflows"));
  CHECK_THROWS_WITH(read_npy(with_shape("(x,)")), Catch::Contains("holds 'x', expected a size"));
  CHECK_THROWS_WITH(read_npy(with_shape("(2,)")), Catch::Contains("8 bytes after the 2 elements"));
  CHECK_THROWS_WITH(read_npy(with_shape("(9,)")), Catch::Contains("truncated"));
}
