// model.tokenizer as NeMo spells it: library megatron (GPT-2 vocab + merges), sentencepiece
// (model: a .model file) and huggingface (model: a tokenizer.json), with the fields each needs.
#include <catch2/catch.hpp>

#include <string>

#include "config_test_util.h"

using namespace loom::config;
using loom::config::test::errors_of;

namespace {
// kMinimalRecipe with its tokenizer section replaced.
std::string with_tokenizer(const std::string& section) {
  std::string yaml = loom::config::test::kMinimalRecipe;
  const std::string old = "  tokenizer:\n    vocab_file: data/gpt2-vocab.json\n    merge_file: data/gpt2-merges.txt\n";
  yaml.replace(yaml.find(old), old.size(), "  tokenizer:\n" + section);
  return yaml;
}
}  // namespace

TEST_CASE("tokenizer libraries: sentencepiece and huggingface need model, not the GPT-2 files", "[config]") {
  auto sp = load_recipe_from_string(with_tokenizer("    library: sentencepiece\n    type: null\n    model: m/spm.model\n"), "t.yaml");
  CHECK(sp.model.tokenizer.library == TokenizerLibrary::kSentencePiece);
  CHECK(sp.model.tokenizer.model == std::optional<std::string>("m/spm.model"));
  CHECK_FALSE(sp.model.tokenizer.type.has_value());
  CHECK(sp.model.tokenizer.vocab_file.empty());
  auto hf = load_recipe_from_string(
      with_tokenizer("    library: huggingface\n    type: EleutherAI/gpt-neox-20b\n    model: m/tokenizer.json\n"), "t.yaml");
  CHECK(hf.model.tokenizer.library == TokenizerLibrary::kHuggingFace);
  CHECK(*hf.model.tokenizer.type == "EleutherAI/gpt-neox-20b");
  // The dump round-trips the new keys.
  const auto again = load_recipe_from_string(to_yaml(hf), "again.yaml");
  CHECK(again.model.tokenizer.model == hf.model.tokenizer.model);
  CHECK(again.model.tokenizer.library == TokenizerLibrary::kHuggingFace);
}

TEST_CASE("tokenizer sections that cannot work are refused naming the field", "[config]") {
  CHECK(errors_of(with_tokenizer("    library: sentencepiece\n")) ==
        std::vector<std::string>{"t.yaml: model.tokenizer.model (not set; default): expected the SentencePiece .model file "
                                 "(library sentencepiece), found none"});
  const auto hf = errors_of(with_tokenizer("    library: huggingface\n    type: EleutherAI/gpt-neox-20b\n"));
  REQUIRE(hf.size() == 1);
  CHECK_THAT(hf[0], Catch::Contains("model.tokenizer.model (not set; default): expected a tokenizer.json"));
  CHECK(errors_of(with_tokenizer("    vocab_file: v.json\n    merge_file: m.txt\n    type: BertWordPieceCase\n")) ==
        std::vector<std::string>{"t.yaml:20:11: model.tokenizer.type: expected GPT2BPETokenizer (the megatron "
                                 "library's tokenizer Loom reads; for another vocabulary use library sentencepiece "
                                 "or huggingface), found 'BertWordPieceCase'"});
  const auto lib = errors_of(with_tokenizer("    library: tiktoken\n    model: x\n"));
  REQUIRE_FALSE(lib.empty());
  CHECK_THAT(lib[0], Catch::Contains("model.tokenizer.library") && Catch::Contains("sentencepiece") &&
                         Catch::Contains("huggingface"));
  // megatron still requires the GPT-2 pair.
  const auto gpt2 = errors_of(with_tokenizer("    library: megatron\n"));
  CHECK(gpt2.size() == 2);
}
