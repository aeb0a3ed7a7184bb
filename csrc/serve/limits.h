// Every limit `loom serve` puts on a request and on a connection, defined here once
// (docs/serving.md, "Limits"): what one request may ask for (checked before any work starts, each
// refusal a 400 naming the field), the sampling ranges that keep the engine's arithmetic finite,
// and the HTTP front's deadlines and bounds (serve/http_intake.h). The flags that override some
// of them (`--max-body-mb`) take their defaults from here.
#pragma once
#include <cstddef>
#include <cstdint>

#include "generate/request_checks.h"

namespace loom::serve::limits {

// --- one request's fields (serve/http_api.h) ---

/// Nesting of JSON arrays and objects in a body (the deepest legal body nests 3: a list of
/// token-id lists in the body object). Checked while parsing, before any recursive walk.
constexpr int kMaxJsonDepth = 16;
/// Prompts per request (OpenAI `prompt` list, NeMo `sentences`; NeMo's own limit).
constexpr size_t kMaxPrompts = 128;
/// Messages per chat request (`messages`; each is rendered by the chat template).
constexpr size_t kMaxChatMessages = 1024;
/// OpenAI's `stop`: at most 4 strings (OpenAI's documented limit).
constexpr size_t kMaxStopStrings = 4;
/// NeMo's `end_strings` (NeMo sets none; <|endoftext|> counts as one).
constexpr size_t kMaxEndStrings = 16;
/// Bytes of one stop or end string (each is copied into every prompt's request and searched
/// for after every token).
constexpr size_t kMaxStopBytes = 1024;
/// Alternatives per token (`logprobs`; NeMo's `all_probs` returns this many): defined with the
/// request check the engine and the APIs share (generate/request_checks.h).
using generate::kMaxTopLogprobs;
/// A prompt text may hold at most context × (the tokenizer's longest token, in bytes) bytes:
/// a longer one cannot fit the context, and is refused before it is tokenized.
/// (ApiContext::max_prompt_bytes holds the product.)

/// Sampling ranges. Positive temperatures start at kMinTemperature (0 is greedy): the sampler
/// divides logits by it. Penalties stay within [kMinRepetitionPenalty, kMaxRepetitionPenalty]:
/// a logit is divided or multiplied by it in float. A value still driving a logit to inf or
/// NaN fails that request alone (serve/engine.h).
constexpr double kMinTemperature = 1e-3;
constexpr double kMaxTemperature = 100.0;
constexpr double kMinRepetitionPenalty = 1e-2;
constexpr double kMaxRepetitionPenalty = 100.0;

// --- connections (serve/http_intake.h, serve/http_server.h) ---

/// Default request-body limit (`--max-body-mb`), MiB; chunked bodies included.
constexpr int64_t kDefaultMaxBodyMiB = 8;
constexpr int64_t kMaxBodyMiBFlag = 4096;  ///< the largest `--max-body-mb` accepted
/// Request line and headers together (431 beyond).
constexpr size_t kMaxHeadBytes = 64 << 10;
/// A request's line and headers must arrive within this long of its first byte (a new
/// connection's: of its opening); 408 and close otherwise.
constexpr int kHeaderTimeoutS = 10;
/// The whole request (headers and body) within this long of its first byte.
constexpr int kRequestTimeoutS = 60;
/// An idle keep-alive connection is closed after this long.
constexpr int kKeepAliveTimeoutS = 5;
/// Requests on one keep-alive connection.
constexpr size_t kKeepAliveMaxCount = 1000;
/// Open connections at most (`--max-connections`, default): those sending their request, idle
/// between requests, or being answered. A new connection past it is answered 503 and closed
/// (never reset). The listen backlog (connections the kernel queues before they are accepted,
/// capped by net.core.somaxconn) is the same number, so that a burst of that many clients
/// connecting at once all get in.
constexpr int64_t kDefaultMaxConnections = 256;
constexpr int64_t kMaxConnectionsFlag = 65536;  ///< the largest `--max-connections` accepted
/// Handler threads: each runs one complete request at a time (waiting for the engine).
constexpr int kHandlerThreads = 128;
/// A response write may wait this long for the client to read.
constexpr int kWriteTimeoutS = 30;
/// After a refusal (413, 408, ...) what the client still sends is read and dropped for this
/// long, so that a client that writes its whole body before reading sees the answer.
constexpr int kLingerS = 10;
/// Complete requests waiting for a handler thread, at most (503 beyond).
constexpr size_t kMaxQueuedRequests = 4 * kHandlerThreads;

}  // namespace loom::serve::limits
