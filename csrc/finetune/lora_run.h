// What a `loom finetune` run (docs/design/finetune.md, docs/design/lora.md) needs before any
// rank starts: the base (model.restore_from_path, a Loom run or checkpoints directory of any
// layout), its shape and tokenizer adopted into the recipe, the SFT datasets read and checked
// line by line, the run's sequence length and (packed_sequence) the packing; and the record an
// adapter checkpoint keeps of its base and adapters (metadata.json's layout.model.lora), read
// back by a resume and by `loom convert --merge-lora`.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "config/recipe.h"
#include "data/tokenizer.h"
#include "finetune/sft_dataset.h"
#include "prompt_data/sequence_packing.h"
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

struct FinetuneRunPlan {
  config::Recipe recipe;  ///< with the base's shape, tokenizer, sequence length and dropout 0 adopted
  ptune::FrozenBase base;
  bool lora = true;       ///< model.peft.peft_scheme lora; else none (full-parameter SFT)
  std::shared_ptr<data::Tokenizer> tokenizer;
  std::shared_ptr<SftDataset> train, valid;  ///< valid: null without validation_ds
  /// The chat template file chat records are rendered with (train_ds.chat_template or the base
  /// run's), when there is one.
  std::optional<std::string> chat_template_file;
  int64_t seq_length = 0;                    ///< every micro-batch's length s
  /// packed_sequence: train's examples placed in rows of s positions (first-fit decreasing).
  std::optional<prompt_data::SequencePacking> packing;
  /// Training samples: packed rows, or examples.
  int64_t train_samples() const { return packing ? int64_t(packing->packs.size()) : train->size(); }
};

/// Finds the base (the iteration a resumed run's checkpoint recorded, else the base's latest),
/// reads the datasets (file:line errors), chooses the sequence length (the longest example's
/// inputs rounded up to 8, lcm(8, t) under sequence parallelism; packed: max_seq_length's),
/// packs, adopts the base's shape and validates the recipe again. Throws std::invalid_argument
/// naming model.restore_from_path (no checkpoint, a damaged one) or model.data.train_ds.<key>,
/// data::DataError (a bad record) or config::RecipeError: bad input, exit 2.
FinetuneRunPlan plan_finetune_run(const config::Recipe& recipe, std::optional<int64_t> resume_iteration = std::nullopt);

}  // namespace loom::finetune
