// `loom convert` (docs/design/checkpoint_conversion.md), one of:
//   --to hf DIR --checkpoint RUN [--iteration N] [--overwrite]
//       a Loom checkpoint of any layout as a Hugging Face GPT2LMHeadModel directory (a DIR that
//       is not empty is refused unless --overwrite is given);
//   --from hf DIR --output RUN [--recipe FILE] [layout flags]
//       a GPT2LMHeadModel directory as a Loom run (checkpoint iteration 0 + config.yaml) that
//       `loom train` fine-tunes and `loom generate` reads;
//   --checkpoint RUN --output RUN2 [--iteration N] [layout flags]
//       a training checkpoint rewritten at another layout with its whole training state, so
//       that `loom train` resumes at the new layout as if it had never stopped;
//   --to peft DIR --checkpoint ADAPTER_RUN [--base-model HF] [--iteration N] [--overwrite]
//       the LoRA adapters of a `loom finetune` checkpoint in Hugging Face PEFT's format, for the
//       base's --to hf export (HF: its path or Hub name, recorded for AutoPeftModel);
//   --merge-lora --checkpoint ADAPTER_RUN --output RUN2 [--iteration N]
//       the LoRA adapters of a `loom finetune` checkpoint folded into the base they name, as a
//       whole run at the base's layout (docs/design/lora.md);
//   --from peft DIR --base RUN --output ADAPTER_RUN [--iteration N]
//       LoRA adapters in PEFT's format as an adapter checkpoint over the Loom base RUN (its
//       iteration N), read by --merge-lora and --to peft as a `loom finetune` checkpoint.
// Layout flags: --tensor-parallel t --pipeline-parallel p --virtual-pipeline v
// --data-parallel d --distributed-optimizer on|off --first-stage-layers N|even
// --last-stage-layers N|even (unset: the source's).
// Exit 0 ok, 2 bad input (the message names the file, tensor or field), 1 runtime failure.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>
#include <optional>
#include <stdexcept>

#include "command_registry.h"
#include "convert/convert_error.h"
#include "convert/hf_export.h"
#include "convert/hf_import.h"
#include "convert/lora_merge.h"
#include "convert/peft_export.h"
#include "convert/peft_import.h"
#include "convert/reshard.h"
#include "error_text.h"
#include "input_errors.h"
#include "runlog/progress_line.h"

namespace {

constexpr const char* kUsage =
    "one of: --to hf DIR --checkpoint RUN | --to peft DIR --checkpoint ADAPTER_RUN | --from hf DIR --output RUN | "
    "--checkpoint RUN --output RUN2 with layout flags | --merge-lora --checkpoint ADAPTER_RUN --output RUN2 | "
    "--from peft DIR --base RUN --output ADAPTER_RUN";

// The command line, parsed; the layout flags given become `layout`'s set fields.
struct ConvertFlags {
  std::vector<std::string> to, from;
  std::string checkpoint, output, recipe, base, base_model;
  std::optional<int64_t> iteration;
  bool overwrite = false;
  bool merge_lora = false;
  std::vector<std::string> overrides;
  loom::convert::LayoutRequest layout;

