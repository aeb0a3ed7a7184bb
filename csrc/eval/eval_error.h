// Bad input to `loom eval` (a task file, a task spec, a flag): commands exit with status 2.
// Messages name the file (with its line), the field and what was expected.
#pragma once
#include <stdexcept>

namespace loom::eval {

class EvalInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace loom::eval
