// The exception loom_data throws for bad input (a malformed file, an impossible option), as
// opposed to runtime failures (I/O errors) which stay std::runtime_error. Commands map it to
// exit status 2 (docs/design/conventions.md, "Command line").
#pragma once
#include <stdexcept>
#include <string>

namespace loom::data {

struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace loom::data
