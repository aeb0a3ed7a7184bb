// Recipes built to crash, hang or exhaust the loader: each gets a clear error naming the key and
// the limit (docs/design/hardening.md), quickly and without unbounded recursion or memory.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>

#include "config_test_util.h"

using namespace loom::config;
using loom::config::test::errors_of;
using loom::config::test::kMinimalRecipe;

namespace {

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

/// kMinimalRecipe with `lines` added to its `model` section.
std::string with_model_lines(const std::string& lines) {
  std::string yaml = kMinimalRecipe;
  const std::string anchor = "  num_attention_heads: 4\n";
  yaml.replace(yaml.find(anchor), anchor.size(), anchor + lines);
  return yaml;
}

/// kMinimalRecipe with `key: value` of section `trainer` replaced.
std::string with_trainer(const std::string& key, const std::string& value) {
  std::string yaml = kMinimalRecipe;
  const size_t at = yaml.find("  " + key + ": ");
  REQUIRE(at != std::string::npos);
  const size_t end = yaml.find('\n', at);
  yaml.replace(at, end - at, "  " + key + ": " + value);
  return yaml;
}

}  // namespace

TEST_CASE("a chain of 6000 interpolations is refused at the limit, not by a stack overflow", "[config][hostile]") {
  std::string yaml = std::string(kMinimalRecipe) + "run:\n";
  for (int i = 0; i < 6000; ++i) yaml += "  k" + std::to_string(i) + ": ${run.k" + std::to_string(i + 1) + "}\n";
  yaml += "  k6000: end\n";
  const auto errors = errors_of(yaml);
  const std::string text = joined(errors);
  INFO(text);
  INFO(text);
  CHECK(text.find("t.yaml:23:7: run.k0: expected chains of at most 64 interpolations") != std::string::npos);
  CHECK(text.find("run.k0 -> run.k1 -> ... -> run.k63 -> run.k64") != std::string::npos);
  CHECK(errors.size() <= 101);  // capped, with a count of the rest
}

TEST_CASE("interpolations nested 100000 deep inside one value are refused", "[config][hostile]") {
  std::string value;
  for (int i = 0; i < 100000; ++i) value += "${multiply:2,";
  value += "1";
  for (int i = 0; i < 100000; ++i) value += "}";
  const std::string text = joined(errors_of(with_model_lines("  seed: " + value + "\n")));
  INFO(text);
  CHECK(text.find("model.seed: expected interpolations nested at most 128 levels deep") != std::string::npos);
}

TEST_CASE("a million-key-class recipe loads in linear time with a capped error list", "[config][hostile]") {
  // 200,000 unknown keys and 100,000 duplicates: the quadratic duplicate scan took minutes.
  std::string yaml = std::string(kMinimalRecipe) + "run:\n";
  for (int i = 0; i < 200000; ++i) yaml += "  k" + std::to_string(i) + ": 1\n";
  for (int i = 0; i < 100000; ++i) yaml += "  k" + std::to_string(i) + ": 2\n";
  const auto start = std::chrono::steady_clock::now();
  const auto errors = errors_of(yaml);
  const double seconds = seconds_since(start);
  CHECK(seconds < 30);
  REQUIRE(errors.size() == 101);
  CHECK(errors.front().find("run.k0: expected each key once per section, found 'k0' again") != std::string::npos);
  CHECK(errors.back().find("and 299900 more errors not shown") != std::string::npos);
}

