// `loom convert --from hf DIR --output RUN [--recipe FILE] [layout flags]`: a Hugging Face
// GPT2LMHeadModel directory (config.json; model.safetensors, its sharded index, or
// pytorch_model.bin; vocab.json and merges.txt) as a Loom run directory:
//   RUN/checkpoints/iter_0000000   the model at the requested layout with a fresh optimizer
//                                  (fp32 main parameters = the weights, zero moments, step 0),
//                                  position 0: `loom train` fine-tunes from it;
//   RUN/config.yaml                the recipe (FILE, or a minimal fine-tuning recipe) with the
//                                  model's shape and the layout, tokenizer RUN/tokenizer/*;
//   RUN/tokenizer/vocab.json, merges.txt, and chat_template.jinja when the model's tokenizer
//                                  has a chat template (chat_template.jinja, or
//                                  tokenizer_config.json's chat_template; `loom serve` renders
//                                  chat requests with it).
// `loom generate --checkpoint RUN` reads it as any run.
#pragma once
#include <string>
#include <vector>

#include "convert/layout_request.h"

namespace loom::convert {

struct HfImportRequest {
  std::string hf_dir;
  std::string output_run;
  std::string recipe;                  ///< base recipe for config.yaml; empty: a minimal one
  std::vector<std::string> overrides;  ///< applied to the base recipe
  LayoutRequest layout;
};

struct HfImportResult {
  std::string weights_file;  ///< the file the weights came from
  Layout layout;
};

/// Throws ConvertInputError naming the file, tensor or field for bad input (hf_gpt2.h,
/// hf_files.h; a recipe whose fields do not fit the model or layout; an output run that holds
/// checkpoints already), std::runtime_error on an I/O failure.
HfImportResult import_hf(const HfImportRequest& request);

}  // namespace loom::convert