  bool layout_flags() const {
    return layout.tensor_parallel || layout.pipeline_parallel || layout.virtual_pipeline || layout.data_parallel ||
           layout.distributed_optimizer || layout.first_stage_layers || layout.last_stage_layers;
  }
};

// Thrown for a flag combination that names no conversion, or one that does not fit it.
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

int export_hf(const ConvertFlags& f) {
  if (f.layout_flags() || !f.recipe.empty() || !f.overrides.empty())
    throw UsageError("--to takes no layout flags, --recipe or overrides (Hugging Face models have no layout)");
  if (f.to[0] != "hf" && f.to[0] != "peft")
    throw UsageError("--to " + f.to[0] + ": the export formats are hf (Hugging Face GPT-2 / Llama) and peft (LoRA adapters)");
  const std::string flag = "--to " + f.to[0];
  if (f.checkpoint.empty()) throw UsageError(flag + " DIR needs --checkpoint RUN (the Loom checkpoint to export)");
  if (!f.from.empty() || !f.output.empty()) throw UsageError(flag + " goes with --checkpoint only (not --from or --output)");
  loom::convert::HfExportRequest request;
  request.checkpoint = f.checkpoint;
  request.output_dir = f.to[1];
  request.iteration = f.iteration;
  request.overwrite = f.overwrite;
  if (f.to[0] == "peft") {
    const auto result = loom::convert::export_peft(request, f.base_model);
    std::cerr << fmt::format("loom convert: the adapters of iteration {} written to {} in PEFT's format ({} modules)\n",
                             result.iteration, request.output_dir, result.modules);
    return 0;
  }
  const auto result = loom::convert::export_hf(request);
  std::cerr << fmt::format("loom convert: iteration {} written to {} as a Hugging Face GPT2LMHeadModel ({} parameters)\n",
                           result.iteration, request.output_dir, result.parameters);
  return 0;
}

int import_peft(const ConvertFlags& f) {
  if (f.base.empty() || f.output.empty())
    throw UsageError("--from peft DIR needs --base RUN (the Loom base the adapters are for, e.g. imported with --from "
                     "hf) and --output ADAPTER_RUN");
  if (!f.checkpoint.empty() || f.layout_flags() || !f.recipe.empty() || !f.overrides.empty())
    throw UsageError("--from peft goes with --base, --output and --iteration (the base's) only");
  loom::convert::PeftImportRequest request;
  request.peft_dir = f.from[1];
  request.base = f.base;
  request.iteration = f.iteration;
  request.output_run = f.output;
  const auto r = loom::convert::import_peft(request);
  std::cerr << fmt::format("loom convert: the adapters of {} modules in {} written to {} as rank-{} adapters over {} "
                           "iteration {}\n",
                           r.modules, f.from[1], f.output, r.rank, f.base, r.base_iteration);
  return 0;
}

int import_hf(const ConvertFlags& f) {
  if (f.overwrite) throw UsageError("--overwrite goes with --to hf only (imports and layout conversions write new runs)");
  if (f.from[0] == "peft") return import_peft(f);
  if (f.from[0] != "hf")
    throw UsageError("--from " + f.from[0] + ": the import formats are hf (Hugging Face GPT-2 / Llama) and peft (LoRA adapters)");
  if (f.output.empty()) throw UsageError("--from hf DIR needs --output RUN (the Loom run directory to write)");
  if (!f.checkpoint.empty() || f.iteration) throw UsageError("--from hf does not go with --checkpoint or --iteration");
  loom::convert::HfImportRequest request;
  request.hf_dir = f.from[1];
  request.output_run = f.output;
  request.recipe = f.recipe;
  request.overrides = f.overrides;
  request.layout = f.layout;
  const auto result = loom::convert::import_hf(request);
  std::cerr << fmt::format("loom convert: {} written to {} as iteration 0 at t={} p={} v={} d={}\n", result.weights_file,
                           f.output, result.layout.tp, result.layout.pp, result.layout.vp, result.layout.dp);
  return 0;
}

int reshard(const ConvertFlags& f) {
  if (f.overwrite) throw UsageError("--overwrite goes with --to hf only (imports and layout conversions write new runs)");
  if (!f.recipe.empty() || !f.overrides.empty()) throw UsageError("--recipe and recipe overrides go with --from hf only");
  if (f.checkpoint.empty() || f.output.empty()) throw UsageError(kUsage);
  if (!f.layout_flags())
    throw UsageError("--checkpoint RUN --output RUN2 needs a layout flag (--tensor-parallel, --pipeline-parallel, "
                     "--virtual-pipeline, --data-parallel, --distributed-optimizer, --first-stage-layers or "
                     "--last-stage-layers)");
  loom::convert::ReshardRequest request;
  request.checkpoint = f.checkpoint;
  request.output_run = f.output;
  request.layout = f.layout;
  request.iteration = f.iteration;
  loom::runlog::ProgressLine::Options line_options;
  line_options.label = "loom convert:";
  line_options.unit = "shard files";
  loom::runlog::ProgressLine line(line_options);
  request.on_progress = [&line](int64_t done, int64_t total) { line.update(double(done), double(total)); };
  const auto r = loom::convert::reshard_checkpoint(request);
  line.end_line();
  std::cerr << fmt::format("loom convert: iteration {} rewritten from t={} p={} v={} d={} to t={} p={} v={} d={}{} in {} "
                           "({} source shard reads)\n",
                           r.iteration, r.from.tp, r.from.pp, r.from.vp, r.from.dp, r.to.tp, r.to.pp, r.to.vp, r.to.dp,
                           r.to.distributed_optimizer ? " with the distributed optimizer" : "", f.output, r.files_read);
  return 0;
}

int merge_lora(const ConvertFlags& f) {
  if (!f.to.empty() || !f.from.empty() || f.overwrite || f.layout_flags() || !f.recipe.empty() || !f.overrides.empty())
    throw UsageError("--merge-lora goes with --checkpoint, --output and --iteration only (the merged run keeps the "
                     "base's layout; reshard it afterwards)");
  if (f.checkpoint.empty() || f.output.empty())
    throw UsageError("--merge-lora needs --checkpoint ADAPTER_RUN (a loom finetune run) and --output RUN2");
  loom::convert::LoraMergeRequest request;
  request.adapter_checkpoint = f.checkpoint;
  request.iteration = f.iteration;
  request.output_run = f.output;
  const auto r = loom::convert::merge_lora(request);
  std::cerr << fmt::format("loom convert: the adapters of iteration {} ({} linears) merged into {} iteration {}, written "
                           "to {}\n",
                           r.iteration, r.merged_weights, r.base_checkpoints, r.base_iteration, f.output);
  return 0;
}

int convert_command(int argc, char** argv) {
  CLI::App app{"Convert checkpoints: another layout, or Hugging Face GPT-2 and Llama out and in."};
  ConvertFlags f;
  int64_t iteration = -1;
  int t = 0, p = 0, v = 0, d = 0;
  std::string distributed;
  app.add_option("--to", f.to, "hf DIR: write a Hugging Face directory (GPT2LMHeadModel, or LlamaForCausalLM for a Llama-family checkpoint); peft DIR: a loom finetune run's LoRA adapters in PEFT's format")->expected(2);
  app.add_option("--from", f.from, "hf DIR: read a Hugging Face GPT2LMHeadModel or LlamaForCausalLM directory; peft DIR: LoRA adapters in PEFT's format (with --base)")->expected(2);
  app.add_option("--base-model", f.base_model, "--to peft: adapter_config.json's base_model_name_or_path (the base's --to hf export or Hub name; default: the Loom base's path)");
  app.add_option("--base", f.base, "--from peft: the Loom run (or checkpoints/) the adapters are for");
  app.add_option("--checkpoint", f.checkpoint, "the Loom run directory (or its checkpoints/ folder) to read");
  app.add_option("--output", f.output, "the Loom run directory to write");
  app.add_flag("--overwrite", f.overwrite, "--to hf: replace the Hugging Face files of a DIR that is not empty");
  app.add_flag("--merge-lora", f.merge_lora, "fold the LoRA adapters of --checkpoint (a loom finetune run) into their base");
  app.add_option("--iteration", iteration, "checkpoint iteration (default: the latest)");
  app.add_option("--recipe", f.recipe, "--from hf: the training recipe config.yaml starts from (default: a minimal one)");
  app.add_option("--tensor-parallel", t, "t of the output (default: the source's)");
  app.add_option("--pipeline-parallel", p, "p of the output");
  app.add_option("--virtual-pipeline", v, "v of the output (1: no interleaving)");
  app.add_option("--data-parallel", d, "d of the output");
  app.add_option("--distributed-optimizer", distributed, "on|off: ZeRO-1 optimizer in the output recipe")
      ->check(CLI::IsMember({"on", "off"}));
  std::string first_stage, last_stage;
  app.add_option("--first-stage-layers", first_stage,
                 "N|even: transformer layers of the output's first pipeline stage (default: the source's when p "
                 "and v stay, else even)");
  app.add_option("--last-stage-layers", last_stage, "N|even: layers of the output's last pipeline stage");
  app.add_option("overrides", f.overrides, "--from hf: recipe overrides key=value for config.yaml");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (app.count("--iteration")) f.iteration = iteration;
  if (!distributed.empty()) f.layout.distributed_optimizer = distributed == "on";
  if (app.count("--tensor-parallel")) f.layout.tensor_parallel = t;
  if (app.count("--pipeline-parallel")) f.layout.pipeline_parallel = p;
  if (app.count("--virtual-pipeline")) f.layout.virtual_pipeline = v;
  if (app.count("--data-parallel")) f.layout.data_parallel = d;
  if (app.count("--first-stage-layers")) f.layout.first_stage_layers = first_stage;
  if (app.count("--last-stage-layers")) f.layout.last_stage_layers = last_stage;
  try {
    if (!f.base.empty() && (f.from.empty() || f.from[0] != "peft")) throw UsageError("--base goes with --from peft only");
    if (!f.base_model.empty() && (f.to.empty() || f.to[0] != "peft"))
      throw UsageError("--base-model goes with --to peft only");
    if (f.merge_lora) return merge_lora(f);
    if (!f.to.empty()) return export_hf(f);
    if (!f.from.empty()) return import_hf(f);
    return reshard(f);
  } catch (const std::exception& e) {
    const bool input = dynamic_cast<const UsageError*>(&e) || dynamic_cast<const loom::convert::ConvertInputError*>(&e) ||
                       loom::cli::input_error_status(e) == 2;
    std::cerr << "loom convert: " << (input ? std::string("error: ") + e.what() : loom::cli::error_text(e)) << "\n";
    return input ? 2 : 1;
  }
}

}  // namespace

LOOM_REGISTER_COMMAND("convert", "convert checkpoints: another layout, Hugging Face GPT-2 / Llama / Qwen2 out and in", convert_command);
