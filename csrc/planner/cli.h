// `loom plan`: command-line front end of the planner (launcher/commands/plan.cpp registers it).
#pragma once

namespace loom::planner {

/// Parses `loom plan` arguments (argv[0] is the program label), runs the search and prints the
/// report on stderr (CSV and the recipe go to files or stdout when asked). Returns the exit
/// status: 0 success, 2 bad usage or input, 1 no layout fits or an output file cannot be written.
int run_plan_command(int argc, char** argv);

}  // namespace loom::planner
