#include "serve/http_intake.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>
#include <stdexcept>

namespace loom::serve {

namespace {

using Clock = std::chrono::steady_clock;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\t')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t')) --b;
  return s.substr(a, b - a);
}

// Longest chunk-size line accepted (hex digits and extensions).
constexpr size_t kMaxChunkLine = 1024;

const char* status_text(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
  }
  return "Error";
}

}  // namespace

RequestAssembler::RequestAssembler(size_t max_head_bytes, size_t max_body_bytes)
    : max_head_(max_head_bytes), max_body_(max_body_bytes) {}

bool RequestAssembler::fail(int status, std::string field, std::string message) {
  state_ = State::kFailed;
  status_ = status;
  field_ = std::move(field);
  message_ = std::move(message);
  return true;
}

bool RequestAssembler::wants_continue() {
  if (!continue_asked_ || state_ == State::kHead || state_ == State::kFailed || state_ == State::kDone) return false;
  continue_asked_ = false;
  return true;
}

bool RequestAssembler::line(const std::string& in, size_t& pos, std::string& out, size_t max_bytes) {
  const size_t end = in.find("\r\n", pos);
  if (end == std::string::npos) {
    if (in.size() - pos > max_bytes) fail(400, "body", "a chunk-size or trailer line is too long");
    return false;
  }
  out = in.substr(pos, end - pos);
  pos = end + 2;
  return true;
}

bool RequestAssembler::parse_head(const std::string& head) {
  // head: the request line and header lines, each ending in CRLF (the blank line removed).
  size_t pos = head.find("\r\n");
  const std::string request_line = head.substr(0, pos);
  if (request_line.empty() || std::count(request_line.begin(), request_line.end(), ' ') != 2)
    return fail(400, "request line", "expected METHOD TARGET HTTP/1.x");
  head_ = request_line + "\r\n";
  pos += 2;
  bool chunked = false, has_length = false;
  uint64_t length = 0;
  while (pos < head.size()) {
    const size_t end = head.find("\r\n", pos);
    const std::string raw = head.substr(pos, end - pos);
    pos = end + 2;
    if (raw.empty()) continue;
    if (raw[0] == ' ' || raw[0] == '\t') return fail(400, "headers", "folded header lines are not accepted");
    const size_t colon = raw.find(':');
    if (colon == std::string::npos || colon == 0) return fail(400, "headers", "a header line without a name: " + raw.substr(0, 64));
    const std::string name = lower(raw.substr(0, colon));
    const std::string value = trim(raw.substr(colon + 1));
    if (name == "content-length") {
      if (value.empty() || value.size() > 18 || value.find_first_not_of("0123456789") != std::string::npos)
        return fail(400, "Content-Length", "expected a decimal byte count, found '" + value.substr(0, 32) + "'");
      const uint64_t n = std::stoull(value);
      if (has_length && n != length) return fail(400, "Content-Length", "two different values");
      has_length = true;
      length = n;
    } else if (name == "transfer-encoding") {
      if (lower(value) != "chunked")
        return fail(501, "Transfer-Encoding", "only chunked is supported, found '" + value.substr(0, 32) + "'");
      chunked = true;
    } else if (name == "expect") {
      if (lower(value) != "100-continue") return fail(400, "Expect", "only 100-continue is supported");
      continue_asked_ = true;
    } else {
      head_ += raw + "\r\n";
    }
  }
  if (chunked && has_length) return fail(400, "Content-Length", "not allowed with Transfer-Encoding: chunked");
  if (chunked) {
    state_ = State::kChunkSize;
  } else if (length > max_body_) {
    return fail(413, "body", fmt::format("the request body of {} bytes is larger than the server accepts ({} bytes)",
                                         length, max_body_));
  } else {
    remaining_ = length;
    state_ = length > 0 ? State::kBody : State::kDone;
    if (state_ == State::kDone) continue_asked_ = false;
  }
  return state_ == State::kDone;
}

