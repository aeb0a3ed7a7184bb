// The GPT-3 recipes build their model on the meta device (shapes only, no memory): the
// parameter count of the real module tree equals the closed form and the nominal size.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include "config/recipe.h"
#include "model/gpt_stage.h"
#include "runtime/communicator.h"
#include "train/model_setup.h"

using namespace loom;

TEST_CASE("GPT-3 recipes build on the meta device with the expected parameter count",
          "[recipes][meta]") {
  struct Case {
    const char* file;
    double nominal;  // parameters in the recipe's name
  };
  for (const auto& c : {Case{"gpt3_126m.yaml", 126e6}, Case{"gpt3_5b.yaml", 5e9},
                        Case{"gpt3_20b.yaml", 20e9}, Case{"gpt3_175b.yaml", 175e9}}) {
    INFO(c.file);
    const config::Recipe r = config::load_recipe(std::string(LOOM_SOURCE_DIR) + "/recipes/" + c.file);
    model::GptConfig cfg = train::gpt_config_from_recipe(r, 50257);
    cfg.layout.sequence_parallel = false;  // one process holds the whole model (t = 1)
    model::GptStage whole(cfg, runtime::Communicator::solo(), {}, at::Device(at::kMeta));
    int64_t count = 0;
    for (const auto& p : whole.parameters()) {
      CHECK(p.tensor.is_meta());
      count += p.tensor.numel();
    }
    // V·h + s·h + L·(4h² + 2hf + 9h + f) + 2h with the model's padded vocabulary (50304).
    const int64_t h = cfg.hidden_size, f = cfg.ffn(), L = cfg.num_layers;
    const int64_t V = cfg.padded_vocab_size(1), s = cfg.max_position_embeddings;
    CHECK(V == 50304);
    CHECK(count == V * h + s * h + L * (4 * h * h + 2 * h * f + 9 * h + f) + 2 * h);
    CHECK(double(count) == Approx(c.nominal).epsilon(0.015));
  }
}
