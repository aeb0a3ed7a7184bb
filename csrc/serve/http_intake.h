// The front of `loom serve`'s HTTP server (docs/serving.md, "Limits"): one poll thread reads
// every connection's request, head and body, before a handler thread sees it, so that slow or
// idle connections never hold a handler thread (a client sending its headers a byte at a time
// costs one buffer here, not a thread). It enforces the limits of serve/limits.h while reading:
// the head within kHeaderTimeoutS of its first byte and kMaxHeadBytes (408, 431), the body
// within the request deadline and --max-body-mb whether sent with Content-Length or chunked
// (413 as soon as the limit is passed, without keeping the bytes), and at most
// `--max-connections` open connections (a connection past it is answered 503 at once, then
// closed once the client has read it: never reset). A complete request is
// handed over decoded (a chunked body becomes a Content-Length one) with the bytes that follow
// it; a refused one is answered here with the JSON error body of serve/http_api.h, and what the
// client still sends is read and dropped for a while so that it sees the answer.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

struct pollfd;  // <poll.h>

namespace loom::serve {

/// One request being assembled from a connection's bytes (no socket here: tested alone).
/// feed() the bytes as they come; it stops at the end of the request and leaves the rest.
class RequestAssembler {
 public:
  RequestAssembler(size_t max_head_bytes, size_t max_body_bytes);

  /// Consumes bytes of `in` from the front (what it used is erased; bytes after a complete
  /// request stay). Returns done() || failed().
  bool feed(std::string& in);
  bool started() const { return started_; }
  bool head_done() const { return state_ != State::kHead; }
  bool done() const { return state_ == State::kDone; }
  bool failed() const { return state_ == State::kFailed; }
  /// The client waits for "100 Continue" before sending the body (asked once, after the head).
  bool wants_continue();
  /// The request as httplib reads it: request line, headers (Transfer-Encoding and Expect
  /// removed), Content-Length of the decoded body, the body. Valid once done().
  std::string take_request();
  /// Once failed(): the status (400, 413, 431, 501), the field and what was wrong.
  int status() const { return status_; }
  const std::string& field() const { return field_; }
  const std::string& message() const { return message_; }

 private:
  enum class State { kHead, kBody, kChunkSize, kChunkData, kChunkDataEnd, kTrailers, kDone, kFailed };
  bool fail(int status, std::string field, std::string message);
  bool parse_head(const std::string& head);
  // Reads one CRLF-terminated line of `in` from `pos` (false: not complete yet).
  bool line(const std::string& in, size_t& pos, std::string& out, size_t max_bytes);

  size_t max_head_, max_body_;
  State state_ = State::kHead;
  bool started_ = false;
  size_t scanned_ = 0;  // bytes of the head searched for its end
  std::string head_;    // request line and the headers kept, each with CRLF
  std::string body_;
  uint64_t remaining_ = 0;  // of the Content-Length body or of the current chunk
  size_t trailer_bytes_ = 0;
  bool continue_asked_ = false;
  int status_ = 0;
  std::string field_, message_;
};

/// The limits the intake enforces; the server fills them from serve/limits.h and its flags.
struct IntakeOptions {
  size_t max_body_bytes = 0;      ///< decoded body (413)
  size_t max_head_bytes = 0;      ///< request line and headers (431)
  int header_timeout_ms = 0;      ///< head complete within this of its first byte (408)
  int request_timeout_ms = 0;     ///< whole request within this of its first byte (408)
  int keep_alive_timeout_ms = 0;  ///< an idle connection between requests is closed after this
  int linger_ms = 0;              ///< reading and dropping after a refusal
  /// Open connections, those whose request a handler answers included (`--max-connections`);
  /// a new one past it gets 503 and is closed. At most as many refused ones linger at once
  /// (beyond, a new connection is closed without an answer).
  size_t max_connections = 0;
  size_t max_queued = 0;          ///< requests handed over and not yet answered (503 beyond)
};

/// A complete request for a handler thread; it owns `fd` from now on.
struct ReadyRequest {
  int fd = -1;
  std::string request;   ///< see RequestAssembler::take_request
  std::string leftover;  ///< bytes the client sent after it (the next request's start)
  size_t served = 0;     ///< requests answered on this connection before
  size_t body_bytes = 0;  ///< bytes of `request` (large ones: memory is handed back after)
};

class HttpIntake {
 public:
  /// `ready` runs on the poll thread: it must only queue the request. `error_body(status,
  /// message, field)` gives the JSON text of a refusal.
  HttpIntake(IntakeOptions options, std::function<void(ReadyRequest)> ready,
             std::function<std::string(int, const std::string&, const std::string&)> error_body);
  ~HttpIntake();  ///< stops the thread and closes the connections it holds

  /// Any thread: a new connection (served 0), or one back for its next request with the bytes
  /// already read. After stop(), closes `fd`.
  void add(int fd, std::string buffered = {}, size_t served = 0);
  /// A handed-over request was answered (for max_queued).
  void answered() { --queued_; }
  /// A handler closes the connection of a handed-over request (instead of giving it back with
  /// add()): closes `fd` and counts it out of the open connections.
  void close_handled(int fd);
  /// Connections open now (held here or by a handler), for the metrics.
  int64_t open_connections() const { return open_; }
  /// Stops the poll thread and closes every connection it holds (idempotent).
  void stop();

 private:
  struct Connection;
  using Clock = std::chrono::steady_clock;
  void loop();
  // The steps of one turn of loop(): take new and returned connections; poll them (until input,
  // the nearest deadline or a wake-up); read and advance one connection (true: close it);
  // give a complete request to a handler (or refuse it when too many wait).
  void adopt_incoming(Clock::time_point now);
  void wait_for_input(std::vector<pollfd>& polled, Clock::time_point now);
  bool service(Connection& c, bool readable, Clock::time_point now, std::vector<char>& buffer);
  void hand_over(Connection& c);
  void refuse(Connection& c, int status, const std::string& field, const std::string& message);
  void close_connection(int fd);

  IntakeOptions options_;
  std::function<void(ReadyRequest)> ready_;
  std::function<std::string(int, const std::string&, const std::string&)> error_body_;
  int wake_fd_ = -1;
  std::mutex mutex_;  // incoming_
  struct Incoming {
    int fd;
    std::string bytes;  // read before (the next request's start)
    size_t served;
    bool over_limit;    // a new connection past max_connections (decided in arrival order)
  };
  std::vector<Incoming> incoming_;
  std::map<int, std::unique_ptr<Connection>> connections_;                // poll thread only
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> queued_{0};
  std::atomic<int64_t> open_{0};     // counted connections (max_connections)
  size_t refused_lingering_ = 0;     // poll thread only: over-limit connections being closed
  std::thread thread_;
};

}  // namespace loom::serve
