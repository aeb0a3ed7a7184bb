// Megatron indexed dataset: exact bytes, reading megatron-core's files, 64-bit pointers, and
// clear errors for corrupt input.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "data/data_error.h"
#include "data/indexed_dataset.h"
#include "data_test_util.h"

using namespace loom::data;
using namespace loom::data::test;

namespace {
template <class T>
std::string le(T v) {
  std::string s(sizeof v, '\0');
  std::memcpy(s.data(), &v, sizeof v);
  return s;
}
}  // namespace

TEST_CASE("writer produces the documented .idx bytes", "[indexed]") {
  TempDir dir;
  {
    IndexedDatasetWriter w(dir / "x", DType::kUInt16);
    w.add_document({1, 2, 3});
    w.add_document({});                 // empty document: no sequence, one more document index
    w.add_document({7, 8, 9, 10}, {1, 3});
    w.finalize();
  }
  std::string want = std::string("MMIDIDX\0\0", 9) + le<uint64_t>(1) + std::string(1, '\x08') + le<uint64_t>(3) +
                     le<uint64_t>(4);
  for (int32_t l : {3, 1, 3}) want += le(l);
  for (int64_t p : {0, 6, 8}) want += le(p);
  for (int64_t d : {0, 1, 1, 3}) want += le(d);
  CHECK(read_bytes(dir / "x.idx") == want);
  std::string bin;
  for (uint16_t t : {1, 2, 3, 7, 8, 9, 10}) bin += le(t);
  CHECK(read_bytes(dir / "x.bin") == bin);

  IndexedDataset ds(dir / "x");
  CHECK(ds.dtype() == DType::kUInt16);
  CHECK(ds.num_sequences() == 3);
  CHECK(ds.num_documents() == 3);
  CHECK(ds.num_tokens() == 7);
  CHECK(ds.read(2) == std::vector<int64_t>{8, 9, 10});
  std::vector<int64_t> part;
  ds.read(0, 1, 2, part);
  CHECK(part == std::vector<int64_t>{2, 3});
  CHECK_THROWS_AS(ds.read(3), std::out_of_range);
  part.clear();
  CHECK_THROWS_AS(ds.read(0, 2, 2, part), std::out_of_range);
}

TEST_CASE("reads megatron-core's files and rewrites them byte for byte", "[indexed][megatron]") {
  for (const char* name : {"corpus_a_text_document", "corpus_b_text_document"}) {
    const std::string prefix = golden(std::string("mcore/") + name);
    IndexedDataset ds(prefix);
    CHECK(ds.dtype() == DType::kUInt16);
    ds.check_token_range(50257);
    TempDir dir;
    IndexedDatasetWriter w(dir / "copy", ds.dtype());
    std::vector<int32_t> toks;
    for (size_t d = 0; d < ds.num_documents(); ++d) {
      toks.clear();
      std::vector<int32_t> lens;
      for (int64_t s = ds.document_indices()[d]; s < ds.document_indices()[d + 1]; ++s) {
        for (int64_t t : ds.read(s)) toks.push_back(static_cast<int32_t>(t));
        lens.push_back(ds.sequence_lengths()[s]);
      }
      CHECK(toks.back() == 50256);  // documents end with EOD
      w.add_document(toks, lens);
    }
    w.finalize();
    CHECK(read_bytes(dir / "copy.idx") == read_bytes(prefix + ".idx"));
    CHECK(read_bytes(dir / "copy.bin") == read_bytes(prefix + ".bin"));
  }
}

TEST_CASE("pointers beyond 2^31 bytes (sparse .bin)", "[indexed]") {
  TempDir dir;
  // Three int32 sequences of 2^30 tokens: pointers 0, 4 GiB, 8 GiB; .bin is 12 GiB but sparse.
  const int32_t len = 1 << 30;
  IndexedDatasetWriter::write_index(dir / "big.idx", DType::kInt32, {len, len, len}, {0, 1, 3});
  const int64_t end = int64_t{3} * len * 4;
  int fd = ::open((dir / "big.bin").c_str(), O_CREAT | O_WRONLY, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, end) == 0);
  const int32_t marks[2] = {123456, 50256};
  REQUIRE(::pwrite(fd, marks, sizeof marks, end - 8) == 8);  // last two tokens of sequence 2
  ::close(fd);

  IndexedDataset index_only(dir / "big", /*open_bin=*/false);
  CHECK(index_only.sequence_pointers()[1] == int64_t{4} << 30);
  CHECK(index_only.sequence_pointers()[2] == int64_t{8} << 30);
  CHECK(index_only.num_tokens() == int64_t{3} << 30);

  IndexedDataset ds(dir / "big");
  std::vector<int64_t> tail;
  ds.read(2, len - 2, 2, tail);
  CHECK(tail == std::vector<int64_t>{123456, 50256});
}

