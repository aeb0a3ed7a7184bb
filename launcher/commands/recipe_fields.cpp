// `loom recipe-fields`: prints the recipe schema's fields, requirements, defaults and enum names
// as JSON (csrc/config/recipe_fields.h). tools/recipe_fields_table.py writes the field table of
// recipes/README.md from it, and tests/python/test_recipe_fields_table.py checks that the
// committed table is what it writes.
#include <CLI/CLI.hpp>

#include <iostream>

#include "command_registry.h"
#include "config/recipe_fields.h"

namespace {

int recipe_fields_command(int argc, char** argv) {
  CLI::App app{"Print every recipe field of `loom train` (pretraining) and `loom ptune` (prompt_learning) "
               "recipes as JSON: {\"pretraining\": [...], \"prompt_learning\": [...]}, each field "
               "{\"field\", \"need\": required|default|derived, \"default\": YAML text or null, "
               "\"choices\": the names an enum field accepts}."};
  app.name(argc > 0 ? argv[0] : "loom recipe-fields");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  std::cout << loom::config::recipe_fields_json() << "\n";
  return 0;
}

}  // namespace

LOOM_REGISTER_COMMAND("recipe-fields", "print the recipe schema's fields and defaults as JSON", recipe_fields_command);
