#include "serve/http_server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <malloc.h>
#include <netdb.h>
#include <poll.h>
#include <sys/select.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "serve/chat_api.h"
#include "serve/http_intake.h"
#include "serve/metrics.h"

namespace loom::serve {

using nlohmann::json;

namespace {

// Idle engine steps are paced: the other ranks hear from the serving rank this often.
constexpr int kIdleStepMs = 20;

// One HTTP request's engine requests and what they produced so far.
struct Job {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<uint64_t> ids;
  std::vector<RequestResult> results;
  size_t remaining = 0;
  bool failed = false;  // the engine stopped (a rank died)
  uint64_t version = 0;
};

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& field = "") {
  send_json(res, status, error_body(status, message, field));
}

int64_t now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The APIs' finish_reason (OpenAI's words; "" while the request runs).
const char* reason_text(FinishReason r) {
  switch (r) {
    case FinishReason::kMaxNewTokens:
    case FinishReason::kContextFull: return "length";
    case FinishReason::kStop:
    case FinishReason::kStopToken:
    case FinishReason::kStopString: return "stop";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return "";
}

// Compares the whole of both keys whatever differs first (no timing hint of a key's prefix).
bool same_key(const std::string& given, const std::string& expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ expected[i % std::max<size_t>(expected.size(), 1)]);
  return diff == 0;
}

// The first failed request of a job: its message ("" when none failed).
std::string failure(const std::vector<RequestResult>& results) {
  for (const auto& r : results)
    if (!r.error.empty()) return r.error;
  return "";
}

// A request the intake read whole, answered on its socket: httplib parses it from memory and
// writes the response through write(). Unlike httplib's socket stream, a client that shut its
// sending side (half-close) still gets its answer; a client that is gone fails the write.
class AssembledStream : public httplib::Stream {
 public:
  AssembledStream(int fd, std::string request, int write_timeout_ms)
      : fd_(fd), request_(std::move(request)), write_timeout_ms_(write_timeout_ms) {}
  bool is_readable() const override { return pos_ < request_.size(); }
  bool is_writable() const override {
    pollfd p{fd_, POLLOUT, 0};
    return poll(&p, 1, write_timeout_ms_) > 0 && !(p.revents & (POLLERR | POLLHUP | POLLNVAL));
  }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, request_.size() - pos_);
    std::memcpy(ptr, request_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    size_t sent = 0;
    while (sent < size) {
      if (!is_writable()) return -1;
      const ssize_t n = send(fd_, ptr + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
      if (n > 0) sent += static_cast<size_t>(n);
    }
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { address(true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address(false, ip, port); }
  // httplib refuses descriptors >= FD_SETSIZE because its own streams select(); this one
  // polls, so such a descriptor is reported as -1 (the value is used for nothing else).
  socket_t socket() const override { return fd_ < FD_SETSIZE ? fd_ : -1; }

 private:
  void address(bool peer, std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int rc = peer ? getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len)
                        : getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    char host[NI_MAXHOST] = "", serv[NI_MAXSERV] = "";
    if (rc == 0 && getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), serv, sizeof(serv),
                               NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
      ip = host;
      port = std::atoi(serv);
    }
  }
  int fd_;
  std::string request_;
  size_t pos_ = 0;
  int write_timeout_ms_;
};

// httplib's server with its accepted sockets going to the intake instead of a handler thread,
// and its request processing callable on a stream of ours.
class IntakeServer : public httplib::Server {
 public:
  std::function<void(int)> accepted;
  bool serve(httplib::Stream& stream, bool close_connection, bool& connection_closed) {
    return process_request(stream, close_connection, connection_closed, nullptr);
  }
  // httplib listens with a backlog of 5 (Debian's build): clients connecting together past it
  // were reset. listen() again on the bound socket sets a longer queue.
  void widen_backlog(int backlog) {
    if (::listen(svr_sock_, backlog) != 0)
      throw std::runtime_error(std::string("serve: listen: ") + std::strerror(errno));
  }

 private:
  bool process_and_close_socket(socket_t sock) override {
    accepted(sock);
    return true;
  }
};

