// `loom finetune RECIPE --show-examples N`: the first N training rows exactly as the model
// takes them (finetune/sft_rows.h), one JSON object per line, without training: to check a
// template, a chat template, the answer-only loss mask and the packing before spending compute.
#pragma once
#include <cstdint>
#include <ostream>

#include "config/recipe.h"

namespace loom::finetune {

/// Plans the run (finetune/lora_run.h; throws as plan_finetune_run) and writes to `out`, for
/// the first `n` training samples in file order (packed: rows in packing order), one line each:
/// {"sources": ["FILE:LINE", ...], "text": [the decoded tokens of each example], "tokens",
/// "labels", "loss_mask", "position_ids" (each [s]) and, packed, "segment_ids"}.
void show_examples(const config::Recipe& recipe, int64_t n, std::ostream& out);

}  // namespace loom::finetune
