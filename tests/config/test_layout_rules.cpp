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
  q.layout.tp = 2;
  q.layout.pp = 2;
  q.layout.micro_batch = 2;
  q.layout.global_batch = 16;
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
    {"interleaved, micro-batches a multiple of p", [](LayoutQuery& q) { q.layout.vp = 2; q.layout.global_batch = 16; }, {}},
    {"sequence parallel, s % t == 0", [](LayoutQuery& q) { q.layout.sequence_parallel = true; }, {}},
    {"sequence parallel at t=1 is a no-op, any s", [](LayoutQuery& q) {
       q.layout.sequence_parallel = true; q.layout.tp = 1; q.model.seq_length = 31; q.layout.global_batch = 8; }, {}},
    {"selective recompute", [](LayoutQuery& q) { q.layout.recompute.granularity = RecomputeGranularity::kSelective; }, {}},
    {"selective with NeMo's block/0 spelling", [](LayoutQuery& q) {
       q.layout.recompute = {RecomputeGranularity::kSelective, RecomputeMethod::kBlock, 0}; }, {}},
    {"full uniform, 3 layers per group of a 4-layer chunk (last group shorter)", [](LayoutQuery& q) {
       q.layout.recompute = {RecomputeGranularity::kFull, RecomputeMethod::kUniform, 3}; }, {}},
    {"full block with 0 layers (nothing recomputed)", [](LayoutQuery& q) {
       q.layout.recompute = {RecomputeGranularity::kFull, RecomputeMethod::kBlock, 0}; }, {}},
    {"full block with the whole chunk", [](LayoutQuery& q) {
       q.layout.recompute = {RecomputeGranularity::kFull, RecomputeMethod::kBlock, 4}; }, {}},
    {"uneven first stage, p=2 (3 + 5)", [](LayoutQuery& q) { q.layout.first_stage_layers = 3; }, {}},
    {"uneven last stage, p=2 (6 + 2)", [](LayoutQuery& q) { q.layout.last_stage_layers = 2; }, {}},
    {"both end stages set at p=2, summing to num_layers", [](LayoutQuery& q) {
       q.layout.first_stage_layers = 3; q.layout.last_stage_layers = 5; }, {}},
    {"p=4 with 1 + 3 + 3 + 1 layers", [](LayoutQuery& q) {
       q.layout.pp = 4; q.layout.first_stage_layers = 1; q.layout.last_stage_layers = 1; }, {}},
    {"44 layers on p=8 as 5 + 6x6 + 3", [](LayoutQuery& q) {
       q.layout.tp = 1; q.layout.pp = 8; q.model.num_layers = 44; q.layout.first_stage_layers = 5; q.layout.last_stage_layers = 3; }, {}},
    {"interleaved uneven: v=2, stages of 2 and 6 layers", [](LayoutQuery& q) {
       q.layout.vp = 2; q.layout.first_stage_layers = 2; }, {}},
    {"uneven with full recompute over the largest chunk (5 layers)", [](LayoutQuery& q) {
       q.layout.first_stage_layers = 3; q.layout.recompute = {RecomputeGranularity::kFull, RecomputeMethod::kBlock, 5}; }, {}},
    {"world not a multiple of t*p", [](LayoutQuery& q) { q.devices = 6; },
     {"trainer.devices: expected the world size num_nodes*devices = 1*6 = 6 to be a multiple of "
      "tensor_model_parallel_size*pipeline_model_parallel_size = 2*2 = 4, found remainder 2"}},
    {"heads not divisible by t", [](LayoutQuery& q) { q.layout.tp = 4; q.layout.pp = 1; q.model.num_attention_heads = 6;
                                                      q.model.hidden_size = 60; q.model.ffn_hidden_size = 240; },
     {"model.num_attention_heads: expected a multiple of tensor_model_parallel_size (4), found 6"}},
    {"hidden not divisible by heads", [](LayoutQuery& q) { q.model.hidden_size = 66; },
     {"model.hidden_size: expected a multiple of num_attention_heads (4), found 66"}},
    {"ffn not divisible by t", [](LayoutQuery& q) { q.model.ffn_hidden_size = 255; },
     {"model.ffn_hidden_size: expected a multiple of tensor_model_parallel_size (2), found 255"}},
    {"sequence parallel with s % t != 0", [](LayoutQuery& q) { q.layout.sequence_parallel = true; q.model.seq_length = 31; },
     {"model.encoder_seq_length: expected a multiple of tensor_model_parallel_size (2) with sequence_parallel, found 31"}},
    {"sequence longer than the position table", [](LayoutQuery& q) { q.model.max_position_embeddings = 16; },
     {"model.max_position_embeddings: expected at least encoder_seq_length (32), found 16"}},
    {"layers not divisible by p", [](LayoutQuery& q) { q.model.num_layers = 7; },
     {"model.num_layers: expected a multiple of pipeline_model_parallel_size (2), found 7"}},
    {"layers not divisible by p*v", [](LayoutQuery& q) { q.layout.vp = 3; q.layout.global_batch = 16; },
     {"model.num_layers: expected a multiple of pipeline_model_parallel_size*virtual_pipeline_model_parallel_size "
      "= 2*3 = 6, found 8"}},
    {"virtual stages without a pipeline", [](LayoutQuery& q) { q.layout.pp = 1; q.devices = 4; q.layout.vp = 2; },
     {"model.virtual_pipeline_model_parallel_size: expected null or 1 when pipeline_model_parallel_size is 1 "
      "(interleaving needs a pipeline), found 2"}},
    {"global batch not a multiple of micro_batch*d", [](LayoutQuery& q) { q.layout.global_batch = 10; },
     {"model.global_batch_size: expected a multiple of micro_batch_size*data_parallel_size = 2*2 = 4, found 10"}},
    {"interleaving with micro-batches not a multiple of p", [](LayoutQuery& q) { q.layout.vp = 2; q.layout.global_batch = 12; },
     {"model.virtual_pipeline_model_parallel_size: the interleaved schedule expects num_microbatches "
      "(global_batch_size/(micro_batch_size*data_parallel_size) = 12/(2*2)) to be a multiple of "
      "pipeline_model_parallel_size (2), found 3"}},
    {"selective with a method", [](LayoutQuery& q) {
       q.layout.recompute = {RecomputeGranularity::kSelective, RecomputeMethod::kUniform, 1}; },
     {"model.activations_checkpoint_method: expected null with activations_checkpoint_granularity selective (only "
      "full recomputation takes a method), found uniform"}},
    {"selective with a layer count", [](LayoutQuery& q) {
       q.layout.recompute = {RecomputeGranularity::kSelective, RecomputeMethod::kNone, 2}; },
     {"model.activations_checkpoint_num_layers: expected null with activations_checkpoint_granularity selective, "
      "found 2"}},
    {"full without a method", [](LayoutQuery& q) { q.layout.recompute = {RecomputeGranularity::kFull, RecomputeMethod::kNone, 1}; },
     {"model.activations_checkpoint_method: expected uniform or block with activations_checkpoint_granularity full, "
      "found null"}},
    {"full uniform with 0 layers", [](LayoutQuery& q) {
       q.layout.recompute = {RecomputeGranularity::kFull, RecomputeMethod::kUniform, 0}; },
     {"model.activations_checkpoint_num_layers: expected an integer in [1, 4] (layers per pipeline chunk) for method "
      "uniform, found 0"}},
    {"full block beyond the chunk", [](LayoutQuery& q) {
       q.layout.recompute = {RecomputeGranularity::kFull, RecomputeMethod::kBlock, 5}; },
     {"model.activations_checkpoint_num_layers: expected an integer in [0, 4] (layers per pipeline chunk) for method "
      "block, found 5"}},
    {"full uniform without a layer count", [](LayoutQuery& q) {
       q.layout.recompute = {RecomputeGranularity::kFull, RecomputeMethod::kUniform, std::nullopt}; },
     {"model.activations_checkpoint_num_layers: expected an integer in [1, 4] (layers per pipeline chunk) for method "
      "uniform, found null"}},
    {"an uneven stage without a pipeline", [](LayoutQuery& q) { q.layout.pp = 1; q.layout.first_stage_layers = 8; },
     {"model.num_layers_in_first_pipeline_stage: expected null when pipeline_model_parallel_size is 1 (one stage "
      "holds all num_layers), found 8"}},
    {"an empty first stage", [](LayoutQuery& q) { q.layout.first_stage_layers = 0; },
     {"model.num_layers_in_first_pipeline_stage: expected null or an integer >= 1, found 0"}},
    {"an uneven stage not a multiple of v", [](LayoutQuery& q) { q.layout.vp = 2; q.layout.last_stage_layers = 3; },
     {"model.num_layers_in_last_pipeline_stage: expected a multiple of virtual_pipeline_model_parallel_size (2: the "
      "stage's model chunks are equal), found 3"}},
    {"both end stages at p=2 not summing to num_layers", [](LayoutQuery& q) {
       q.layout.first_stage_layers = 3; q.layout.last_stage_layers = 4; },
     {"model.num_layers: expected num_layers_in_first_pipeline_stage + num_layers_in_last_pipeline_stage = 3 + 4 = 7 "
      "(pipeline_model_parallel_size 2 leaves no other stage), found 8"}},
    {"a first stage leaving nothing for the others", [](LayoutQuery& q) { q.layout.first_stage_layers = 8; },
     {"model.num_layers: expected more than num_layers_in_first_pipeline_stage = 8 (the 1 other pipeline stage must "
      "hold layers too), found 8"}},
    {"the layers left not a multiple of the other stages", [](LayoutQuery& q) {
       q.layout.pp = 4; q.layout.first_stage_layers = 1; },
     {"model.num_layers: expected the layers left by num_layers_in_first_pipeline_stage = 1, 8 - 1 = 7, to be a "
      "multiple of the other pipeline stages (3), found remainder 1"}},
    {"the other stages' layers not a multiple of v", [](LayoutQuery& q) {
       q.layout.tp = 1; q.devices = 4; q.layout.pp = 4; q.layout.vp = 2; q.model.num_layers = 11;
       q.layout.first_stage_layers = 2; },
     {"model.num_layers: expected each other pipeline stage's layers, (11 - 2)/3 = 3, to be a multiple of "
      "virtual_pipeline_model_parallel_size (2), found remainder 1"}},
    {"uneven, full recompute beyond the largest chunk", [](LayoutQuery& q) {
       q.layout.first_stage_layers = 3; q.layout.recompute = {RecomputeGranularity::kFull, RecomputeMethod::kUniform, 6}; },
     {"model.activations_checkpoint_num_layers: expected an integer in [1, 5] (layers of the largest pipeline chunk) "
      "for method uniform, found 6"}},
    {"a zero tensor size", [](LayoutQuery& q) { q.layout.tp = 0; },
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
  q.layout.global_batch = 10;
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

TEST_CASE("stage layer counts and virtual stage ranges follow Megatron-Core's offsets", "[config][rules]") {
  PipelineSplit even{8, 2, 2, std::nullopt, std::nullopt};
  CHECK(stage_layer_counts(even) == std::vector<int64_t>{4, 4});
  CHECK(virtual_stage_layer_ranges(even) == std::vector<LayerRange>{{0, 2}, {2, 4}, {4, 6}, {6, 8}});
  CHECK(largest_chunk_layers(even) == 2);

  PipelineSplit p8{44, 8, 1, 5, 3};  // the planner's 44 layers on p=8
  CHECK(stage_layer_counts(p8) == std::vector<int64_t>{5, 6, 6, 6, 6, 6, 6, 3});
  const auto r8 = virtual_stage_layer_ranges(p8);
  CHECK(r8.front() == LayerRange{0, 5});
  CHECK(r8[1] == LayerRange{5, 11});
  CHECK(r8.back() == LayerRange{41, 44});

  // Interleaved, p=4 v=2, first 2 and last 4 of 18 layers: each round of virtual stages holds
  // 1 + 3 + 3 + 2 layers (Megatron-Core's get_transformer_layer_offset: chunk k of stage r starts
  // at k*9 + the earlier stages' chunks).
  PipelineSplit vp{18, 4, 2, 2, 4};
  CHECK(stage_layer_counts(vp) == std::vector<int64_t>{2, 6, 6, 4});
  CHECK(virtual_stage_layer_ranges(vp) == std::vector<LayerRange>{{0, 1}, {1, 4}, {4, 7}, {7, 9},
                                                                  {9, 10}, {10, 13}, {13, 16}, {16, 18}});
  CHECK(largest_chunk_layers(vp) == 3);

  PipelineSplit last_only{10, 3, 1, std::nullopt, 2};
  CHECK(stage_layer_counts(last_only) == std::vector<int64_t>{4, 4, 2});

  PipelineSplit bad{8, 2, 1, 3, 4};
  CHECK_THROWS_WITH(stage_layer_counts(bad),
                    "pipeline split:\nmodel.num_layers: expected num_layers_in_first_pipeline_stage + "
                    "num_layers_in_last_pipeline_stage = 3 + 4 = 7 (pipeline_model_parallel_size 2 leaves no other "
                    "stage), found 8");
}

TEST_CASE("the model's reading of null recompute fields is stated once, on RecomputeSettings", "[config][rules]") {
  RecomputeSettings r;  // as a recipe leaves them: granularity, method and layer count null
  CHECK(r.method == RecomputeMethod::kNone);
  CHECK(r.method_or_uniform() == RecomputeMethod::kUniform);
  CHECK(r.num_layers_or_one() == 1);
  r.method = RecomputeMethod::kBlock;
  r.num_layers = 0;  // block with 0 layers recomputes nothing: 0 is kept, not read as null
  CHECK(r.method_or_uniform() == RecomputeMethod::kBlock);
  CHECK(r.num_layers_or_one() == 0);
  r.num_layers = 3;
  CHECK(r.num_layers_or_one() == 3);
}