TEST_CASE("corrupt index files give clear errors", "[indexed][errors]") {
  TempDir dir;
  {
    IndexedDatasetWriter w(dir / "ok", DType::kUInt16);
    w.add_document({5, 6, 7});
    w.add_document({8});
  }
  const std::string good = read_bytes(dir / "ok.idx");
  const std::string bin = read_bytes(dir / "ok.bin");
  auto variant = [&](const std::string& name, const std::string& idx) {
    write_bytes(dir / (name + ".idx"), idx);
    write_bytes(dir / (name + ".bin"), bin);
    return dir / name;
  };
  std::string s = good;
  s[0] = 'X';
  CHECK_THROWS_WITH(IndexedDataset(variant("magic", s)), Catch::Contains("magic.idx") && Catch::Contains("bad magic"));
  s = good;
  s[9] = 2;
  CHECK_THROWS_WITH(IndexedDataset(variant("version", s)), Catch::Contains("unsupported version 2, expected 1"));
  s = good;
  s[17] = 9;
  CHECK_THROWS_WITH(IndexedDataset(variant("dtype", s)), Catch::Contains("unknown dtype code 9"));
  CHECK_THROWS_WITH(IndexedDataset(variant("trunc", good.substr(0, good.size() - 3))),
                    Catch::Contains("trunc.idx") && Catch::Contains("truncated"));
  CHECK_THROWS_WITH(IndexedDataset(variant("tiny", good.substr(0, 20))), Catch::Contains("truncated: 20 bytes"));
  s = good;
  s[18] = 100;  // claims 100 sequences
  CHECK_THROWS_WITH(IndexedDataset(variant("count", s)), Catch::Contains("header declares 100 sequences"));
  s = good;
  s[s.size() - 8] = 5;  // last document index 5 != 2 sequences
  CHECK_THROWS_WITH(IndexedDataset(variant("docs", s)), Catch::Contains("last document index = 5"));
  // .bin shorter than the index says.
  write_bytes(dir / "shortbin.idx", good);
  write_bytes(dir / "shortbin.bin", bin.substr(0, 5));
  CHECK_THROWS_WITH(IndexedDataset(dir / "shortbin"), Catch::Contains("shortbin.bin") && Catch::Contains("truncated"));
  CHECK_THROWS_WITH(IndexedDataset(dir / "missing"), Catch::Contains("missing.idx"));
  CHECK_THROWS_AS(IndexedDataset(variant("magic2", std::string(40, 'Q'))), DataError);
}

TEST_CASE("token ids outside the vocabulary are reported", "[indexed][errors]") {
  TempDir dir;
  {
    IndexedDatasetWriter w(dir / "v", DType::kUInt16);
    w.add_document({1, 2});
    w.add_document({3, 60000, 4});
  }
  IndexedDataset ds(dir / "v");
  CHECK_NOTHROW(ds.check_token_range(60001));
  CHECK_THROWS_WITH(ds.check_token_range(50257), Catch::Contains("v.bin") && Catch::Contains("sequence 1 position 1") &&
                                                     Catch::Contains("token id 60000"));
  IndexedDatasetWriter w(dir / "w", DType::kUInt16);
  CHECK_THROWS_WITH(w.add_document({70000}), Catch::Contains("does not fit dtype uint16"));
}

TEST_CASE("token dtype follows the vocabulary size", "[indexed]") {
  CHECK(token_dtype_for_vocab(50257) == DType::kUInt16);
  CHECK(token_dtype_for_vocab(65499) == DType::kUInt16);
  CHECK(token_dtype_for_vocab(65500) == DType::kInt32);
  CHECK(dtype_size(DType::kFloat64) == 8);
}
