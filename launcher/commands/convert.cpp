// `loom convert` (docs/design/checkpoint_conversion.md), one of:
//   --to hf DIR --checkpoint RUN [--iteration N]
//       a Loom checkpoint of any layout as a Hugging Face GPT2LMHeadModel directory;
//   --from hf DIR --output RUN [--recipe FILE] [layout flags]
//       a GPT2LMHeadModel directory as a Loom run (checkpoint iteration 0 + config.yaml) that
//       `loom train` fine-tunes and `loom generate` reads;
//   --checkpoint RUN --output RUN2 [--iteration N] [layout flags]
//       a training checkpoint rewritten at another layout with its whole training state, so
//       that `loom train` resumes at the new layout as if it had never stopped.
// Layout flags: --tensor-parallel t --pipeline-parallel p --virtual-pipeline v
// --data-parallel d --distributed-optimizer on|off --first-stage-layers N|even
// --last-stage-layers N|even (unset: the source's).
// Exit 0 ok, 2 bad input (the message names the file, tensor or field), 1 runtime failure.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>

#include "command_registry.h"
#include "convert/convert_error.h"
#include "convert/hf_export.h"
#include "convert/hf_import.h"
#include "convert/reshard.h"
#include "data/data_error.h"
#include "error_text.h"
#include "train/checkpoint_files.h"

namespace {

constexpr const char* kUsage =
    "one of: --to hf DIR --checkpoint RUN | --from hf DIR --output RUN | --checkpoint RUN --output RUN2 "
    "with layout flags";

int convert_command(int argc, char** argv) {
  CLI::App app{"Convert checkpoints: another layout, or Hugging Face GPT-2 out and in."};
  std::vector<std::string> to, from;
  std::string checkpoint, output;
  int64_t iteration = -1;
  app.add_option("--to", to, "hf DIR: write a Hugging Face GPT2LMHeadModel directory")->expected(2);
  app.add_option("--from", from, "hf DIR: read a Hugging Face GPT2LMHeadModel directory")->expected(2);
  app.add_option("--checkpoint", checkpoint, "the Loom run directory (or its checkpoints/ folder) to read");
  app.add_option("--output", output, "the Loom run directory to write");
  app.add_option("--iteration", iteration, "checkpoint iteration (default: the latest)");
  std::string recipe, distributed;
  std::vector<std::string> overrides;
  app.add_option("--recipe", recipe, "--from hf: the training recipe config.yaml starts from (default: a minimal one)");
  loom::convert::LayoutRequest layout;
  int t = 0, p = 0, v = 0, d = 0;
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
  app.add_option("overrides", overrides, "--from hf: recipe overrides key=value for config.yaml");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto bad = [](const std::string& what) {
    std::cerr << "loom convert: error: " << what << "\n";
    return 2;
  };
  try {
    if (!distributed.empty()) layout.distributed_optimizer = distributed == "on";
    if (app.count("--tensor-parallel")) layout.tensor_parallel = t;
    if (app.count("--pipeline-parallel")) layout.pipeline_parallel = p;
    if (app.count("--virtual-pipeline")) layout.virtual_pipeline = v;
    if (app.count("--data-parallel")) layout.data_parallel = d;
    if (app.count("--first-stage-layers")) layout.first_stage_layers = first_stage;
    if (app.count("--last-stage-layers")) layout.last_stage_layers = last_stage;
    const bool layout_flags = layout.tensor_parallel.has_value() || layout.pipeline_parallel.has_value() ||
                              layout.virtual_pipeline.has_value() || layout.data_parallel.has_value() ||
                              layout.distributed_optimizer.has_value() || layout.first_stage_layers.has_value() ||
                              layout.last_stage_layers.has_value();
    if (!to.empty()) {
      if (layout_flags || !recipe.empty() || !overrides.empty())
        return bad("--to hf takes no layout flags, --recipe or overrides (Hugging Face models have no layout)");
      if (to[0] != "hf") return bad("--to " + to[0] + ": the only export format is hf (Hugging Face GPT-2)");
      if (checkpoint.empty()) return bad("--to hf DIR needs --checkpoint RUN (the Loom checkpoint to export)");
      if (!from.empty() || !output.empty()) return bad("--to hf goes with --checkpoint only (not --from or --output)");
      loom::convert::HfExportRequest request;
      request.checkpoint = checkpoint;
      request.output_dir = to[1];
      if (app.count("--iteration")) request.iteration = iteration;
      const auto result = loom::convert::export_hf(request);
      std::cerr << fmt::format("loom convert: iteration {} written to {} as a Hugging Face GPT2LMHeadModel ({} parameters)\n",
                               result.iteration, request.output_dir, result.parameters);
      return 0;
    }
    if (!from.empty()) {
      if (from[0] != "hf") return bad("--from " + from[0] + ": the only import format is hf (Hugging Face GPT-2)");
      if (output.empty()) return bad("--from hf DIR needs --output RUN (the Loom run directory to write)");
      if (!checkpoint.empty() || app.count("--iteration")) return bad("--from hf does not go with --checkpoint or --iteration");
      loom::convert::HfImportRequest request;
      request.hf_dir = from[1];
      request.output_run = output;
      request.recipe = recipe;
      request.overrides = overrides;
      request.layout = layout;
      const auto result = loom::convert::import_hf(request);
      std::cerr << fmt::format("loom convert: {} written to {} as iteration 0 at t={} p={} v={} d={}\n", result.weights_file,
                               output, result.layout.t, result.layout.p, result.layout.v, result.layout.d);
      return 0;
    }
    if (!recipe.empty() || !overrides.empty()) return bad("--recipe and recipe overrides go with --from hf only");
    if (!checkpoint.empty() && !output.empty()) {
      if (!layout_flags) return bad("--checkpoint RUN --output RUN2 needs a layout flag (--tensor-parallel, --pipeline-parallel, "
                                    "--virtual-pipeline, --data-parallel, --distributed-optimizer, --first-stage-layers "
                                    "or --last-stage-layers)");
      loom::convert::ReshardRequest request;
      request.checkpoint = checkpoint;
      request.output_run = output;
      request.layout = layout;
      if (app.count("--iteration")) request.iteration = iteration;
      const auto r = loom::convert::reshard_checkpoint(request);
      std::cerr << fmt::format("loom convert: iteration {} rewritten from t={} p={} v={} d={} to t={} p={} v={} d={}{} in {} "
                               "({} source shard reads)\n",
                               r.iteration, r.from.t, r.from.p, r.from.v, r.from.d, r.to.t, r.to.p, r.to.v, r.to.d,
                               r.to.distributed_optimizer ? " with the distributed optimizer" : "", output, r.files_read);
      return 0;
    }
    return bad(kUsage);
  } catch (const loom::convert::ConvertInputError& e) {
    return bad(e.what());
  } catch (const loom::train::CheckpointError& e) {
    return bad(e.what());
  } catch (const loom::data::DataError& e) {
    return bad(e.what());
  } catch (const std::exception& e) {
    std::cerr << "loom convert: " << loom::cli::error_text(e) << "\n";
    return 1;
  }
}

}  // namespace

LOOM_REGISTER_COMMAND("convert", "convert checkpoints: another layout, Hugging Face GPT-2 out and in", convert_command);
