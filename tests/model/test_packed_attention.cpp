// Packed rows (docs/design/finetune.md, "Packed sequences"): with the segment ids the attention
// of every core (unfused, loom::ops::core_attention under selective recomputation, ATen's fused
// SDPA, and under full recomputation) stays within each example, so each example's per-token
// losses and its parameter gradients equal those of the example alone in its own padded row,
// for GPT (learned positions) and a Llama-shaped model (RoPE, RMSNorm, SwiGLU, GQA). Controls:
// the plain causal mask, and learned positions that do not restart, both change the losses.
// Pipeline and tensor/sequence-parallel layouts: tests/train/test_packed_pipeline.cpp.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "model/document_mask.h"
#include "model_test_util.h"
#include "packed_examples.h"

using namespace loom;
using namespace loom::model;
using namespace loom::model::test;

namespace {

enum class Core { kUnfused, kSelective, kFlash, kFullRecompute };

const char* core_name(Core core) {
  switch (core) {
    case Core::kUnfused: return "unfused";
    case Core::kSelective: return "selective (core_attention)";
    case Core::kFlash: return "use_flash_attention (SDPA)";
    case Core::kFullRecompute: return "full recompute";
  }
  return "";
}

GptConfig with_core(GptConfig c, Core core) {
  if (core == Core::kSelective) c.layout.recompute.granularity = RecomputeGranularity::kSelective;
  if (core == Core::kFlash) c.use_flash_attention = true;
  if (core == Core::kFullRecompute) {
    c.layout.recompute.granularity = RecomputeGranularity::kFull;
    c.layout.recompute.method = RecomputeMethod::kUniform;
    c.layout.recompute.num_layers = 2;
  }
  return c;
}

StageInputs packed_inputs(const PackedExamples& p, bool with_segments = true) {
  StageInputs in;
  in.tokens = p.tokens;
  in.position_ids = p.positions;
  in.labels = p.labels;
  if (with_segments) in.segment_ids = p.segments;
  return in;
}

StageInputs unpacked_inputs(const PackedExamples& p) {
  StageInputs in;
  in.tokens = p.tokens1;
  in.position_ids = p.positions1;
  in.labels = p.labels1;
  return in;
}

at::Tensor per_token_loss(const GptStage& model, const StageInputs& in) {
  at::NoGradGuard no_grad;
  return model.forward(in, DropoutContext{});
}

/// Every parameter's gradient of Σ weights · per-token loss (weights [b, s]).
std::map<std::string, at::Tensor> weighted_grads(const GptStage& model, const StageInputs& in,
                                                 const at::Tensor& weights) {
  const auto params = model.parameters();
  for (const auto& p : params) p.tensor.mutable_grad() = at::Tensor();
  (model.forward(in, DropoutContext{}) * weights).sum().backward();
  std::map<std::string, at::Tensor> out;
  for (const auto& p : params) out[p.name] = p.tensor.grad().clone();
  return out;
}

/// Example k's per-token losses in the packed rows, [length].
at::Tensor example_loss_packed(const at::Tensor& loss, const PackedPlace& place) {
  return loss[place.row].narrow(0, place.start, place.length);
}
at::Tensor example_loss_unpacked(const at::Tensor& loss, int64_t k, const PackedPlace& place) {
  return loss[k].narrow(0, 0, place.length);
}

/// Packed vs unpacked, per example: per-token losses, then every gradient of the example's
/// loss-masked tokens (random weights). Returns the failures.
std::vector<std::string> check_packed_equals_unpacked(const GptConfig& cfg) {
  std::vector<std::string> failures;
  const PackedExamples p = pack_examples(sample_packing(), cfg.seq_length, cfg.vocab_size);
  GptStage model(cfg, runtime::Communicator::solo());
  const at::Tensor packed = per_token_loss(model, packed_inputs(p));
  const at::Tensor unpacked = per_token_loss(model, unpacked_inputs(p));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(23);
  for (size_t k = 0; k < p.places.size(); ++k) {
    const PackedPlace& place = p.places[k];
    const std::string where = "example " + std::to_string(k) + " (row " + std::to_string(place.row) + ", from " +
                              std::to_string(place.start) + ", " + std::to_string(place.length) + " positions)";
    const double loss_err = rel_err(example_loss_packed(packed, place), example_loss_unpacked(unpacked, k, place));
    if (loss_err > 1e-5) failures.push_back(where + ": per-token loss rel. error " + std::to_string(loss_err));

    const at::Tensor w = at::rand({place.length}, gen) + 0.5;
    at::Tensor w_packed = at::zeros_like(p.loss_mask), w_unpacked = at::zeros_like(p.loss_mask1);
    w_packed[place.row].narrow(0, place.start, place.length).copy_(w);
    w_unpacked[k].narrow(0, 0, place.length).copy_(w);
    w_packed *= p.loss_mask;
    w_unpacked *= p.loss_mask1;
    const auto got = weighted_grads(model, packed_inputs(p), w_packed);
    const auto want = weighted_grads(model, unpacked_inputs(p), w_unpacked);
    for (const auto& [name, g] : want) {
      const double err = rel_err(got.at(name), g);
      if (err > 1e-5) failures.push_back(where + ": " + name + " grad rel. error " + std::to_string(err));
    }
  }
  return failures;
}

/// The largest per-token loss rel. error over the examples that do not start their row.
double worst_later_example_error(const at::Tensor& packed, const at::Tensor& unpacked, const PackedExamples& p) {
  double worst = 0.0;
  for (size_t k = 0; k < p.places.size(); ++k) {
    if (p.places[k].start == 0) continue;
    worst = std::max(worst, rel_err(example_loss_packed(packed, p.places[k]),
                                    example_loss_unpacked(unpacked, static_cast<int64_t>(k), p.places[k])));
  }
  return worst;
}

void check_all_cores(const GptConfig& base) {
  for (Core core : {Core::kUnfused, Core::kSelective, Core::kFlash, Core::kFullRecompute}) {
    const auto failures = check_packed_equals_unpacked(with_core(base, core));
    for (const auto& f : failures) UNSCOPED_INFO(core_name(core) << ": " << f);
    CHECK(failures.empty());
  }
}

}  // namespace

