#include "generate/stop_reason.h"

namespace loom::generate {

const char* describe(StopReason reason) {
  switch (reason) {
    case StopReason::kNone: return "not stopped";
    case StopReason::kMaxNewTokens: return "max-new-tokens reached";
    case StopReason::kStopToken: return "stopped at <|endoftext|>";
    case StopReason::kStopString: return "stopped at a stop string";
    case StopReason::kContextFull: return "stopped at max_position_embeddings";
    case StopReason::kStop: return "stopped at <|endoftext|> or a stop string";
    case StopReason::kCancelled: return "cancelled";
    case StopReason::kError: return "failed";
  }
  return "";
}

}  // namespace loom::generate
