// `loom`: one executable, subcommands registered by launcher/commands/*.cpp.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "command_registry.h"
#if LOOM_WITH_RUNTIME  // else a torch-free build (launcher/CMakeLists.txt): no devices to load
#include "runtime/device_plugin.h"
#endif

namespace loom::cli {
std::vector<Command>& command_registry() {
  static std::vector<Command> registry;
  return registry;
}
}  // namespace loom::cli

static void print_usage(FILE* out) {
  auto commands = loom::cli::command_registry();
  std::sort(commands.begin(), commands.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::fprintf(out, "usage: loom <command> [args...]\n\ncommands:\n");
  for (const auto& c : commands) std::fprintf(out, "  %-12s %s\n", c.name.c_str(), c.summary.c_str());
  std::fprintf(out, "\n`loom <command> --help` describes each command.\n");
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  // A device plugin registers its device before anything else runs: autograd sizes its
  // per-device queues at the first backward, and the dispatcher must know the device by then.
#if LOOM_WITH_RUNTIME
  try {
    loom::runtime::device_plugin();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: %s\n", e.what());
    return 2;
  }
#endif
  const std::string name = argv[1];
  for (const auto& c : loom::cli::command_registry()) {
    if (c.name != name) continue;
    std::string label = "loom " + name;
    argv[1] = label.data();
    return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "loom: unknown command '%s'\n\n", name.c_str());
  print_usage(stderr);
  return 2;
}