// httplib's accept loop hands each socket to its task queue: this one runs the hand-over at
// once on the accepting thread (it only queues the socket for the intake).
struct InlineQueue : httplib::TaskQueue {
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

// Bodies at least this large release the memory they took back to the system once answered
// (malloc_trim): glibc keeps freed memory in per-thread arenas otherwise.
constexpr size_t kTrimAfterBytes = size_t{1} << 20;
// File descriptors the process keeps beside its connections (files, pipes, the other ranks' sockets).
constexpr rlim_t kSpareDescriptors = 256;

// Raises the soft open-file limit to what `max_connections` need: each counted connection and
// each refused one still being closed (as many) holds a descriptor.
void reserve_descriptors(int64_t max_connections) {
  const rlim_t need = static_cast<rlim_t>(2 * max_connections) + kSpareDescriptors;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= need) return;
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < need)
    throw std::invalid_argument(fmt::format(
        "--max-connections {}: needs {} open files (2 per connection + {}), and this process may open at most {} "
        "(ulimit -Hn)", max_connections, need, kSpareDescriptors, limit.rlim_max));
  limit.rlim_cur = need;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0)
    throw std::runtime_error(std::string("serve: setrlimit(RLIMIT_NOFILE): ") + std::strerror(errno));
}

// glibc's thresholds, fixed for the serving process: blocks of 1 MiB or more (a body, its
// copies, a large JSON array) are mapped on their own and unmapped when freed, and a thread
// arena's free top is returned past 8 MiB. glibc's defaults rise with the largest block freed
// (to 32 MiB and 64 MiB), so one burst of 8 MiB bodies would leave each handler arena holding
// tens of MiB that malloc_trim does not return (it trims only the main arena's top).
constexpr int kMmapThresholdBytes = 1 << 20;
constexpr int kTrimThresholdBytes = 8 << 20;

}  // namespace

struct HttpServer::State {
  GenerationEngine& engine;
  ApiContext api;
  HttpOptions options;
  IntakeServer server;
  std::unique_ptr<httplib::ThreadPool> handlers;  // runs complete requests
  std::unique_ptr<HttpIntake> intake;              // reads them
  std::thread listener;
  std::mutex trim_mutex;
  std::mutex mutex;                                  // jobs
  std::map<uint64_t, std::pair<std::shared_ptr<Job>, size_t>> jobs;  // engine id -> (job, index)
  std::atomic<bool> draining{false};
  std::atomic<bool> engine_failed{false};
  std::atomic<int64_t> open_jobs{0};
  std::atomic<uint64_t> next_completion{1};
  ServeMetrics metrics;  // fed under `mutex`, so that it sees each request's events in order

  State(GenerationEngine& e, ApiContext a, HttpOptions o)
      : engine(e), api(std::move(a)), options(std::move(o)), metrics(e.options().max_kv_tokens) {}
  ~State() {
    server.stop();
    if (listener.joinable()) listener.join();
    if (intake) intake->stop();        // no new requests; the connections it holds close
    if (handlers) handlers->shutdown();  // the requests being answered finish
  }

