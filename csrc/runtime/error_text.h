// What a user sees of an exception: its message, without the C++ stack that torch's c10::Error
// appends to what() (it helps a developer of Loom, not someone running a recipe; set
// TORCH_SHOW_CPP_STACKTRACES=1 and read the rank's error with a debugger for that).
#pragma once
#include <c10/util/Exception.h>

#include <exception>
#include <new>
#include <string>

namespace loom::runtime {

inline std::string error_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  // std::bad_alloc's what() is only "std::bad_alloc".
  if (dynamic_cast<const std::bad_alloc*>(&e)) return "out of host memory (std::bad_alloc)";
  return e.what();
}

}  // namespace loom::runtime
