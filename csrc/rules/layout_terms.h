// The vocabulary of a training layout shared by the recipe, the model and the planner: one
// spelling for each concept (recompute granularity and method, precision), as NeMo's recipe
// keys name them (docs/design/conventions.md, "Recipes"; docs/design/sp_sar.md for what each
// recompute setting stores).
#pragma once

namespace loom {

/// model.activations_checkpoint_granularity: null | selective | full.
enum class RecomputeGranularity { kNone, kSelective, kFull };

/// model.activations_checkpoint_method: null | uniform (checkpoint every k layers, the last
/// group shorter when k does not divide the chunk's layers) | block (the first k layers of each
/// model chunk recomputed, the rest stored).
enum class RecomputeMethod { kNone, kUniform, kBlock };

/// trainer.precision: 32 | bf16 | 16 (fp16 with loss scaling).
enum class Precision { kFp32, kBf16, kFp16 };

/// Recipe spellings: "null", "selective", "full"; "null", "uniform", "block"; "32", "bf16", "16".
const char* recipe_name(RecomputeGranularity g);
const char* recipe_name(RecomputeMethod m);
const char* recipe_name(Precision p);

}  // namespace loom
