// Small helpers shared by the planner's commands: case folding, whole-file I/O with errors
// that name the flag the path came from, CSV columns, and the exit status of a failure or a
// bad flag.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace CLI {
class App;
}

namespace loom::planner {

/// ASCII lower case.
std::string lower(std::string s);

/// Runs a command's `body` and returns its exit status, or the status of what it threw
/// (docs/architecture.md, "Commands"): std::invalid_argument (bad input) 2, any other exception
/// 1, each printed to stderr as "<command>: <what>".
int run_command_body(const char* command, const std::function<int()>& body);

/// Names `app` argv[0] (else `command`), parses argv into its flags, then runs `body` as run_command_body does. A --help exits 0
/// and a bad flag 2, each with CLI11's message, without running `body`.
int parse_and_run(CLI::App& app, int argc, char** argv, const char* command, const std::function<int()>& body);

/// Whole file as text. Throws std::invalid_argument "<flag> <path>: cannot open file" (flag may
/// be empty).
std::string read_text(const std::string& path, const std::string& flag = "");

/// `s` as one CSV field: quoted (quotes doubled, newlines as spaces) when it holds a comma,
/// quote or newline.
std::string csv_field(std::string s);

/// One CSV column: its header and the cell it writes for a row (`rank`: the row's 1-based
/// position in the table).
template <class Row>
struct CsvColumn {
  std::string name;
  std::function<std::string(const Row& row, std::size_t rank)> cell;
};

/// A column of `get(row)` written as fmt writes it ("{}").
template <class Row, class Get>
CsvColumn<Row> csv_value(std::string name, Get get) {
  return {std::move(name), [get](const Row& row, std::size_t) { return fmt::format("{}", get(row)); }};
}

/// A column of the number `get(row)` with `decimals` digits after the point.
template <class Row, class Get>
CsvColumn<Row> csv_fixed(std::string name, int decimals, Get get) {
  return {std::move(name),
          [decimals, get](const Row& row, std::size_t) { return fmt::format("{:.{}f}", double(get(row)), decimals); }};
}

/// The CSV text of `rows` under `columns`: the header line, then one line per row (each line
/// ends with a newline).
template <class Row>
std::string csv_table(const std::vector<CsvColumn<Row>>& columns, const std::vector<Row>& rows) {
  std::string s;
  for (std::size_t k = 0; k < columns.size(); ++k) s += (k ? "," : "") + columns[k].name;
  s += '\n';
  for (std::size_t i = 0; i < rows.size(); ++i) {
    for (std::size_t k = 0; k < columns.size(); ++k) s += (k ? "," : "") + columns[k].cell(rows[i], i + 1);
    s += '\n';
  }
  return s;
}

/// Writes `text` to `path` ("-" = stdout). Throws std::runtime_error naming the path when it
/// cannot be written.
void write_text(const std::string& path, const std::string& text);

}  // namespace loom::planner
