// A `loom finetune` adapter checkpoint with the base it names (docs/design/lora.md,
// "Checkpoints"), read for `loom convert --merge-lora` and `--to peft`.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "finetune/lora_run.h"
#include "generate/checkpoint_reader.h"

namespace loom::convert {

struct AdapterCheckpoint {
  generate::CheckpointLocation location;  ///< the adapter run's
  generate::CheckpointInfo info;          ///< its metadata (layout.model_shape: the base's shape)
  finetune::LoraRecord record;            ///< the adapters' settings and their base
  generate::FullCheckpoint adapters;      ///< lora_a / lora_b tensors, full (unsharded)
  generate::CheckpointLocation base_location;
  generate::FullCheckpoint base;          ///< the recorded base iteration, its digest checked
};

/// Reads `checkpoint` (a fine-tuning run or its checkpoints/) at `iteration` (default: the
/// latest) and its recorded base. Throws ConvertInputError naming `checkpoint` when the
/// checkpoint is not a LoRA adapter checkpoint, its record is malformed, or the base's
/// checkpoint digest is not the recorded one (the base changed since training).
AdapterCheckpoint read_adapter_checkpoint(const std::string& checkpoint, std::optional<int64_t> iteration);

}  // namespace loom::convert