TEST_CASE("packed rows: every example's losses and gradients equal its unpacked ones (GPT, every attention core)",
          "[model][packed]") {
  check_all_cores(tiny_config());
}

TEST_CASE("packed rows: every example's losses and gradients equal its unpacked ones (Llama, every attention core)",
          "[model][packed][llama]") {
  check_all_cores(tiny_llama_config());
}

TEST_CASE("packed rows need the document mask and, with learned positions, positions restarting per example",
          "[model][packed]") {
  for (const GptConfig& base : {tiny_config(), tiny_llama_config()}) {
    for (Core core : {Core::kUnfused, Core::kSelective, Core::kFlash}) {
      INFO(core_name(core) << (base.position_embedding_type == PositionEmbedding::kRope ? " (Llama)" : " (GPT)"));
      const GptConfig cfg = with_core(base, core);
      const PackedExamples p = pack_examples(sample_packing(), cfg.seq_length, cfg.vocab_size);
      GptStage model(cfg, runtime::Communicator::solo());
      const at::Tensor unpacked = per_token_loss(model, unpacked_inputs(p));
      // The plain causal mask lets a later example see the earlier ones of its row.
      CHECK(worst_later_example_error(per_token_loss(model, packed_inputs(p, /*with_segments=*/false)), unpacked,
                                      p) > 1e-3);
      CHECK(worst_later_example_error(per_token_loss(model, packed_inputs(p)), unpacked, p) < 1e-5);
    }
  }
  // Learned positions read the position ids: 0..s-1 over a packed row moves later examples.
  // (RoPE scores depend only on position differences, which are the same within an example.)
  const GptConfig cfg = tiny_config();
  const PackedExamples p = pack_examples(sample_packing(), cfg.seq_length, cfg.vocab_size);
  GptStage model(cfg, runtime::Communicator::solo());
  StageInputs in = packed_inputs(p);
  in.position_ids = p.positions1.narrow(0, 0, p.tokens.size(0));
  CHECK(worst_later_example_error(per_token_loss(model, in), per_token_loss(model, unpacked_inputs(p)), p) > 1e-3);
}

TEST_CASE("the document mask: causal within each example, and bad segment ids are refused clearly",
          "[model][packed]") {
  const at::Tensor segments = at::tensor(std::vector<int64_t>{0, 0, 1, 1, 1, 2}, at::kLong).unsqueeze(0);
  const at::Tensor cross = cross_segment_mask(segments);
  REQUIRE(cross.sizes() == at::IntArrayRef({1, 1, 6, 6}));
  const at::Tensor bias = sdpa_document_bias(cross, at::kBFloat16);
  CHECK(bias.scalar_type() == at::kBFloat16);
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 6; ++j) {
      const bool same = segments[0][i].item<int64_t>() == segments[0][j].item<int64_t>();
      INFO("query " << i << ", key " << j);
      CHECK(cross[0][0][i][j].item<bool>() == !same);
      const float b = bias[0][0][i][j].item<float>();
      if (same && j <= i) {
        CHECK(b == 0.0f);
      } else {
        CHECK((std::isinf(b) && b < 0));
      }
    }
  CHECK_THROWS_WITH(cross_segment_mask(at::zeros({6}, at::kLong)),
                    Catch::Contains("segment_ids: expected an integer tensor [b, s]"));
  CHECK_THROWS_WITH(cross_segment_mask(at::zeros({1, 6}, at::kFloat)), Catch::Contains("found Float"));

  const GptConfig cfg = tiny_config();
  const PackedExamples p = pack_examples(sample_packing(), cfg.seq_length, cfg.vocab_size);
  GptStage model(cfg, runtime::Communicator::solo());
  StageInputs in = packed_inputs(p);
  in.segment_ids = p.segments.narrow(1, 0, 7);
  CHECK_THROWS_WITH(model.forward(in, DropoutContext{}),
                    Catch::Contains("segment_ids must be [b, s] = [3, 8], found [3, 7]"));
}
