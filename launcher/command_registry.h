// Subcommands of the `loom` executable register themselves here, one file each
// (launcher/commands/<name>.cpp), so adding a command never touches main.cpp.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace loom::cli {

/// A subcommand: `loom <name> args...`. `run` receives argv with argv[0] = "loom <name>"
/// and returns the process exit status: 0 success, 2 bad usage or input, 1 runtime failure
/// (docs/design/conventions.md, "Command line").
struct Command {
  std::string name;
  std::string summary;
  std::function<int(int argc, char** argv)> run;
};

std::vector<Command>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::string summary, std::function<int(int, char**)> run) {
    command_registry().push_back({std::move(name), std::move(summary), std::move(run)});
  }
};

}  // namespace loom::cli

/// Registers a subcommand from its own translation unit (compiled into the executable).
#define LOOM_REGISTER_COMMAND(NAME, SUMMARY, FN) \
  static ::loom::cli::CommandRegistrar loom_command_registrar_##FN(NAME, SUMMARY, FN)
