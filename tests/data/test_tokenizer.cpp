// GPT-2 byte-level BPE against the reference (`tokenizers`, via golden files made by
// tools/make_tokenizer_golden.py) and against known GPT-2 facts.
#include <catch2/catch.hpp>

#include <fstream>
#include <thread>

#include "data/byte_unicode.h"
#include "data/gpt2_tokenizer.h"
#include "data/utf8.h"
#include "data_test_util.h"

using namespace loom::data;
using namespace loom::data::test;

static const Gpt2Tokenizer& gpt2() {
  static Gpt2Tokenizer tok(vocab_file(), merges_file());
  return tok;
}

TEST_CASE("byte-to-unicode map is GPT-2's", "[tokenizer]") {
  const auto& m = byte_to_codepoint();
  CHECK(m['A'] == 'A');
  CHECK(m[' '] == 0x120);   // 'Ġ'
  CHECK(m['\n'] == 0x10A);  // 'Ċ'
  CHECK(m[0] == 0x100);
  CHECK(m[0xAD] == 0x143);  // soft hyphen is the last unprintable byte below 0xFF
  for (int b = 0; b < 256; ++b) CHECK(codepoint_to_byte(m[b]) == b);
  CHECK(codepoint_to_byte(0x20) == -1);
}

TEST_CASE("GPT-2 vocabulary loads", "[tokenizer]") {
  const auto& t = gpt2();
  CHECK(t.vocab_size() == 50257);
  CHECK(t.num_merges() == 50000);
  CHECK(t.eod_id() == 50256);
  CHECK(t.token_bytes(50256) == "<|endoftext|>");
  CHECK(t.token_id("\xC4\xA0the") == 262);  // "Ġthe"
}

TEST_CASE("well-known GPT-2 encodings", "[tokenizer]") {
  const auto& t = gpt2();
  CHECK(t.encode("Hello world") == std::vector<int32_t>{15496, 995});
  CHECK(t.encode(" the") == std::vector<int32_t>{262});
  CHECK(t.encode("").empty());
  // `<|endoftext|>` in text is ordinary text, not id 50256 (Megatron's preprocessing).
  const auto eot = t.encode("<|endoftext|>");
  CHECK(eot.size() > 1);
  CHECK(t.decode(eot) == "<|endoftext|>");
}

// Expected pieces as the reference pre-tokenizer (ByteLevel, use_regex) splits them.
TEST_CASE("pre-tokenisation follows the GPT-2 pattern", "[tokenizer]") {
  const auto& t = gpt2();
  using V = std::vector<std::string>;
  CHECK(t.pretokenize("I'm here  now") == V{"I", "'m", " here", " ", " now"});
  // A whitespace run before a non-space keeps its last character for the next piece.
  CHECK(t.pretokenize("abc123 456!!  \n\nx") == V{"abc", "123", " 456", "!!", "  \n", "\n", "x"});
  CHECK(t.pretokenize("a\t\t") == V{"a", "\t\t"});
  CHECK(t.pretokenize("x \xC2\xA0y") == V{"x", " ", "\xC2\xA0", "y"});  // NBSP is whitespace
  // U+180E is no longer White_Space (the reference agrees): it is a symbol.
  CHECK(t.pretokenize("a\xE1\xA0\x8E" "b") == V{"a", "\xE1\xA0\x8E", "b"});
}

TEST_CASE("stress text matches the reference ids", "[tokenizer]") {
  const auto text = read_bytes(golden("stress.txt"));
  const auto want = read_ids(golden("stress.ids"));
  const auto got = gpt2().encode(text);
  REQUIRE(got.size() == want.size());
  CHECK(got == want);
  CHECK(gpt2().decode(got) == text);
}

TEST_CASE("ill-formed UTF-8 matches the reference fed errors='replace'", "[tokenizer]") {
  const auto raw = read_bytes(golden("stress_invalid.bin"));
  const auto want = read_ids(golden("stress_invalid.ids"));
  CHECK(gpt2().encode(raw) == want);
  CHECK(gpt2().decode(want) == utf8_replace_invalid(raw));
}

TEST_CASE("tinyshakespeare head matches the reference ids", "[tokenizer]") {
  const auto text = read_bytes(source_path("data/tinyshakespeare.txt")).substr(0, 20000);
  CHECK(gpt2().encode(text) == read_ids(golden("shakespeare_head.ids")));
}