  // Engine thread: a step's progress of one request.
  void report(const RequestProgress& p) {
    std::shared_ptr<Job> job;
    size_t index = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      metrics.progressed(p);
      const PrefixCacheStats& cached = engine.prefix_cache_stats();  // this (the engine's) thread owns it
      metrics.prefix_cache_totals(cached.queried_tokens, cached.hit_tokens);
      metrics.speculation_totals(engine.drafted_tokens(), engine.accepted_tokens());
      metrics.mixed_adapter_steps(engine.mixed_adapter_steps());
      if (const DecodeGraphs* graphs = engine.decode_graphs()) metrics.decode_bucket_steps(graphs->stats().steps);
      auto it = jobs.find(p.id);
      if (it == jobs.end()) return;
      job = it->second.first;
      index = it->second.second;
      if (p.finished != FinishReason::kNone) jobs.erase(it);
    }
    std::lock_guard<std::mutex> lock(job->mutex);
    RequestResult& r = job->results[index];
    for (const auto& t : p.prompt) {
      r.prompt_logprobs.push_back(t.logprob);
      r.prompt_top.push_back(t.top);
    }
    for (const auto& t : p.new_tokens) {
      r.tokens.push_back(t.token);
      r.logprobs.push_back(t.logprob);
      r.top.push_back(t.top);
    }
    if (p.finished != FinishReason::kNone) {
      r.finish_reason = reason_text(p.finished);
      if (p.finished == FinishReason::kError) r.error = p.error;
      --job->remaining;
    }
    ++job->version;
    job->changed.notify_all();
  }

  // Handler thread: queues every spec of a request (all or none).
  std::shared_ptr<Job> submit(const std::vector<RequestSpec>& specs) {
    if (draining) throw ApiError(503, "", "the server is shutting down");
    auto job = std::make_shared<Job>();
    job->results.resize(specs.size());
    job->remaining = specs.size();
    for (size_t i = 0; i < specs.size(); ++i) job->results[i].prompt = specs[i].prompt;
    std::lock_guard<std::mutex> lock(mutex);
    // After fail_all() no step will run: nothing may wait for one.
    if (engine_failed) throw ApiError(503, "", "the engine stopped (a rank failed)");
    try {
      for (size_t i = 0; i < specs.size(); ++i) {
        const uint64_t id = engine.submit(specs[i]);
        job->ids.push_back(id);
        jobs[id] = {job, i};
        metrics.submitted(id, specs[i]);
      }
    } catch (const std::invalid_argument& e) {
      for (uint64_t id : job->ids) {
        engine.cancel(id);
        jobs.erase(id);
        metrics.cancelled(id);
      }
      // The engine's messages start with the field: "max_tokens: ...".
      const std::string message = e.what();
      const size_t colon = message.find(": ");
      if (colon == std::string::npos) throw ApiError(400, "", message);
      throw ApiError(400, message.substr(0, colon), message.substr(colon + 2));
    }
    ++open_jobs;
    return job;
  }

  void release(const std::shared_ptr<Job>& job, bool cancel) {
    if (cancel) {
      std::lock_guard<std::mutex> lock(mutex);
      for (uint64_t id : job->ids) {
        if (!jobs.erase(id)) continue;
        engine.cancel(id);
        metrics.cancelled(id);
      }
    }
    --open_jobs;
  }

  struct Releaser {
    State* state;
    std::shared_ptr<Job> job;
    bool cancel = false;
    ~Releaser() { state->release(job, cancel); }
  };

  // Waits until every request of `job` finished; false when the engine failed.
  bool wait(const std::shared_ptr<Job>& job) {
    std::unique_lock<std::mutex> lock(job->mutex);
    job->changed.wait(lock, [&] { return job->remaining == 0 || job->failed; });
    return !job->failed;
  }

  void fail_all() {
    std::lock_guard<std::mutex> lock(mutex);
    engine_failed = true;
    for (auto& [id, entry] : jobs) {
      std::lock_guard<std::mutex> job_lock(entry.first->mutex);
      entry.first->failed = true;
      entry.first->changed.notify_all();
    }
  }

  json parse_body(const httplib::Request& req) { return parse_request_body(req.body); }

  template <typename Fn>
  void guarded(httplib::Response& res, Fn fn) {
    try {
      fn();
    } catch (const ApiError& e) {
      send_error(res, e.status(), e.what(), e.field());
    } catch (const std::exception& e) {
      send_error(res, 500, std::string("internal error: ") + e.what());
    }
  }

  // Waits for `job` and answers with make_response(), or 500 when the engine stopped or a
  // request failed. The job is released once the answer is set (also when formatting throws):
  // a draining server stops only after answering it.
  void answer_when_done(httplib::Response& res, const std::shared_ptr<Job>& job,
                        const std::function<json()>& make_response) {
    Releaser done{this, job};
    done.cancel = !wait(job);
    if (done.cancel) return send_error(res, 500, "the engine stopped (a rank failed)");
    if (const std::string error = failure(job->results); !error.empty()) return send_error(res, 500, error);
    send_json(res, 200, make_response());
  }

  void completions(const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      const json body = parse_body(req);
      auto job_spec = std::make_shared<CompletionJob>(parse_completion(body, api));
      auto job = submit(job_spec->specs);
      const std::string id = fmt::format("cmpl-{}", next_completion++);
      const int64_t created = now_seconds();
      if (!job_spec->stream) {
        return answer_when_done(res, job, [&] { return completion_response(*job_spec, job->results, api, id, created); });
      }
      // Each chunk: the text (echo + generated) that can be sent now and, when asked, the
      // log-probabilities of the tokens that text completes (all of them at the end), as
      // OpenAI's completions stream sends them.
      stream_job(res, job, job_spec->specs.size(), job_spec->include_usage, id, "text_completion", job_spec->model, created,
                 [this, job_spec](size_t i, const RequestResult& r, bool done, StreamedChoice& sent) -> json {
                   std::string text = job_spec->echo ? decode_ids(r.prompt) : "";
                   text += generated_text(job_spec->specs[i], r, *api.tokenizer);
                   const size_t ready = done ? text.size() : streamable_prefix(text, job_spec->specs[i].stop_strings);
                   if (ready <= sent.bytes && !done) return nullptr;
                   json logprobs;
                   if (job_spec->logprobs >= 0) {
                     const json all = completion_logprobs(*job_spec, i, r, api);
                     const size_t upto = done ? all.at("tokens").size() : logprob_entries_within(all, ready);
                     logprobs = logprob_entries(all, sent.logprobs, upto);
                     sent.logprobs = std::max(sent.logprobs, upto);
                   }
                   json choice = {{"text", text.substr(sent.bytes, ready > sent.bytes ? ready - sent.bytes : 0)},
                                  {"index", i}, {"logprobs", logprobs},
                                  {"finish_reason", done ? json(r.finish_reason) : json()}};
                   sent.bytes = std::max(sent.bytes, ready);
                   return choice;
                 });
    });
  }

  std::string decode_ids(const std::vector<int64_t>& ids) const {
    return api.tokenizer->decode(std::vector<int32_t>(ids.begin(), ids.end()));
  }

  // What a stream sent of one choice.
  struct StreamedChoice {
    size_t bytes = 0;      // of its text
    size_t logprobs = 0;   // log-probability entries
    bool started = false;  // a chunk of it was sent
    bool finished = false;
  };
  // Builds choice i's next chunk from its result so far (null: nothing new to send); `done`:
  // the request finished.
  using ChunkChoice = std::function<json(size_t, const RequestResult&, bool, StreamedChoice&)>;

  // Answers `job` as server-sent events: at each change, a chunk {id, object, created, model,
  // choices: [one choice]} per choice with something new, an error event in the place of a
  // choice whose request failed; at the end the usage chunk (when asked) and [DONE]. A client
  // that goes away cancels the job's requests.
  void stream_job(httplib::Response& res, const std::shared_ptr<Job>& job, size_t choices, bool include_usage,
                  const std::string& id, const std::string& object, const std::string& model, int64_t created,
                  ChunkChoice chunk_choice) {
    auto sent = std::make_shared<std::vector<StreamedChoice>>(choices);
    auto seen = std::make_shared<uint64_t>(0);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, id, object, model, created, include_usage, sent, seen, chunk_choice](size_t,
                                                                                          httplib::DataSink& sink) {
          std::unique_lock<std::mutex> lock(job->mutex);
          job->changed.wait_for(lock, std::chrono::milliseconds(200),
                                [&] { return job->version != *seen || job->failed; });
          *seen = job->version;
          if (job->failed) return false;
          auto envelope = [&](json choices_json) {
            return json{{"id", id}, {"object", object}, {"created", created}, {"model", model},
                        {"choices", std::move(choices_json)}};
          };
          std::string events;
          for (size_t i = 0; i < job->results.size(); ++i) {
            StreamedChoice& state = (*sent)[i];
            if (state.finished) continue;
            const RequestResult& r = job->results[i];
            if (!r.error.empty()) {  // this prompt failed: an error event in its place
              events += "data: " + dump_json(error_body(500, r.error)) + "\n\n";
              state.finished = true;
              continue;
            }
            const bool done = !r.finish_reason.empty();
            json choice = chunk_choice(i, r, done, state);
            if (choice.is_null()) continue;
            state.started = true;
            state.finished = done;
            events += "data: " + dump_json(envelope(json::array({std::move(choice)}))) + "\n\n";
          }
          const bool all_done = job->remaining == 0;
          if (all_done) {
            if (include_usage) {
              json chunk = envelope(json::array());
              chunk["usage"] = usage(job->results);
              events += "data: " + dump_json(chunk) + "\n\n";
            }
            events += "data: [DONE]\n\n";
          }
          lock.unlock();
          if (!events.empty() && !sink.write(events.data(), events.size())) return false;  // client gone
          if (all_done) sink.done();
          return true;
        },
        [this, job](bool success) { release(job, !success || job->remaining > 0); });
  }

  void chat(const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      auto chat_job = std::make_shared<ChatJob>(parse_chat(parse_body(req), api));
      auto job = submit({chat_job->spec});
      const std::string id = fmt::format("chatcmpl-{}", next_completion++);
      const int64_t created = now_seconds();
      if (!chat_job->stream) {
        return answer_when_done(res, job, [&] { return chat_response(*chat_job, job->results[0], api, id, created); });
      }
      // The first chunk names the role (its content empty until text is ready), then each
      // chunk's delta holds the text that can be sent now, the last one the finish reason.
      stream_job(res, job, 1, chat_job->include_usage, id, "chat.completion.chunk", chat_job->model, created,
                 [this, chat_job](size_t, const RequestResult& r, bool done, StreamedChoice& sent) -> json {
                   const std::string text = generated_text(chat_job->spec, r, *api.tokenizer);
                   const size_t ready = done ? text.size() : streamable_prefix(text, chat_job->spec.stop_strings);
                   if (ready <= sent.bytes && !done && sent.started) return nullptr;
                   json delta = json::object();
                   if (!sent.started) delta["role"] = "assistant";
                   if (ready > sent.bytes || !sent.started)
                     delta["content"] = text.substr(sent.bytes, ready > sent.bytes ? ready - sent.bytes : 0);
                   json logprobs;
                   if (chat_job->logprobs) {
                     const json all = chat_logprobs(*chat_job, r, api);
                     const size_t upto = done ? all.size() : chat_logprob_entries_within(all, ready);
                     json part = json::array();
                     for (size_t k = sent.logprobs; k < upto; ++k) part.push_back(all[k]);
                     logprobs = {{"content", std::move(part)}};
                     sent.logprobs = std::max(sent.logprobs, upto);
                   }
                   sent.bytes = std::max(sent.bytes, ready);
                   return {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", logprobs},
                           {"finish_reason", done ? json(r.finish_reason) : json()}};
                 });
    });
  }

  void nemo(const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      const NemoJob spec = parse_nemo(parse_body(req), api);
      auto job = submit(spec.specs);
      answer_when_done(res, job, [&] { return nemo_response(spec, job->results, api); });
    });
  }

  // Handler thread: one complete request from the intake; the connection goes back to the
  // intake for its next request, or is closed.
  void handle(ReadyRequest r) {
    AssembledStream stream(r.fd, std::move(r.request), limits::kWriteTimeoutS * 1000);
    const bool last = r.served + 1 >= limits::kKeepAliveMaxCount;
    bool connection_closed = false;
    bool ok = false;
    try {
      ok = server.serve(stream, last, connection_closed);
    } catch (...) {  // httplib reports errors by value; nothing may escape a pool thread
    }
    intake->answered();
    if (r.body_bytes >= kTrimAfterBytes) {
      std::lock_guard<std::mutex> lock(trim_mutex);
      malloc_trim(0);
    }
    if (ok && !last && !connection_closed) {
      intake->add(r.fd, std::move(r.leftover), r.served + 1);
    } else {
      intake->close_handled(r.fd);
    }
  }
};

