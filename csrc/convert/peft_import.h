// `loom convert --from peft DIR --base RUN --output RUN2 [--iteration N]`: LoRA adapters in
// Hugging Face PEFT's format (adapter_config.json + adapter_model.safetensors, as
// PeftModel.save_pretrained writes them for a GPT2LMHeadModel or LlamaForCausalLM) as a Loom
// adapter checkpoint over the Loom base RUN (e.g. that model imported with `--from hf`), which
// `loom convert --merge-lora` and `--to peft` read as a `loom finetune` checkpoint
// (docs/design/lora.md, "PEFT export and import").
//
// Exactly the same update: PEFT adapts each HF module on its own (q_proj, k_proj, v_proj with
// their own A), Loom one A per fused linear. Modules of one Loom linear that share A (as Loom's
// own export writes them) keep rank r; otherwise their A's are stacked, [A_q; A_k; A_v], and
// each B sits in its own r columns of the fused B (zeros elsewhere), so the fused update is the
// sum of the modules' updates. Every layer and linear then takes the largest such rank R (zero
// rows / columns pad the others), and alpha becomes s·R with s PEFT's scale (lora_alpha / r, or
// lora_alpha / sqrt(r) with use_rslora), so that Loom's alpha / R is s. A module without
// tensors (outside target_modules or layers_to_transform) adds nothing.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace loom::convert {

struct PeftImportRequest {
  std::string peft_dir;              ///< --from peft DIR
  std::string base;                  ///< --base: the Loom run (or checkpoints/) the adapters are for
  std::optional<int64_t> iteration;  ///< --iteration: the base's (default: its latest)
  std::string output_run;            ///< --output: a new run directory
};

struct PeftImportResult {
  int modules = 0;          ///< HF modules whose adapters were read
  int64_t rank = 0;         ///< R, the Loom adapters' rank
  int64_t base_iteration = 0;
};

/// Throws ConvertInputError naming the file, field or tensor: a config that is not LoRA or uses
/// what Loom's adapters cannot represent (DoRA, trained biases, modules_to_save, per-module
/// rank_pattern / alpha_pattern), a tensor of no adapted linear (e.g. an lm_head adapter) or of
/// the wrong shape, a base that is itself an adapter checkpoint, an output run that holds
/// checkpoints already.
PeftImportResult import_peft(const PeftImportRequest& request);

}  // namespace loom::convert
