// The one table of legal and illegal layouts (rules/layout_rules.h): each illegal row names the
// exact error the recipe check, the model and the planner all report for it.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "rules/layout_rules.h"

using namespace loom;
using namespace loom::rules;

namespace {

/// A legal starting point: 8 ranks, t=2 p=2 d=2, 8 layers, 4 heads, h=64, s=32.
LayoutQuery base() {
  LayoutQuery q;
  q.num_nodes = 1;
  q.devices = 8;
  q.tensor = 2;
  q.pipeline = 2;
  q.micro_batch = 2;
  q.global_batch = 16;
  q.model = {8, 64, 4, 256, 32, 32};
  return q;
}

std::vector<std::string> texts(const LayoutQuery& q) {
  std::vector<std::string> out;
  for (const auto& v : layout_violations(q)) out.push_back(v.text());
  return out;
}

struct Row {
  const char* name;
  void (*edit)(LayoutQuery&);
  std::vector<std::string> errors;  // empty: legal
};

const Row kTable[] = {
    {"the base layout", [](LayoutQuery&) {}, {}},
    {"interleaved, micro-batches a multiple of p", [](LayoutQuery& q) { q.virtual_stages = 2; q.global_batch = 16; }, {}},
    {"sequence parallel, s % t == 0", [](LayoutQuery& q) { q.sequence_parallel = true; }, {}},
    {"sequence parallel at t=1 is a no-op, any s", [](LayoutQuery& q) {
       q.sequence_parallel = true; q.tensor = 1; q.model.seq_length = 31; q.global_batch = 8; }, {}},
    {"selective recompute", [](LayoutQuery& q) { q.recompute.granularity = RecomputeGranularity::kSelective; }, {}},
    {"selective with NeMo's block/0 spelling", [](LayoutQuery& q) {
       q.recompute = {RecomputeGranularity::kSelective, RecomputeMethod::kBlock, 0}; }, {}},
    {"full uniform, 3 layers per group of a 4-layer chunk (last group shorter)", [](LayoutQuery& q) {
       q.recompute = {RecomputeGranularity::kFull, RecomputeMethod::kUniform, 3}; }, {}},
    {"full block with 0 layers (nothing recomputed)", [](LayoutQuery& q) {
       q.recompute = {RecomputeGranularity::kFull, RecomputeMethod::kBlock, 0}; }, {}},
    {"full block with the whole chunk", [](LayoutQuery& q) {
       q.recompute = {RecomputeGranularity::kFull, RecomputeMethod::kBlock, 4}; }, {}},
    {"world not a multiple of t*p", [](LayoutQuery& q) { q.devices = 6; },
     {"trainer.devices: expected the world size num_nodes*devices = 1*6 = 6 to be a multiple of "
      "tensor_model_parallel_size*pipeline_model_parallel_size = 2*2 = 4, found remainder 2"}},
    {"heads not divisible by t", [](LayoutQuery& q) { q.tensor = 4; q.pipeline = 1; q.model.num_attention_heads = 6;
                                                      q.model.hidden_size = 60; q.model.ffn_hidden_size = 240; },
     {"model.num_attention_heads: expected a multiple of tensor_model_parallel_size (4), found 6"}},
    {"hidden not divisible by heads", [](LayoutQuery& q) { q.model.hidden_size = 66; },
     {"model.hidden_size: expected a multiple of num_attention_heads (4), found 66"}},
    {"ffn not divisible by t", [](LayoutQuery& q) { q.model.ffn_hidden_size = 255; },
     {"model.ffn_hidden_size: expected a multiple of tensor_model_parallel_size (2), found 255"}},
    {"sequence parallel with s % t != 0", [](LayoutQuery& q) { q.sequence_parallel = true; q.model.seq_length = 31; },
     {"model.encoder_seq_length: expected a multiple of tensor_model_parallel_size (2) with sequence_parallel, found 31"}},
    {"sequence longer than the position table", [](LayoutQuery& q) { q.model.max_position_embeddings = 16; },
     {"model.max_position_embeddings: expected at least encoder_seq_length (32), found 16"}},
    {"layers not divisible by p", [](LayoutQuery& q) { q.model.num_layers = 7; },
     {"model.num_layers: expected a multiple of pipeline_model_parallel_size (2), found 7"}},
    {"layers not divisible by p*v", [](LayoutQuery& q) { q.virtual_stages = 3; q.global_batch = 16; },
     {"model.num_layers: expected a multiple of pipeline_model_parallel_size*virtual_pipeline_model_parallel_size "
      "= 2*3 = 6, found 8"}},
    {"virtual stages without a pipeline", [](LayoutQuery& q) { q.pipeline = 1; q.devices = 4; q.virtual_stages = 2; },
     {"model.virtual_pipeline_model_parallel_size: expected null or 1 when pipeline_model_parallel_size is 1 "
      "(interleaving needs a pipeline), found 2"}},
    {"global batch not a multiple of micro_batch*d", [](LayoutQuery& q) { q.global_batch = 10; },
     {"model.global_batch_size: expected a multiple of micro_batch_size*data_parallel_size = 2*2 = 4, found 10"}},
    {"interleaving with micro-batches not a multiple of p", [](LayoutQuery& q) { q.virtual_stages = 2; q.global_batch = 12; },
     {"model.virtual_pipeline_model_parallel_size: the interleaved schedule expects num_microbatches "
      "(global_batch_size/(micro_batch_size*data_parallel_size) = 12/(2*2)) to be a multiple of "
      "pipeline_model_parallel_size (2), found 3"}},
    {"selective with a method", [](LayoutQuery& q) {
       q.recompute = {RecomputeGranularity::kSelective, RecomputeMethod::kUniform, 1}; },
     {"model.activations_checkpoint_method: expected null with activations_checkpoint_granularity selective (only "
      "full recomputation takes a method), found uniform"}},
    {"selective with a layer count", [](LayoutQuery& q) {
       q.recompute = {RecomputeGranularity::kSelective, RecomputeMethod::kNone, 2}; },
     {"model.activations_checkpoint_num_layers: expected null with activations_checkpoint_granularity selective, "
      "found 2"}},
    {"full without a method", [](LayoutQuery& q) { q.recompute = {RecomputeGranularity::kFull, RecomputeMethod::kNone, 1}; },
     {"model.activations_checkpoint_method: expected uniform or block with activations_checkpoint_granularity full, "
      "found null"}},
    {"full uniform with 0 layers", [](LayoutQuery& q) {
       q.recompute = {RecomputeGranularity::kFull, RecomputeMethod::kUniform, 0}; },
     {"model.activations_checkpoint_num_layers: expected an integer in [1, 4] (layers per pipeline chunk) for method "
      "uniform, found 0"}},
    {"full block beyond the chunk", [](LayoutQuery& q) {
       q.recompute = {RecomputeGranularity::kFull, RecomputeMethod::kBlock, 5}; },
     {"model.activations_checkpoint_num_layers: expected an integer in [0, 4] (layers per pipeline chunk) for method "
      "block, found 5"}},
    {"full uniform without a layer count", [](LayoutQuery& q) {
       q.recompute = {RecomputeGranularity::kFull, RecomputeMethod::kUniform, std::nullopt}; },
     {"model.activations_checkpoint_num_layers: expected an integer in [1, 4] (layers per pipeline chunk) for method "
      "uniform, found null"}},
    {"a zero tensor size", [](LayoutQuery& q) { q.tensor = 0; },
     {"model.tensor_model_parallel_size: expected an integer >= 1, found 0"}},
};

}  // namespace