bool RequestAssembler::feed(std::string& in) {
  if (!in.empty()) started_ = true;
  size_t pos = 0;
  while (state_ != State::kDone && state_ != State::kFailed) {
    if (state_ == State::kHead) {
      // Empty lines before the request line are ignored (RFC 9112, 2.2); `pos` is the head's start.
      while (in.size() - pos >= 2 && in.compare(pos, 2, "\r\n") == 0) {
        pos += 2;
        scanned_ = 0;
      }
      const size_t from = pos + (scanned_ > 3 ? scanned_ - 3 : 0);
      const size_t end = in.find("\r\n\r\n", from);
      if (end == std::string::npos) {
        scanned_ = in.size() - pos;
        if (scanned_ > max_head_)
          fail(431, "headers", fmt::format("the request line and headers exceed {} bytes", max_head_));
        break;
      }
      if (end + 4 - pos > max_head_)
        return fail(431, "headers", fmt::format("the request line and headers exceed {} bytes", max_head_));
      const std::string head = in.substr(pos, end + 2 - pos);
      pos = end + 4;
      parse_head(head);
    } else if (state_ == State::kBody || state_ == State::kChunkData) {
      const size_t take = static_cast<size_t>(std::min<uint64_t>(remaining_, in.size() - pos));
      if (take == 0) break;
      body_.append(in, pos, take);
      pos += take;
      remaining_ -= take;
      if (remaining_ == 0) state_ = state_ == State::kBody ? State::kDone : State::kChunkDataEnd;
    } else if (state_ == State::kChunkSize) {
      std::string size_line;
      if (!line(in, pos, size_line, kMaxChunkLine)) break;
      const std::string digits = trim(size_line.substr(0, size_line.find(';')));
      if (digits.empty() || digits.size() > 15 || digits.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
        return fail(400, "body", "malformed chunk size '" + digits.substr(0, 32) + "'");
      remaining_ = std::stoull(digits, nullptr, 16);
      if (body_.size() + remaining_ > max_body_)
        return fail(413, "body", fmt::format("the chunked request body is larger than the server accepts ({} bytes)",
                                             max_body_));
      state_ = remaining_ == 0 ? State::kTrailers : State::kChunkData;
    } else if (state_ == State::kChunkDataEnd) {
      if (in.size() - pos < 2) break;
      if (in.compare(pos, 2, "\r\n") != 0) return fail(400, "body", "a chunk does not end with CRLF");
      pos += 2;
      state_ = State::kChunkSize;
    } else if (state_ == State::kTrailers) {
      std::string trailer;
      if (!line(in, pos, trailer, kMaxChunkLine)) break;
      trailer_bytes_ += trailer.size() + 2;
      if (trailer_bytes_ > max_head_) return fail(431, "headers", "the trailer fields are too large");
      if (trailer.empty()) state_ = State::kDone;  // trailers are dropped
    }
  }
  in.erase(0, std::min(pos, in.size()));
  return done() || failed();
}

std::string RequestAssembler::take_request() {
  std::string out = std::move(head_);
  out += fmt::format("Content-Length: {}\r\n\r\n", body_.size());
  out += body_;
  std::string().swap(body_);
  return out;
}

// One connection held by the poll thread.
struct HttpIntake::Connection {
  int fd = -1;
  std::string in;
  size_t served = 0;
  std::optional<RequestAssembler> request;
  Clock::time_point deadline;  // of the current phase
  Clock::time_point request_deadline;
  bool lingering = false;      // refused: reading and dropping until EOF or the deadline
  bool counted = true;         // within max_connections (false: refused for being past it)
};

HttpIntake::HttpIntake(IntakeOptions options, std::function<void(ReadyRequest)> ready,
                       std::function<std::string(int, const std::string&, const std::string&)> error_body)
    : options_(options), ready_(std::move(ready)), error_body_(std::move(error_body)) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw std::runtime_error(std::string("serve: eventfd: ") + std::strerror(errno));
  thread_ = std::thread([this] { loop(); });
}

HttpIntake::~HttpIntake() {
  stop();
  close(wake_fd_);
}

void HttpIntake::stop() {
  if (stopping_.exchange(true)) return;
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& in : incoming_) close_connection(in.fd);
  incoming_.clear();
}

void HttpIntake::add(int fd, std::string buffered, size_t served) {
  // A new connection is counted (one back from a handler is already); past the limit it is
  // not, and is refused.
  const bool over_limit = served == 0 && ++open_ > static_cast<int64_t>(options_.max_connections);
  if (over_limit) --open_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) {
      incoming_.push_back({fd, std::move(buffered), served, over_limit});
      fd = -1;
    }
  }
  if (fd >= 0) {
    if (!over_limit) --open_;
    return close_connection(fd);
  }
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void HttpIntake::close_connection(int fd) {
  shutdown(fd, SHUT_RDWR);
  close(fd);
}

void HttpIntake::close_handled(int fd) {
  shutdown(fd, SHUT_WR);
  close(fd);
  --open_;
}

