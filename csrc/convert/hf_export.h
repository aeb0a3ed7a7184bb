// `loom convert --to hf DIR --checkpoint RUN [--iteration N]`: a Loom training checkpoint of any
// layout as a Hugging Face GPT2LMHeadModel directory that transformers loads offline
// (GPT2LMHeadModel.from_pretrained(DIR), AutoTokenizer.from_pretrained(DIR)):
//   config.json          the GPT2Config (hf_gpt2.h), dtype as the checkpoint's parameters
//   model.safetensors    the parameters under HF's names and layouts, lm_head tied (not stored)
//   vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json   the run's tokenizer
//   chat_template.jinja  the run's chat template, when RUN/tokenizer/ has one
// docs/design/checkpoint_conversion.md describes the mapping.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace loom::convert {

struct HfExportRequest {
  std::string checkpoint;              ///< run directory or its checkpoints/ folder
  std::optional<int64_t> iteration;    ///< default: the tracker's
  std::string output_dir;              ///< created if missing; must be empty unless `overwrite`
  bool overwrite = false;              ///< replace the export's files in a directory that is not empty
};

struct HfExportResult {
  int64_t iteration = 0;
  int64_t parameters = 0;  ///< elements written (the tied lm_head counted once)
};

/// Each file is written under a temporary name and renamed into place, so an interrupted export
/// leaves no torn file. Throws ConvertInputError or train::CheckpointError naming the file or
/// field for bad input (an output that is not an empty directory without `overwrite`, no run recipe, a tokenizer other than GPT-2 BPE or of another size than the model, a
/// damaged checkpoint), std::runtime_error on an I/O failure.
HfExportResult export_hf(const HfExportRequest& request);

/// An export never replaces files without being told to (checked before anything is read):
/// throws ConvertInputError naming `output_dir` when it is a dangling link, not a directory, or
/// a directory that is not empty without `overwrite`; `flag` ("--to hf") names the export.
void refuse_occupied_output(const std::string& output_dir, bool overwrite, const std::string& flag);

}  // namespace loom::convert