TEST_CASE("the layout rules: one table of legal and illegal layouts with their exact errors", "[config][rules]") {
  for (const auto& row : kTable) {
    INFO(row.name);
    LayoutQuery q = base();
    row.edit(q);
    CHECK(texts(q) == row.errors);
  }
}

TEST_CASE("each violation names the fields it read, so a caller can skip rules on rejected fields",
          "[config][rules]") {
  LayoutQuery q = base();
  q.model.num_attention_heads = 3;
  q.model.hidden_size = 63;
  const auto v = layout_violations(q);
  REQUIRE(v.size() == 1);
  CHECK(v[0].field == "model.num_attention_heads");
  CHECK(v[0].reads == std::vector<std::string>{"model.num_attention_heads", "model.tensor_model_parallel_size"});
}

TEST_CASE("interleaving_violation is the schedule's rule too", "[config][rules]") {
  CHECK_FALSE(interleaving_violation(6, 3, 2));
  CHECK_FALSE(interleaving_violation(5, 2, 1));  // 1F1B takes any count
  const auto v = interleaving_violation(6, 4, 2);
  REQUIRE(v);
  CHECK(v->text() == "model.virtual_pipeline_model_parallel_size: the interleaved schedule expects num_microbatches "
                     "to be a multiple of pipeline_model_parallel_size (4), found 6");
}

TEST_CASE("throw_if_any lists every violation under its context", "[config][rules]") {
  LayoutQuery q = base();
  q.model.num_layers = 7;
  q.global_batch = 10;
  try {
    throw_if_any(layout_violations(q), "layout t2 p2:");
    FAIL("expected a throw");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) ==
          "layout t2 p2:\nmodel.global_batch_size: expected a multiple of micro_batch_size*data_parallel_size = 2*2 = 4, "
          "found 10\nmodel.num_layers: expected a multiple of pipeline_model_parallel_size (2), found 7");
  }
  CHECK_NOTHROW(throw_if_any(layout_violations(base()), "x"));
}
