// The error of `loom convert` for bad input (a missing or malformed file, a tensor of the wrong
// shape, a model config the other side cannot represent, a layout the model does not allow):
// the message names the file, tensor or field. The command exits 2 for it, 1 for anything else.
#pragma once
#include <stdexcept>
#include <string>

namespace loom::convert {

class ConvertInputError : public std::runtime_error {
 public:
  explicit ConvertInputError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace loom::convert
