// The preprocessing pipeline (library behind `loom preprocess`): output naming, document
// splitting, EOD, identical output for any worker count, errors with file and line.
#include <catch2/catch.hpp>

#include "data/data_error.h"
#include "data/gpt2_tokenizer.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "data_test_util.h"

using namespace loom::data;
using namespace loom::data::test;

namespace {
PreprocessOptions options(const std::string& input, const std::string& prefix) {
  PreprocessOptions o;
  o.input = input;
  o.output_prefix = prefix;
  o.vocab_file = vocab_file();
  o.merge_file = merges_file();
  o.append_eod = true;
  return o;
}
const Gpt2Tokenizer& gpt2() {
  static Gpt2Tokenizer tok(vocab_file(), merges_file());
  return tok;
}
}  // namespace

TEST_CASE("plain text: documents split on blank lines, EOD appended", "[preprocess]") {
  TempDir dir;
  write_bytes(dir / "in.txt", "First line\nsecond line\n\n\n  \nThird doc here\n\nLast one");
  auto r = preprocess(options(dir / "in.txt", dir / "out"));
  REQUIRE(r.output_prefixes == std::vector<std::string>{dir / "out_text_document"});
  CHECK(r.documents == 3);
  IndexedDataset ds(dir / "out_text_document");
  CHECK(ds.dtype() == DType::kUInt16);
  REQUIRE(ds.num_sequences() == 3);
  const char* docs[3] = {"First line\nsecond line", "Third doc here", "Last one"};
  for (int d = 0; d < 3; ++d) {
    auto want = gpt2().encode(docs[d]);
    want.push_back(50256);
    const auto got = ds.read(d);
    CHECK(std::vector<int64_t>(want.begin(), want.end()) == got);
  }
}

TEST_CASE("JSONL: keys, arrays as sequences, any worker count gives identical bytes", "[preprocess]") {
  TempDir dir;
  std::string jsonl;
  for (int i = 0; i < 300; ++i)
    jsonl += "{\"text\": \"Document number " + std::to_string(i) + " says h\\u00e9llo.\", \"title\": \"T" +
             std::to_string(i) + "\"}\n";
  jsonl += "{\"text\": \"\", \"title\": [\"a b\", \"c\"]}\n";
  write_bytes(dir / "in.jsonl", jsonl);
  auto o = options(dir / "in.jsonl", dir / "one");
  o.json_keys = {"text", "title"};
  o.chunk_bytes = 512;  // many chunks
  auto r1 = preprocess(o);
  CHECK(r1.documents == 301);
  o.output_prefix = dir / "four";
  o.workers = 4;
  preprocess(o);
  for (const char* key : {"_text_document", "_title_document"}) {
    CHECK(read_bytes(dir / (std::string("one") + key + ".bin")) == read_bytes(dir / (std::string("four") + key + ".bin")));
    CHECK(read_bytes(dir / (std::string("one") + key + ".idx")) == read_bytes(dir / (std::string("four") + key + ".idx")));
  }
  IndexedDataset text(dir / "one_text_document"), title(dir / "one_title_document");
  CHECK(text.num_documents() == 301);
  CHECK(text.num_sequences() == 300);  // the empty text adds a document boundary, no sequence
  auto want = gpt2().encode("Document number 7 says h\xC3\xA9llo.");
  want.push_back(50256);
  CHECK(text.read(7) == std::vector<int64_t>(want.begin(), want.end()));
  // The array document: one sequence per element, EOD on the last.
  CHECK(title.num_sequences() == 302);
  CHECK(title.read(300) == std::vector<int64_t>{64, 275});
  CHECK(title.read(301) == std::vector<int64_t>{66, 50256});
}

TEST_CASE("preprocess errors name the file and line", "[preprocess][errors]") {
  TempDir dir;
  write_bytes(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": oops}\n");
  CHECK_THROWS_WITH(preprocess(options(dir / "bad.jsonl", dir / "o")),
                    Catch::Contains("bad.jsonl' line 2") && Catch::Contains("not a JSON object"));
  write_bytes(dir / "key.jsonl", "{\"text\": \"ok\"}\n\n{\"body\": \"x\"}\n");
  CHECK_THROWS_WITH(preprocess(options(dir / "key.jsonl", dir / "o")),
                    Catch::Contains("key.jsonl' line 3") && Catch::Contains("no key \"text\""));
  write_bytes(dir / "utf.jsonl", "{\"text\": \"bad \xff byte\"}\n");
  CHECK_THROWS_WITH(preprocess(options(dir / "utf.jsonl", dir / "o")), Catch::Contains("utf.jsonl' line 1"));
  CHECK_THROWS_AS(preprocess(options(dir / "absent.txt", dir / "o")), DataError);
  auto o = options(dir / "key.jsonl", dir / "o");
  o.workers = 0;
  CHECK_THROWS_AS(preprocess(o), DataError);
}
