// `loom convert --merge-lora --checkpoint ADAPTER_RUN --output RUN [--iteration N]`: the LoRA
// adapters of a `loom finetune` checkpoint folded into the base they name (docs/design/lora.md):
// every adapted weight becomes W + (alpha/r)·B A (model::merge_lora_weight), every other
// parameter is the base's. The result is a whole Loom run at the base's layout (checkpoint
// iteration 0 with a fresh optimizer, config.yaml = the base run's recipe with absolute
// tokenizer paths) that `loom generate`, `loom eval`, `loom serve`, `loom convert --to hf` and
// `loom train` read as any run.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace loom::convert {

struct LoraMergeRequest {
  std::string adapter_checkpoint;    ///< --checkpoint: the fine-tuning run (or its checkpoints/)
  std::optional<int64_t> iteration;  ///< --iteration (default: the latest)
  std::string output_run;            ///< --output: a new run directory
};

struct LoraMergeResult {
  int64_t iteration = 0;   ///< the adapter checkpoint's
  int merged_weights = 0;  ///< linears that had adapters
  std::string base_checkpoints;
  int64_t base_iteration = 0;
};

/// Throws ConvertInputError naming the checkpoint and what is wrong: not an adapter checkpoint
/// (no LoRA record), its base gone or changed since (the recorded checkpoint digest differs),
/// an adapter without its weight, a base run without config.yaml, an output run that holds
/// checkpoints already.
LoraMergeResult merge_lora(const LoraMergeRequest& request);

}  // namespace loom::convert
