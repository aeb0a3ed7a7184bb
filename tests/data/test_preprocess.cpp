// The preprocessing pipeline (library behind `loom preprocess`): output naming, document
// splitting, EOD, identical output for any worker count, errors with file and line.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include "data/data_error.h"
#include "data/gpt2_tokenizer.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "data/recipe_tokenizer.h"
#include "data_test_util.h"

using namespace loom::data;
using namespace loom::data::test;

namespace {
PreprocessOptions options(const std::string& input, const std::string& prefix) {
  PreprocessOptions o;
  o.inputs = {input};
  o.output_prefix = prefix;
  o.tokenizer.vocab_file = vocab_file();
  o.tokenizer.merge_file = merges_file();
  o.append_eod = true;
  return o;
}
bool file_exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
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
  o.inputs = {dir / "in.jsonl"};
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
  // Nothing is left behind by a failed run.
  CHECK_FALSE(file_exists(dir / "o_text_document.bin"));
  CHECK_FALSE(file_exists(dir / "o_text_document.idx"));
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

TEST_CASE("several inputs are one corpus, a partition's share is contiguous", "[preprocess]") {
  TempDir dir;
  std::string all;
  for (int f = 0; f < 3; ++f) {
    std::string body;
    for (int i = 0; i < 40; ++i) body += "{\"text\": \"file " + std::to_string(f) + " doc " + std::to_string(i) + "\"}\n";
    write_bytes(dir / ("in" + std::to_string(f) + ".jsonl"), body);
  }
  write_bytes(dir / "notes.txt", "A plain document.\n\nAnother one.\n");
  auto o = options(dir / "in*.jsonl", dir / "whole");
  o.inputs.push_back(dir / "notes.txt");
  const auto whole = preprocess(o);
  CHECK(whole.files == 4);
  CHECK(whole.documents == 122);
  IndexedDataset ds(dir / "whole_text_document");
  auto want = gpt2().encode("file 2 doc 39");
  want.push_back(50256);
  CHECK(ds.read(119) == std::vector<int64_t>(want.begin(), want.end()));
  // Partitions by files (4 files, N = 2) and by documents (N = 7 > 4 files) cover the run.
  for (int n : {2, 7}) {
    int64_t docs = 0;
    std::vector<int64_t> tokens;
    for (int i = 0; i < n; ++i) {
      o.partition = parse_partition(std::to_string(i) + "/" + std::to_string(n));
      o.output_prefix = dir / ("p" + std::to_string(i));
      docs += preprocess(o).documents;
      IndexedDataset part(dir / ("p" + std::to_string(i) + "_text_document"));
      for (size_t s = 0; s < part.num_sequences(); ++s)
        for (auto t : part.read(s)) tokens.push_back(t);
    }
    CHECK(docs == 122);
    std::vector<int64_t> all_tokens;
    for (size_t s = 0; s < ds.num_sequences(); ++s)
      for (auto t : ds.read(s)) all_tokens.push_back(t);
    CHECK(tokens == all_tokens);
  }
}

TEST_CASE("malformed lines: stop at the first, or skip up to N and report each", "[preprocess][errors]") {
  TempDir dir;
  write_bytes(dir / "a.jsonl", "{\"text\": \"one\"}\n{\"text\": 5}\n{\"text\": \"two\"}\n");
  write_bytes(dir / "b.jsonl", "[1]\n{\"txt\": \"x\"}\n{\"text\": \"three\"}\n");
  auto o = options(dir / "a.jsonl", dir / "out");
  o.inputs.push_back(dir / "b.jsonl");
  CHECK_THROWS_WITH(preprocess(o), Catch::Contains("a.jsonl' line 2: key \"text\" holds number") &&
                                       Catch::Contains("--skip-bad-lines"));
  o.skip_bad_lines = 2;
  CHECK_THROWS_WITH(preprocess(o), Catch::Contains("b.jsonl' line 2: no key \"text\"") &&
                                       Catch::Contains("more than --skip-bad-lines 2"));
  CHECK_FALSE(file_exists(dir / "out_text_document.bin"));
  o.skip_bad_lines = 3;
  std::vector<std::string> seen;
  o.on_bad_line = [&](const PreprocessOptions::BadLine& b) { seen.push_back(b.file + ":" + std::to_string(b.line)); };
  const auto r = preprocess(o);
  CHECK(r.documents == 3);
  CHECK(seen == std::vector<std::string>{dir / "a.jsonl:2", dir / "b.jsonl:1", dir / "b.jsonl:2"});
  REQUIRE(r.bad_lines.size() == 3);
  CHECK(r.bad_lines[1].reason == "expected a JSON object, found array");
}

TEST_CASE("partition specs and input lists are checked", "[preprocess][errors]") {
  CHECK(parse_partition("3/8").index == 3);
  CHECK(parse_partition("0/1").whole());
  for (const char* bad : {"3/2", "2/2", "1/0", "-1/4", "a/b", "3", "1/2/3", ""})
    CHECK_THROWS_WITH(parse_partition(bad), Catch::Contains(std::string("--partition '") + bad + "'"));
  TempDir dir;
  write_bytes(dir / "x.jsonl", "{}\n");
  CHECK_THROWS_WITH(expand_inputs({dir / "x.jsonl", dir / "*.jsonl"}), Catch::Contains("named twice"));
  CHECK_THROWS_WITH(expand_inputs({dir / "*.zst"}), Catch::Contains("matches no file"));
  CHECK_THROWS_WITH(expand_inputs({dir / "nope.jsonl"}), Catch::Contains("no such file"));
}

TEST_CASE("a recipe's tokenizer section builds the tokenizer it names", "[preprocess][tokenizer]") {
  loom::config::TokenizerConfig t;
  t.vocab_file = vocab_file();
  t.merge_file = merges_file();
  CHECK(recipe_vocab_size(t) == 50257);
  const auto spec = tokenizer_spec(t);
  CHECK(spec.library == "megatron");
  CHECK(spec.type == "GPT2BPETokenizer");
  t.library = loom::config::TokenizerLibrary::kSentencePiece;
  t.type.reset();
  t.model = "/nonexistent/spm.model";
  CHECK(tokenizer_spec(t).type.empty());
  CHECK_THROWS_AS(recipe_tokenizer(t), DataError);
  t.library = loom::config::TokenizerLibrary::kHuggingFace;
  CHECK_THROWS_WITH(recipe_tokenizer(t), Catch::Contains("/nonexistent/spm.model") && Catch::Contains("cannot open"));
}
