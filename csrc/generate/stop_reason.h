// Why generation of one sequence ended, in one vocabulary for `loom generate`
// (generate_tokens), generation with learned prompts, and the serving engine
// (serve/engine.h, whose requests report it and whose APIs turn it into a finish_reason).
#pragma once

namespace loom::generate {

enum class StopReason {
  kNone,          ///< not ended (a running request of the serving engine)
  kMaxNewTokens,  ///< the request's max new tokens were generated
  kStopToken,     ///< the stop token (<|endoftext|>) was drawn; it is not returned
  kStopString,    ///< the new tokens' text holds a stop string (the token completing it is returned)
  kContextFull,   ///< the next token would need a position past max_position_embeddings
  /// The serving engine's report of kStopToken or kStopString: its APIs answer "stop" for both.
  kStop,
  kCancelled,     ///< the serving engine dropped the request (its client went away)
  kError,         ///< choosing the next token failed (serving engine: that request alone ends)
  kLength = kMaxNewTokens,  ///< the completion APIs' name ("length") of kMaxNewTokens
};

/// `loom generate`'s words for `reason` ("max-new-tokens reached", "stopped at <|endoftext|>", ...).
const char* describe(StopReason reason);

}  // namespace loom::generate