TEST_CASE("UTF-8 repair replaces maximal subparts like Python", "[tokenizer][utf8]") {
  const std::string R = "\xEF\xBF\xBD";
  CHECK(utf8_replace_invalid("ok") == "ok");
  CHECK(utf8_replace_invalid("\xC3\x28") == R + "(");
  CHECK(utf8_replace_invalid("\xE2\x82") == R);            // truncated 3-byte: one subpart
  CHECK(utf8_replace_invalid("\xF0\x9F\x98" "a") == R + "a");
  CHECK(utf8_replace_invalid("\xED\xA0\x80") == R + R + R);  // surrogate: each byte
  CHECK(utf8_replace_invalid("\xC0\xAF") == R + R);          // overlong
  CHECK(utf8_replace_invalid("\xF4\x90\x80\x80") == R + R + R + R);
  CHECK(utf8_replace_invalid("\xE2\x82\xAC") == "\xE2\x82\xAC");
  CHECK(utf8_valid_prefix("abc\xFF") == 3);
}

TEST_CASE("encode is thread-safe and deterministic", "[tokenizer]") {
  const auto text = read_bytes(source_path("data/tinyshakespeare.txt")).substr(0, 60000);
  const auto want = gpt2().encode(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { got[i] = gpt2().encode(text); });
  for (auto& th : threads) th.join();
  for (const auto& g : got) CHECK(g == want);
}

TEST_CASE("tokenizer files: clear errors", "[tokenizer]") {
  TempDir dir;
  CHECK_THROWS_WITH(Gpt2Tokenizer(dir / "nope.json", merges_file()), Catch::Contains("nope.json") && Catch::Contains("cannot open"));
  write_bytes(dir / "bad.json", "{\"a\": 1,");
  CHECK_THROWS_WITH(Gpt2Tokenizer(dir / "bad.json", merges_file()), Catch::Contains("not valid JSON"));
  write_bytes(dir / "merges.txt", "#version: 0.2\n\xC4\xA0 t\nonlyone\n");
  CHECK_THROWS_WITH(Gpt2Tokenizer(vocab_file(), dir / "merges.txt"),
                    Catch::Contains("merges.txt' line 3") && Catch::Contains("two tokens"));
  write_bytes(dir / "merges2.txt", "#version: 0.2\nzzzq qqzz\n");
  CHECK_THROWS_WITH(Gpt2Tokenizer(vocab_file(), dir / "merges2.txt"), Catch::Contains("missing from the vocabulary"));
  CHECK_THROWS_AS(gpt2().decode({50257}), std::out_of_range);
}

TEST_CASE("special ids: GPT-2's one token for every end, tokenizer.json's by their spellings", "[tokenizer]") {
  CHECK(gpt2().eod_id() == 50256);
  CHECK(gpt2().bos_id() == 50256);
  CHECK(gpt2().pad_id() == 50256);
  CHECK(document_start_id(gpt2()) == 50256);
  CHECK(gpt2().decode_continuation(gpt2().encode(" the end")) == " the end");

  // A byte-level tokenizer.json (one token per byte) with added special tokens.
  auto write = [](const std::string& path, const std::vector<std::pair<std::string, int>>& added) {
    std::string json = "{\"model\":{\"type\":\"BPE\",\"merges\":[],\"vocab\":{";
    for (int b = 0; b < 256; ++b) {
      std::string entry;
      append_utf8(entry, byte_to_codepoint()[b]);
      if (entry == "\"" || entry == "\\") entry = "\\" + entry;
      json += (b ? ",\"" : "\"") + entry + "\":" + std::to_string(b);
    }
    json += "}},\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"added_tokens\":[";
    for (size_t i = 0; i < added.size(); ++i)
      json += (i ? "," : "") + std::string("{\"content\":\"") + added[i].first + "\",\"id\":" +
              std::to_string(added[i].second) + "}";
    std::ofstream(path) << json << "]}";
  };
  TempDir dir;
  write(dir / "llama.json", {{"<|begin_of_text|>", 256}, {"<|end_of_text|>", 257}});
  const auto llama = make_tokenizer({"huggingface", "", dir / "llama.json", "", ""});
  CHECK(llama->eod_id() == 257);
  CHECK(llama->bos_id() == 256);
  CHECK(llama->pad_id() == 257);  // no pad token: the end of document
  CHECK(document_start_id(*llama) == 257);
  write(dir / "neox.json", {{"<|endoftext|>", 256}, {"<|padding|>", 257}});
  const auto neox = make_tokenizer({"huggingface", "", dir / "neox.json", "", ""});
  CHECK(neox->eod_id() == 256);
  CHECK(neox->bos_id() == 256);  // GPT-2 style: one token for both ends
  CHECK(neox->pad_id() == 257);
  write(dir / "none.json", {});
  const auto none = make_tokenizer({"huggingface", "", dir / "none.json", "", ""});
  CHECK(none->eod_id() == -1);
  CHECK(none->bos_id() == -1);
  CHECK(none->pad_id() == 0);
  CHECK(document_start_id(*none) == -1);
}
