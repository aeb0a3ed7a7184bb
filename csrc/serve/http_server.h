// The HTTP front of `loom serve` on the serving rank (cpp-httplib; docs/serving.md): routes
// `PUT /generate` (NeMo), `POST /v1/completions` and `POST /v1/chat/completions` (OpenAI,
// streamed as server-sent events when asked), `GET /v1/models`, `GET /health` and
// `GET /metrics` (serve/metrics.h) to the engine, on a pool of handler threads while
// the engine steps on the caller's thread. Connections are read by one poll thread
// (serve/http_intake.h: deadlines, head and body limits, chunked bodies included) and a handler
// thread takes only a complete request, so slow or idle clients cannot hold the handlers. Every
// refused request gets a JSON error naming the field, an optional API key is checked as a
// bearer token (401), a request whose sampling fails gets 500 alone, and a stream whose client
// went away cancels its requests.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "serve/engine.h"
#include "serve/http_api.h"
#include "serve/limits.h"

namespace loom::serve {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 5555;                       ///< 0: any free port (printed)
  std::string api_key;                   ///< empty: no authentication
  size_t max_body_bytes = static_cast<size_t>(limits::kDefaultMaxBodyMiB) << 20;
  int threads = limits::kHandlerThreads;  ///< handler threads (one per request being answered)
  int header_timeout_s = limits::kHeaderTimeoutS;  ///< see limits::kHeaderTimeoutS
  /// Open connections at most, and the listen backlog (limits::kDefaultMaxConnections).
  int64_t max_connections = limits::kDefaultMaxConnections;
};

class HttpServer {
 public:
  /// Binds host:port (throws std::runtime_error naming them when it cannot) with a listen
  /// backlog of options.max_connections; raises the open-file limit to what that many
  /// connections need (std::invalid_argument naming --max-connections when the hard limit is
  /// lower).
  HttpServer(GenerationEngine& engine, ApiContext api, HttpOptions options);
  ~HttpServer();
  int port() const { return port_; }

  /// Serves until `stop` becomes true, then refuses new generation requests (503), finishes
  /// the ones accepted, stops every rank's engine and returns. Rethrows what a step threw
  /// (a dead rank, a collective timeout).
  void run(const std::atomic<bool>& stop);

 private:
  struct State;
  std::unique_ptr<State> state_;
  int port_ = 0;
};

/// Every other rank: steps the engine until the serving rank stops it.
void follow(GenerationEngine& engine);

}  // namespace loom::serve
