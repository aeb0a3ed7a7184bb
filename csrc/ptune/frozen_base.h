// The frozen base model of a prompt-learning run (docs/design/ptuning.md, "The model"): found
// from model.language_model_path (a Loom run directory or its checkpoints directory, trained
// under any t, p, v), its shape adopted by the recipe, its whole checkpoint sliced for this
// run's own t, p and v, its parameters frozen (no gradients, never in the optimizer) and its
// dropout off (the base is a fixed function; NeMo's reported pitfall is the base's dropout
// left on during tuning).
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/recipe.h"
#include "generate/checkpoint_reader.h"
#include "generate/generate_run.h"
#include "model/gpt_stage.h"
#include "runtime/process_groups.h"

namespace loom::ptune {

/// Where the base is and what it is: its checkpoint (pinned_base_iteration, else the tracker's
/// latest), model shape, the run recipe's LayerNorm epsilon and vocabulary padding, and tokenizer.
struct FrozenBase {
  generate::GeneratePlan plan;
  std::string path;    ///< model.language_model_path as given
  std::string pinned;  ///< why plan.info.iteration was chosen, for the log ("" = the latest)
};

/// The base iteration a run tunes on (docs/design/ptuning.md, "The model"):
/// model.language_model_iteration when set; else, when the run will resume (the checkpoint
/// train::resume_iteration chooses, the run directory's one rule), the base_iteration that
/// checkpoint recorded, so that a base run that trained on meanwhile does not change the
/// function being tuned; else nullopt (the base's latest). `why` says which.
std::optional<int64_t> pinned_base_iteration(const config::Recipe& recipe, std::optional<int64_t> resume_iteration,
                                             std::string& why);

/// Finds the base at pinned_base_iteration. Throws std::invalid_argument naming
/// model.language_model_path (or model.language_model_iteration) and what is missing (no
/// checkpoint, no config.yaml naming the tokenizer, a damaged metadata.json).
FrozenBase find_frozen_base(const config::Recipe& recipe, std::optional<int64_t> resume_iteration = std::nullopt);

/// The run's tokenizer: the recipe's model.tokenizer when it names one (sentencepiece or
/// huggingface: `model`; megatron: vocab_file and merge_file, a missing one taken from a GPT-2
/// base), else the base run's. The token ids must be the base's.
data::TokenizerSpec run_tokenizer(const config::Recipe& recipe, const FrozenBase& base);

/// run_tokenizer loaded. Throws data::DataError naming the file when it does not load, and
/// std::invalid_argument (model.tokenizer) when its size is not the base's vocabulary.
std::shared_ptr<data::Tokenizer> load_run_tokenizer(const config::Recipe& recipe, const FrozenBase& base);

/// The tokenizer as the inference tables record it (library, type, model, vocab_file,
/// merge_file; absolute paths), and read back from the tables' "base" object: nullopt when not
/// recorded or its files are gone (tables of older runs hold vocab_file/merge_file only).
nlohmann::json tokenizer_record(const data::TokenizerSpec& tokenizer);
std::optional<data::TokenizerSpec> recorded_tokenizer(const nlohmann::json& tables_base);

/// Fills the recipe's model shape from the base (num_layers, hidden_size, ffn_hidden_size,
/// num_attention_heads, max_position_embeddings, layernorm_epsilon,
/// make_vocab_size_divisible_by) and its tokenizer (run_tokenizer), sets encoder_seq_length = data.seq_length = `seq_length` (the
/// prompt run's sequence length) and the base's dropout to 0. The caller validates the recipe
/// again (layout rules such as heads % t need the shape).
void adopt_base_shape(config::Recipe& recipe, const FrozenBase& base, int64_t seq_length);

/// This rank's chunks of the base for `config` (gpt_config_from_recipe of the adopted recipe),
/// filled from the base's whole checkpoint (generate::read_full_checkpoint), every parameter with requires_grad false. Throws
/// train::CheckpointError naming the shard or parameter for a damaged or mismatched checkpoint.
std::vector<model::GptStage> build_frozen_chunks(const generate::FullCheckpoint& checkpoint, const model::GptConfig& config,
                                                 runtime::ProcessGroups& groups, int virtual_stages);

/// A digest (hex FNV-1a over names, shapes and bytes) of every parameter of `chunks` (this
/// rank's slice of the base), to show that it is bit-identical before and after tuning.
std::string parameters_digest(const std::vector<model::GptStage>& chunks);

/// The same over the whole checkpoint's global tensors (in name order): one value for the base
/// whatever layout reads it, recorded with the inference tables and compared by later runs.
std::string checkpoint_digest(const generate::FullCheckpoint& checkpoint);

}  // namespace loom::ptune