HttpServer::HttpServer(GenerationEngine& engine, ApiContext api, HttpOptions options)
    : state_(std::make_unique<State>(engine, std::move(api), std::move(options))) {
  State& s = *state_;
  auto& svr = s.server;
  if (s.options.threads < 1) throw std::invalid_argument("serve: handler threads must be >= 1");
  mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
  mallopt(M_TRIM_THRESHOLD, kTrimThresholdBytes);
  s.handlers = std::make_unique<httplib::ThreadPool>(static_cast<size_t>(s.options.threads));
  IntakeOptions intake;
  intake.max_body_bytes = s.options.max_body_bytes;
  intake.max_head_bytes = limits::kMaxHeadBytes;
  intake.header_timeout_ms = s.options.header_timeout_s * 1000;
  intake.request_timeout_ms = limits::kRequestTimeoutS * 1000;
  intake.keep_alive_timeout_ms = limits::kKeepAliveTimeoutS * 1000;
  intake.linger_ms = limits::kLingerS * 1000;
  if (s.options.max_connections < 1) throw std::invalid_argument("--max-connections: expected >= 1");
  reserve_descriptors(s.options.max_connections);
  intake.max_connections = static_cast<size_t>(s.options.max_connections);
  intake.max_queued = limits::kMaxQueuedRequests;
  s.intake = std::make_unique<HttpIntake>(
      intake, [&s](ReadyRequest r) { s.handlers->enqueue([&s, r = std::move(r)]() mutable { s.handle(std::move(r)); }); },
      [](int status, const std::string& message, const std::string& field) {
        return dump_json(error_body(status, message, field));
      });
  svr.accepted = [&s](int fd) { s.intake->add(fd); };
  svr.new_task_queue = [] { return new InlineQueue; };
  svr.set_payload_max_length(s.options.max_body_bytes);
  svr.set_keep_alive_max_count(limits::kKeepAliveMaxCount);
  svr.set_keep_alive_timeout(limits::kKeepAliveTimeoutS);
  const std::string key = s.options.api_key;
  svr.set_pre_routing_handler([key](const httplib::Request& req, httplib::Response& res) {
    if (key.empty() || same_key(req.get_header_value("Authorization"), "Bearer " + key))
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, 401, "a valid API key is required: Authorization: Bearer <key>", "Authorization");
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) send_error(res, 413, "the request body is larger than the server accepts", "body");
    else if (res.status == 404) send_error(res, 404, "no such route; try POST /v1/completions, POST /v1/chat/completions or PUT /generate");
    else send_error(res, res.status, "the request was refused");
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    send_error(res, 500, "internal error");
  });
  svr.Post("/v1/completions", [&s](const httplib::Request& req, httplib::Response& res) { s.completions(req, res); });
  svr.Post("/v1/chat/completions", [&s](const httplib::Request& req, httplib::Response& res) { s.chat(req, res); });
  svr.Put("/generate", [&s](const httplib::Request& req, httplib::Response& res) { s.nemo(req, res); });
  svr.Get("/v1/models", [&s](const httplib::Request&, httplib::Response& res) {
    // The base, then each LoRA adapter with the base as its parent (as vLLM lists them).
    json data = json::array({{{"id", s.api.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "loom"},
                              {"root", s.api.model_name}, {"parent", nullptr}, {"max_model_len", s.api.context}}});
    for (const auto& adapter : s.api.adapters)
      data.push_back({{"id", adapter}, {"object", "model"}, {"created", 0}, {"owned_by", "loom"}, {"root", adapter},
                      {"parent", s.api.model_name}, {"max_model_len", s.api.context}});
    send_json(res, 200, {{"object", "list"}, {"data", std::move(data)}});
  });
  svr.Get("/metrics", [&s](const httplib::Request&, httplib::Response& res) {
    res.status = 200;
    res.set_content(s.metrics.exposition(s.intake->open_connections()), "text/plain; version=0.0.4; charset=utf-8");
  });
  svr.Get("/health", [&s](const httplib::Request&, httplib::Response& res) {
    if (s.engine_failed) return send_json(res, 503, {{"status", "failed"}});
    send_json(res, s.draining ? 503 : 200, {{"status", s.draining ? "draining" : "ok"}});
  });
  port_ = s.options.port == 0 ? svr.bind_to_any_port(s.options.host) : s.options.port;
  if (port_ < 0 || (s.options.port != 0 && !svr.bind_to_port(s.options.host, s.options.port)))
    throw std::runtime_error(fmt::format("cannot listen on {}:{} (in use, or not an address of this machine)",
                                         s.options.host, s.options.port));
  svr.widen_backlog(static_cast<int>(std::min<int64_t>(s.options.max_connections, INT32_MAX)));
  s.listener = std::thread([&svr] { svr.listen_after_bind(); });
}

HttpServer::~HttpServer() = default;

void HttpServer::run(const std::atomic<bool>& stop) {
  State& s = *state_;
  auto report = [&s](const RequestProgress& p) { s.report(p); };
  try {
    while (true) {
      if (stop) s.draining = true;
      const bool finish = s.draining && !s.engine.busy() && s.open_jobs == 0;
      if (!s.engine.step(finish, report)) break;
      if (!s.engine.busy()) s.engine.wait_for_work(kIdleStepMs);
    }
  } catch (...) {
    s.fail_all();
    s.server.stop();
    throw;
  }
  s.server.stop();
}

void follow(GenerationEngine& engine) {
  while (engine.step(false)) {
  }
}

}  // namespace loom::serve
