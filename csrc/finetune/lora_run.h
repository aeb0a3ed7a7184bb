// What a `loom finetune` run (LoRA, docs/design/lora.md) needs before any rank starts: the
// frozen base (model.restore_from_path, a Loom run or checkpoints directory of any layout), its
// shape and tokenizer adopted into the recipe, and the record an adapter checkpoint keeps of
// its base and adapters (metadata.json's layout.model.lora), read back by a resume and by
// `loom convert --merge-lora`.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "config/recipe.h"
#include "ptune/frozen_base.h"
#include "rules/lora_config.h"
#include "rules/lora_record_key.h"

namespace loom::finetune {

using loom::kLoraRecordKey;

/// What an adapter checkpoint records: its base and its adapters.
struct LoraRecord {
  std::string base_checkpoints;  ///< the base's checkpoints directory (absolute)
  int64_t base_iteration = 0;
  std::string base_digest;       ///< ptune::checkpoint_digest of the whole base checkpoint
  LoraConfig lora;

  nlohmann::json to_json() const;
  /// Throws std::invalid_argument naming `what` (the checkpoint) and the key when a key is
  /// missing or malformed.
  static LoraRecord from_json(const nlohmann::json& record, const std::string& what);
};

struct LoraRunPlan {
  config::Recipe recipe;  ///< with the base's shape, tokenizer and dropout 0 adopted
  ptune::FrozenBase base;
};

/// Finds the base (the iteration a resumed run's checkpoint recorded, else the base's latest),
/// adopts its shape with model.data.seq_length as the sequence length and validates the recipe
/// again. Throws std::invalid_argument naming model.restore_from_path (no checkpoint, a damaged
/// one, a sequence longer than the base's positions) or config::RecipeError: bad input, exit 2.
LoraRunPlan plan_lora_run(const config::Recipe& recipe, std::optional<int64_t> resume_iteration = std::nullopt);

}  // namespace loom::finetune
