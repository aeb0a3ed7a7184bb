#include "planner/text_io.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace loom::planner {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

int run_command_body(const char* command, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s: %s\n", command, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", command, e.what());
    return 1;
  }
}

int parse_and_run(CLI::App& app, int argc, char** argv, const char* command, const std::function<int()>& body) {
  app.name(argc > 0 ? argv[0] : command);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return run_command_body(command, body);
}

std::string read_text(const std::string& path, const std::string& flag) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(fmt::format("{}{}: cannot open file", flag.empty() ? "" : flag + " ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string csv_field(std::string s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c == '\n' ? ' ' : c);
  return out + "\"";
}

void write_text(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }
  std::ofstream out(path);
  if (!out || !(out << text)) throw std::runtime_error(fmt::format("{}: cannot write file", path));
}

}  // namespace loom::planner
