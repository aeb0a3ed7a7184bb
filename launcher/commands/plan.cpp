// `loom plan`: choose a parallel layout with the analytic planner (csrc/planner, docs/planner.md).
#include "command_registry.h"
#include "planner/cli.h"

namespace {
int plan_main(int argc, char** argv) { return loom::planner::run_plan_command(argc, argv); }
}  // namespace

LOOM_REGISTER_COMMAND("plan", "choose a training layout: memory and speed model, layout search", plan_main);
