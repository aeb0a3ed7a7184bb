// `loom plan`: choose a parallel layout with the analytic planner (csrc/planner, docs/planner.md);
// `loom plan calibrate` measures this machine for it; `loom plan infer` plans inference.
#include <cstring>

#include "calibrate/calibrate.h"
#include "command_registry.h"
#include "planner/cli.h"
#include "planner/inference_cli.h"

namespace {
int plan_main(int argc, char** argv) {
  if (argc > 1 && !std::strcmp(argv[1], "calibrate")) {
    static char label[] = "loom plan calibrate";
    argv[1] = label;
    return loom::calibrate::run_calibrate_command(argc - 1, argv + 1);
  }
  if (argc > 1 && !std::strcmp(argv[1], "infer")) {
    static char label[] = "loom plan infer";
    argv[1] = label;
    return loom::planner::run_plan_inference_command(argc - 1, argv + 1);
  }
  return loom::planner::run_plan_command(argc, argv);
}
}  // namespace

LOOM_REGISTER_COMMAND("plan",
                      "choose a training layout (memory and speed model, layout search, --measure); "
                      "`plan calibrate` measures this machine, `plan infer` plans inference",
                      plan_main);
