// The key of a `loom finetune` adapter checkpoint's record in metadata.json's layout.model
// (CheckpointLayout::task_record; docs/design/lora.md, "Checkpoints"): a checkpoint holding it
// holds adapters only. Its own header: the checkpoint reader needs it, not the adapter settings.
#pragma once

namespace loom {

inline constexpr const char* kLoraRecordKey = "lora";

}  // namespace loom
