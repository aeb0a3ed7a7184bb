// The commands' name for runtime/error_text.h (one definition, shared with the trainer, which
// records a rank's error before the launcher prints it).
#pragma once
#include "runtime/error_text.h"

namespace loom::cli {
using runtime::error_text;
}  // namespace loom::cli