TEST_CASE("a YAML alias bomb is refused before it expands", "[config][hostile]") {
  std::string yaml = "x0: &l0 [aaaaaaaaaa, aaaaaaaaaa, aaaaaaaaaa, aaaaaaaaaa, aaaaaaaaaa, aaaaaaaaaa, aaaaaaaaaa, aaaaaaaaaa]\n";
  for (int level = 1; level < 10; ++level) {
    yaml += "x" + std::to_string(level) + ": &l" + std::to_string(level) + " [";
    for (int k = 0; k < 10; ++k) yaml += (k ? ", *l" : "*l") + std::to_string(level - 1);
    yaml += "]\n";
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string text = joined(errors_of(std::string(kMinimalRecipe) + yaml));
  INFO(text);
  CHECK(seconds_since(start) < 10);
  CHECK(text.find("expected aliases to expand the document to at most 2x its size") != std::string::npos);
  CHECK(text.find("a YAML alias bomb?") != std::string::npos);
  CHECK(text.find(": x") != std::string::npos);  // names the key where the limit was reached
}

TEST_CASE("an alias that contains itself is refused, not followed forever", "[config][hostile]") {
  const std::string text = joined(errors_of(std::string(kMinimalRecipe) + "cluster:\n  container_mounts: &a [x, *a]\n"));
  INFO(text);
  CHECK(text.find("cluster.container_mounts") != std::string::npos);
  CHECK(text.find("nested at most 64 levels deep") != std::string::npos);
}

TEST_CASE("a string interpolation bomb is refused at 1 MiB per value", "[config][hostile]") {
  std::string run = "run:\n  s0: xxxxxxxxxxxxxxxx\n";
  for (int i = 1; i < 12; ++i) {
    run += "  s" + std::to_string(i) + ": \"";
    for (int k = 0; k < 10; ++k) run += "${run.s" + std::to_string(i - 1) + "}";
    run += "\"\n";
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string text = joined(errors_of(std::string(kMinimalRecipe) + run));
  INFO(text);
  CHECK(seconds_since(start) < 10);
  CHECK(text.find("expected an interpolated value of at most 1024 KiB, found run.s") != std::string::npos);
}

TEST_CASE("copying mappings by reference is bounded in total", "[config][hostile]") {
  // Each level is a mapping of 16 references to the level below: 16^8 copies of the leaf.
  std::string run = "run:\n  m0: {a: 1, b: 2, c: 3, d: 4}\n";
  for (int i = 1; i < 9; ++i) {
    run += "  m" + std::to_string(i) + ":\n";
    for (int k = 0; k < 16; ++k) run += "    " + std::string(1, char('a' + k)) + ": ${run.m" + std::to_string(i - 1) + "}\n";
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string text = joined(errors_of(std::string(kMinimalRecipe) + run));
  INFO(text);
  CHECK(seconds_since(start) < 20);
  CHECK(text.find("expected interpolations to produce at most 64 MiB in all") != std::string::npos);
}

TEST_CASE("a second YAML document is refused, not ignored", "[config][hostile]") {
  const auto errors = errors_of(std::string(kMinimalRecipe) + "---\ntrainer:\n  max_steps: 99999\n");
  REQUIRE(errors.size() == 1);
  CHECK(errors[0] == "t.yaml:22:1: expected one YAML document, found another (a line '---' starts a new document; "
                     "a recipe is a single document)");
  // The probe for a second document asks for two, never more (yaml-cpp's LoadAll loops forever here).
  CHECK_FALSE(errors_of(",\n").empty());
  CHECK_FALSE(errors_of(" ,64\n---\nrun:\n  name: x\n").empty());
}

TEST_CASE("multiply that overflows 64 bits is an error naming the value", "[config][hostile]") {
  const std::string text =
      joined(errors_of(with_model_lines("  seed: ${multiply:4294967296, 4294967296}\n")));
  CHECK(text.find("model.seed: multiply overflows a 64-bit integer (the product of 4294967296, 4294967296") !=
        std::string::npos);
}

TEST_CASE("token totals beyond 64 bits are refused by field", "[config][hostile]") {
  const std::string text = joined(errors_of(with_trainer("max_steps", "9223372036854775807")));
  INFO(text);
  CHECK(text.find("trainer.max_steps: expected the tokens to train on, max_steps x global_batch_size x "
                  "encoder_seq_length = trainer.max_steps (9223372036854775807) x model.global_batch_size (8) "
                  "x model.encoder_seq_length (128) to fit in 64 bits, found an overflow") != std::string::npos);
}

TEST_CASE("a sequence of one token and sizes beyond 32 bits are refused by field", "[config][hostile]") {
  std::string yaml = kMinimalRecipe;
  yaml.replace(yaml.find("encoder_seq_length: 128"), 23, "encoder_seq_length: 1");
  std::string text = joined(errors_of(yaml));
  INFO(text);
  CHECK(text.find("model.encoder_seq_length: expected an integer >= 2, found 1") != std::string::npos);

  yaml = kMinimalRecipe;
  yaml.replace(yaml.find("hidden_size: 128"), 16, "hidden_size: 4611686018427387904");
  text = joined(errors_of(yaml));
  CHECK(text.find("model.hidden_size: expected an integer in [1, 2147483647], found 4611686018427387904") !=
        std::string::npos);
  CHECK(text.find("ffn_hidden_size") == std::string::npos);  // derived from the bad field: not re-reported
}

TEST_CASE("a recipe file beyond 64 MiB is refused before it is read", "[config][hostile]") {
  char path[] = "/tmp/loom_big_recipe_XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  {
    std::ofstream out(path, std::ios::binary);
    const std::string line(1023, '#');
    for (int i = 0; i < 65 * 1024; ++i) out << line << "\n";
  }
  std::string message;
  try {
    load_recipe(path);
  } catch (const RecipeError& e) {
    message = e.what();
  }
  std::remove(path);
  CHECK(message == std::string(path) + ": expected a recipe file of at most 64 MiB, found 68157440 bytes");
}
