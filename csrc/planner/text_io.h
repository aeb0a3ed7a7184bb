// Small text helpers shared by the planner's commands: case folding and whole-file I/O with
// errors that name the flag the path came from.
#pragma once
#include <string>

namespace loom::planner {

/// ASCII lower case.
std::string lower(std::string s);

/// Whole file as text. Throws std::invalid_argument "<flag> <path>: cannot open file" (flag may
/// be empty).
std::string read_text(const std::string& path, const std::string& flag = "");

/// `s` as one CSV field: quoted (quotes doubled, newlines as spaces) when it holds a comma,
/// quote or newline.
std::string csv_field(std::string s);

/// Writes `text` to `path` ("-" = stdout). Throws std::runtime_error naming the path when it
/// cannot be written.
void write_text(const std::string& path, const std::string& text);

}  // namespace loom::planner