void HttpIntake::refuse(Connection& c, int status, const std::string& field, const std::string& message) {
  const std::string body = error_body_(status, field.empty() ? message : field + ": " + message, field);
  const std::string response =
      fmt::format("HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                  status, status_text(status), body.size(), body);
  // Small: it fits the socket's empty send buffer (a client that cannot take it loses it).
  (void)!send(c.fd, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  shutdown(c.fd, SHUT_WR);
  c.lingering = true;
  c.request.reset();
  std::string().swap(c.in);
  c.deadline = Clock::now() + std::chrono::milliseconds(options_.linger_ms);
}

void HttpIntake::adopt_incoming(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& in : incoming_) {
    auto c = std::make_unique<Connection>();
    c->fd = in.fd;
    c->in = std::move(in.bytes);
    c->served = in.served;
    c->deadline = now + std::chrono::milliseconds(c->served == 0 ? options_.header_timeout_ms
                                                                 : options_.keep_alive_timeout_ms);
    // Past --max-connections: answered 503 at once and closed once the client read it
    // (lingering, bounded too: past that a connection is closed unanswered).
    if (in.over_limit) {
      c->counted = false;
      if (refused_lingering_ >= options_.max_connections) {
        close_connection(in.fd);
        continue;
      }
      ++refused_lingering_;
      refuse(*c, 503, "", fmt::format("the server holds its maximum of {} connections (--max-connections); "
                                      "retry later", options_.max_connections));
    }
    connections_[in.fd] = std::move(c);
  }
  incoming_.clear();
}

void HttpIntake::wait_for_input(std::vector<pollfd>& polled, Clock::time_point now) {
  polled.clear();
  polled.push_back({wake_fd_, POLLIN, 0});
  auto next = now + std::chrono::seconds(1);
  for (auto& [fd, c] : connections_) {
    polled.push_back({fd, POLLIN, 0});
    next = std::min(next, c->deadline);
  }
  const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
  // Bytes read before the connection came here (pipelined) are handled without waiting.
  bool buffered = false;
  for (auto& [fd, c] : connections_) buffered = buffered || (!c->in.empty() && !c->request);
  const int n = poll(polled.data(), polled.size(), buffered ? 0 : static_cast<int>(std::max<int64_t>(wait_ms, 0) + 1));
  if (n < 0 && errno != EINTR) throw std::runtime_error(std::string("serve: poll: ") + std::strerror(errno));
  if (polled[0].revents) {
    uint64_t count = 0;
    (void)!read(wake_fd_, &count, sizeof(count));
  }
}

bool HttpIntake::service(Connection& c, bool readable, Clock::time_point now, std::vector<char>& buffer) {
  bool eof = false;
  // A refused request's remaining bytes are dropped faster: up to 16 reads at a time.
  for (int reads = 0; readable && reads < (c.lingering ? 16 : 1); ++reads) {
    const ssize_t got = recv(c.fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
    if (got > 0 && !c.lingering) c.in.append(buffer.data(), static_cast<size_t>(got));
    eof = got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    if (got <= 0) break;
  }
  if (c.lingering) return eof || now >= c.deadline;
  if (!c.in.empty() && !c.request) {  // a request starts (a new connection's deadline stays)
    c.request.emplace(options_.max_head_bytes, options_.max_body_bytes);
    if (c.served > 0) c.deadline = now + std::chrono::milliseconds(options_.header_timeout_ms);
    c.request_deadline = now + std::chrono::milliseconds(options_.request_timeout_ms);
  }
  if (c.request) {
    const bool head_before = c.request->head_done();
    c.request->feed(c.in);
    if (!head_before && c.request->head_done()) c.deadline = c.request_deadline;
    if (c.request->wants_continue()) {
      static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      (void)!send(c.fd, kContinue, sizeof(kContinue) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    if (c.request->failed()) {
      refuse(c, c.request->status(), c.request->field(), c.request->message());
      return false;
    }
    if (c.request->done()) {
      hand_over(c);
      return false;
    }
  }
  if (eof) return true;  // the client closed before its request was complete: nothing to answer
  if (now >= c.deadline) {
    if (!c.request || !c.request->started()) return true;
    refuse(c, 408, c.request->head_done() ? "body" : "headers",
           c.request->head_done() ? "the request body did not arrive in time"
                                  : "the request line and headers did not arrive in time");
  }
  return false;
}

void HttpIntake::hand_over(Connection& c) {
  if (queued_ >= static_cast<int64_t>(options_.max_queued)) {
    refuse(c, 503, "", "the server is busy: too many requests are waiting; retry later");
    return;
  }
  ReadyRequest r;
  r.fd = c.fd;
  r.request = c.request->take_request();
  r.body_bytes = r.request.size();
  r.leftover = std::string(c.in);  // a copy: the buffer's capacity (up to the body's) is freed
  r.served = c.served;
  ++queued_;
  connections_.erase(r.fd);  // the handler owns the socket now (`c` is gone)
  ready_(std::move(r));
}

void HttpIntake::loop() {
  std::vector<pollfd> polled;
  std::vector<char> buffer(64 << 10);
  while (!stopping_) {
    adopt_incoming(Clock::now());
    wait_for_input(polled, Clock::now());
    const auto after = Clock::now();
    std::vector<int> closed;
    for (size_t i = 1; i < polled.size(); ++i) {
      if (service(*connections_.at(polled[i].fd), polled[i].revents != 0, after, buffer)) closed.push_back(polled[i].fd);
    }
    for (int fd : closed) {
      if (connections_.at(fd)->counted) --open_;
      else --refused_lingering_;
      close_connection(fd);
      connections_.erase(fd);
    }
  }
  for (auto& [fd, c] : connections_) close_connection(fd);
  connections_.clear();
}

}  // namespace loom::serve
