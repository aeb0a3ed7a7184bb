// ${...} interpolation: absolute, relative, inside strings, NeMo's multiply, errors.
#include <catch2/catch.hpp>

#include "config_test_util.h"

using namespace loom::config;
using loom::config::test::errors_of;
using loom::config::test::kMinimalRecipe;

namespace {
/// kMinimalRecipe with lines added to `model` (from line 15 on), `top` prepended, and the
/// `optim` section replaced when `optim` is given.
std::string with(const std::string& extra_model_lines, const std::string& top = "", const std::string& optim = "") {
  std::string yaml = kMinimalRecipe;
  const std::string anchor = "  num_attention_heads: 4\n";
  yaml.replace(yaml.find(anchor), anchor.size(), anchor + extra_model_lines);
  const std::string old_optim = "  optim:\n    lr: 1.0e-3\n";
  if (!optim.empty()) yaml.replace(yaml.find(old_optim), old_optim.size(), optim);
  return top + yaml;
}
}  // namespace

TEST_CASE("absolute and relative references keep the referenced type", "[config]") {
  const Recipe r = load_recipe_from_string(with("  max_position_embeddings: ${model.encoder_seq_length}\n"
                                                "  ffn_hidden_size: ${.hidden_size}\n"
                                                "  seed: ${..trainer.max_steps}\n",
                                                "",
                                                "  optim:\n"
                                                "    lr: 1.0e-3\n"
                                                "    betas: [0.8, 0.9]\n"
                                                "    eps: ${.betas.0}\n"
                                                "    sched:\n"
                                                "      min_lr: ${..lr}\n"),
                                           "t.yaml");
  CHECK(r.model.max_position_embeddings == 128);
  CHECK(r.model.ffn_hidden_size == 128);
  CHECK(r.model.seed == 10);
  CHECK(r.model.optim.eps == 0.8);        // a sequence item by index
  CHECK(r.model.optim.sched.min_lr == 1e-3);  // two dots: one level up from sched
  CHECK(r.origin.locations.at("model.max_position_embeddings").str() == "t.yaml:15:28");
}

TEST_CASE("references inside strings, multiply and escapes", "[config]") {
  const std::string top = "run:\n  name: job7\n  results_dir: /scratch/${.name}/v${model.seed}\nexp_manager:\n"
                          "  name: \\${literal}\n";
  const Recipe r = load_recipe_from_string(with("  ffn_hidden_size: ${multiply:4, ${.hidden_size}}\n"
                                                "  init_method_std: ${multiply:0.5, 0.01}\n"
                                                "  seed: 3\n",
                                                top),
                                           "t.yaml");
  CHECK(r.run.results_dir == std::optional<std::string>("/scratch/job7/v3"));
  CHECK(r.exp_manager.name == "${literal}");
  CHECK(r.model.ffn_hidden_size == 512);
  CHECK(r.model.init_method_std == Approx(0.005).epsilon(1e-12));
}

TEST_CASE("a whole sequence can be referenced", "[config]") {
  const Recipe r = load_recipe_from_string(
      with("", "cluster:\n  container_mounts: [0.5, 0.75]\n",
           "  optim:\n    lr: 1.0e-3\n    betas: ${cluster.container_mounts}\n"),
      "t.yaml");
  CHECK(r.model.optim.betas == std::array<double, 2>{0.5, 0.75});
}

TEST_CASE("interpolation errors are located at the referencing value", "[config]") {
  CHECK(errors_of(with("  seed: ${model.nope}\n"), {}, "t.yaml") ==
        std::vector<std::string>{"t.yaml:15:9: model.seed: interpolation ${model.nope} refers to 'model.nope', which "
                                 "is not set (did you mean 'model.seed'?)"});
  CHECK(errors_of(with("  seed: ${model.label_smoothing}\n"), {}, "t.yaml") ==
        std::vector<std::string>{"t.yaml:15:9: model.seed: interpolation ${model.label_smoothing} refers to "
                                 "'model.label_smoothing', which is not set (references see only keys written in the "
                                 "recipe or set by overrides, not defaults)"});
  CHECK(errors_of(with("  seed: ${oc.env:HOME}\n"), {}, "t.yaml") ==
        std::vector<std::string>{"t.yaml:15:9: model.seed: unsupported resolver 'oc.env' (supported: ${path}, "
                                 "${.sibling}, ${multiply:a,b})"});
  CHECK(errors_of(with("  seed: ${model.data}x\n"), {}, "t.yaml") ==
        std::vector<std::string>{"t.yaml:15:9: model.seed: interpolation ${model.data} inside a string must refer to "
                                 "a scalar, found a mapping"});
  CHECK(errors_of(with("  seed: ${multiply:2}\n"), {}, "t.yaml") ==
        std::vector<std::string>{"t.yaml:15:9: model.seed: multiply expects at least 2 arguments, found 1"});
  CHECK(errors_of(with("  seed: ${...x}\n"), {}, "t.yaml") ==
        std::vector<std::string>{"t.yaml:15:9: model.seed: relative interpolation ${...x} goes above the document "
                                 "root"});
  // A reference that resolves to the wrong type is a type error at the referencing value.
  CHECK(errors_of(with("  seed: ${model.tokenizer.vocab_file}\n"), {}, "t.yaml") ==
        std::vector<std::string>{"t.yaml:15:9: model.seed: expected an integer, found data/gpt2-vocab.json"});
}
