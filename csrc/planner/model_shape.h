// GPT-3 model shapes by parameter budget (NeMo's hyperparameter tool). The shape itself is
// loom::ModelShape (rules/model_shape.h), the one the rules, the model and the trainer use too.
#pragma once
#include <cstdint>
#include <string>

#include "rules/model_shape.h"
#include "rules/model_shape_counts.h"

namespace loom::planner {

/// The one model shape (rules/model_shape.h) and what its parts count (rules/model_shape_counts.h).
using loom::ModelShape;

/// GPT-3 shape for a parameter budget in billions, following the NeMo hyperparameter tool's
/// bands (hidden size and heads by size: <0.25B → 768/12, <0.5 → 1024/16, <1 → 1536/16,
/// <2 → 2048/16, <3 → 2560/32, <4.5 → 3072/32, <8 → 4096/32, <15 → 5120/40, <25 → 6144/48,
/// <52 → 8192/64, <105 → 10240/80, <205 → 12288/96, <805 → 20480/128, ≤1105 → 25600/160) and
/// its layer rule: the layer count whose P = 12·L·h²·(1 + 13/(12h) + (V+s)/(12Lh)) lies within
/// a margin of the budget, preferring powers of two, then multiples of 16, of 2, of 5, then any
/// count, the margin widening from 1% in 1% steps. 0.126 → 12 layers, 5 → 24, 20 → 44,
/// 175 → 96. Throws std::invalid_argument outside (0, 1105].
ModelShape gpt3_shape_for_size(double billions, int seq_length = 2048, int vocab_size = 51200);

/// P of docs/design/planner_sources.md for a shape (the formula the layer rule uses), in parameters.
double gpt3_size_formula(int num_layers, int hidden_size, int seq_length, int vocab_size);

}  // namespace loom::planner
