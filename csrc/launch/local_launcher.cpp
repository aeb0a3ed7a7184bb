#include "launch/local_launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <set>
#include <stdexcept>

#include "launch/failure_report.h"
#include "launch/file_util.h"

namespace loom::launch {
namespace {

using Clock = std::chrono::steady_clock;

// Self-pipe: signal handlers only write the signal number; the poll loop forwards it.
int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  unsigned char s = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &s, 1);
}

struct Stream {
  int fd = -1;
  bool is_err = false;
  std::string partial;
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  Stream out, err;
  bool exited = false;
  RankExit exit;
  std::deque<std::string> last_err_lines;
  std::optional<double> stop_s;  // when the launcher first signalled it (seconds since launch)
  std::set<int> signals_sent;
  double exit_system_s = 0;      // when it was reaped, on the clock ranks record errors with
};

using SystemClock = std::chrono::system_clock;

double seconds_between(SystemClock::time_point from, SystemClock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

void emit_line(Child& c, Stream& s, const std::string& line, const LaunchOptions& opt) {
  if (s.is_err) {
    c.last_err_lines.push_back(line);
    if (c.last_err_lines.size() > 20) c.last_err_lines.pop_front();
  }
  if (opt.capture_output) c.exit.output += line + "\n";
  if (opt.echo_output) {
    std::string text = opt.prefix_output ? "[rank " + std::to_string(c.rank) + "] " + line + "\n"
                                         : line + "\n";
    FILE* dst = s.is_err ? stderr : stdout;
    std::fwrite(text.data(), 1, text.size(), dst);
    std::fflush(dst);
  }
}

// Reads what is available; returns false at end of stream.
bool drain(Child& c, Stream& s, const LaunchOptions& opt) {
  char buf[8192];
  ssize_t n = read(s.fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (!s.partial.empty()) emit_line(c, s, s.partial, opt);
    s.partial.clear();
    close(s.fd);
    s.fd = -1;
    return false;
  }
  s.partial.append(buf, static_cast<size_t>(n));
  size_t start = 0, nl;
  while ((nl = s.partial.find('\n', start)) != std::string::npos) {
    emit_line(c, s, s.partial.substr(start, nl - start), opt);
    start = nl + 1;
  }
  s.partial.erase(0, start);
  return true;
}

void signal_all(std::vector<Child>& children, int sig, SystemClock::time_point start) {
  for (auto& c : children) {
    if (c.exited || c.pid <= 0) continue;
    kill(-c.pid, sig);  // the rank's whole process group
    if (!c.stop_s) c.stop_s = seconds_between(start, SystemClock::now());
    c.signals_sent.insert(sig);
  }
}

pid_t spawn(const LaunchOptions& opt, int rank, int port, int out_fd, int err_fd,
            const std::string& error_dir) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  auto setenv_kv = [&](const std::string& k, const std::string& v) {
    for (auto& s : env_strings) {
      if (s.compare(0, k.size() + 1, k + "=") == 0) {
        s = k + "=" + v;
        return;
      }
    }
    env_strings.push_back(k + "=" + v);
  };
  setenv_kv("RANK", std::to_string(rank));
  setenv_kv("WORLD_SIZE", std::to_string(opt.nproc));
  setenv_kv("LOCAL_RANK", std::to_string(rank));
  setenv_kv("LOCAL_WORLD_SIZE", std::to_string(opt.nproc));
  setenv_kv("MASTER_ADDR", opt.master_addr);
  setenv_kv("MASTER_PORT", std::to_string(port));
  setenv_kv("LOOM_LOCAL_LAUNCHER", "1");
  if (!error_dir.empty()) setenv_kv("LOOM_ERROR_FILE", error_dir + "/rank_" + std::to_string(rank) + ".err");
  for (const auto& [k, v] : opt.extra_env) setenv_kv(k, v);

  std::vector<char*> argv, envp;
  for (const auto& a : opt.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);       // never outlive the launcher
    if (getppid() != parent) _exit(127);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGUSR1, SIG_DFL);
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    execve(argv[0], argv.data(), envp.data());
    std::fprintf(stderr, "cannot execute %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);
  return pid;
}

}  // namespace

int LaunchResult::exit_code() const {
  if (first_failed_rank < 0) return 0;
  for (const auto& r : ranks) {
    if (r.rank != first_failed_rank) continue;
    if (!r.signaled) return r.exit_code != 0 ? r.exit_code : 1;
  }
  // The first failing rank was killed by a signal: report the status of a rank that exited by
  // itself, if any did (its peers' errors say what the run lost), else a runtime failure.
  for (const auto& r : ranks) {
    if (r.exit_code != 0 && !r.signaled) return r.exit_code;
  }
  return 1;
}

std::string LaunchResult::summary() const {
  if (first_failed_rank < 0) return "all " + std::to_string(ranks.size()) + " ranks succeeded";
  std::string s = failure_report;
  if (timed_out) s += "\n(the launch timeout stopped the run)";
  return s;
}

void record_rank_error(const std::string& message, bool consequence) {
  const char* path = std::getenv("LOOM_ERROR_FILE");
  if (!path || !*path) return;
  // The first error a rank records is the one that counts: handlers further up (and the
  // command's own catch, after the stack has unwound) must not move it later.
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return;
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string text =
      std::to_string(ns) + (consequence ? " consequence" : "") + "\n" + message + "\n";
  [[maybe_unused]] ssize_t n = ::write(fd, text.data(), text.size());
  ::close(fd);
}

namespace {

struct RecordedError {
  long long ns = 0;
  bool consequence = false;
  std::string message;
};

std::optional<RecordedError> read_recorded_error(const std::string& path) {
  std::ifstream in(path);
  RecordedError e;
  std::string first;
  if (!std::getline(in, first)) return std::nullopt;
  try {
    e.ns = std::stoll(first);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  e.consequence = first.find("consequence") != std::string::npos;
  std::string line;
  while (std::getline(in, line)) e.message += (e.message.empty() ? "" : "\n") + line;
  return e;
}

}  // namespace

int find_free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket() failed while looking for a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    throw std::runtime_error("cannot bind a loopback port");
  }
  int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

std::string self_executable() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  return std::string(buf, static_cast<size_t>(n));
}

namespace {

// SIGINT, SIGTERM and SIGUSR1 (Slurm's warning before the time limit, `--signal=USR1@T`) go to
// the self-pipe while the ranks run, to be forwarded to them: by default SIGUSR1 would end the
// launcher and so every rank (PR_SET_PDEATHSIG) without a save. restore() puts the previous
// handlers back and closes the pipe.
struct SignalForwarding {
  struct sigaction old_int {}, old_term {}, old_usr1 {};

  void install() {
    if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw std::runtime_error("pipe2 failed for the signal pipe");
    }
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGUSR1, &sa, &old_usr1);
  }
  void restore() {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    sigaction(SIGUSR1, &old_usr1, nullptr);
    close(g_signal_pipe[0]);
    close(g_signal_pipe[1]);
  }
};

// Starts rank r with its stdout and stderr on pipes that `c` reads. Throws std::runtime_error
// naming the rank (no descriptor left open).
void start_rank(Child& c, int r, const LaunchOptions& opt, int port, const std::string& error_dir) {
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  try {
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
    }
    c.rank = r;
    c.exit.rank = r;
    c.pid = spawn(opt, r, port, out[1], err[1], error_dir);
  } catch (const std::exception& e) {
    for (int fd : {out[0], out[1], err[0], err[1]})
      if (fd >= 0) close(fd);
    throw std::runtime_error("cannot start rank " + std::to_string(r) + " of " + std::to_string(opt.nproc) +
                             ": " + e.what());
  }
  close(out[1]);
  close(err[1]);
  c.out = {out[0], false, {}};
  c.err = {err[0], true, {}};
}

// Starts every rank; when one cannot start, kills and reaps those started, closes their pipes,
// removes `error_dir` and rethrows.
void start_ranks(std::vector<Child>& children, const LaunchOptions& opt, int port, const std::string& error_dir,
                 SystemClock::time_point system_start) {
  try {
    for (int r = 0; r < opt.nproc; ++r) start_rank(children[static_cast<size_t>(r)], r, opt, port, error_dir);
  } catch (...) {
    signal_all(children, SIGKILL, system_start);
    for (auto& c : children) {
      if (c.pid > 0) waitpid(c.pid, nullptr, 0);
      for (int fd : {c.out.fd, c.err.fd})
        if (fd >= 0) close(fd);
    }
    if (!error_dir.empty()) remove_tree(error_dir);
    throw;
  }
}

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// The supervision loop's state while ranks run.
struct Supervision {
  Clock::time_point start;
  SystemClock::time_point system_start;
  int interrupts = 0;  // SIGINTs received: the second one stops the ranks at once
  Clock::time_point kill_deadline = Clock::time_point::max();
  int alive = 0;
  bool stopping_after_failure = false;
};

// Forwards the signals the launcher received to every rank and sets when to kill what lingers.
void forward_signals(std::vector<Child>& children, const LaunchOptions& opt, Supervision& run) {
  unsigned char sig;
  while (read(g_signal_pipe[0], &sig, 1) == 1) {
    signal_all(children, sig, run.system_start);  // forward SIGINT/SIGTERM/SIGUSR1
    // A second Ctrl-C means "now": the ranks exit at once on theirs; kill what lingers.
    const double grace = (sig == SIGINT && ++run.interrupts >= 2) ? std::min(opt.grace_s, 2.0) : opt.grace_s;
    run.kill_deadline = std::min(run.kill_deadline, Clock::now() + seconds(grace));
  }
}

// Waits up to 50 ms for a signal or rank output, then handles what arrived.
void poll_signals_and_output(std::vector<Child>& children, const LaunchOptions& opt, Supervision& run) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Child*, Stream*>> owners;
  fds.push_back({g_signal_pipe[0], POLLIN, 0});
  owners.push_back({nullptr, nullptr});
  for (auto& c : children) {
    for (Stream* s : {&c.out, &c.err}) {
      if (s->fd >= 0) {
        fds.push_back({s->fd, POLLIN, 0});
        owners.push_back({&c, s});
      }
    }
  }
  poll(fds.data(), fds.size(), 50);
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    if (i == 0) forward_signals(children, opt, run);
    else drain(*owners[i].first, *owners[i].second, opt);
  }
}

// Reaps exited ranks (their pipes may still hold output: drained here); the first failure
// stops the others when opt.stop_all_on_failure.
void reap_exited(std::vector<Child>& children, const LaunchOptions& opt, Supervision& run) {
  for (auto& c : children) {
    if (c.exited) continue;
    int status = 0;
    struct rusage usage {};
    pid_t got = wait4(c.pid, &status, WNOHANG, &usage);
    if (got != c.pid) continue;
    c.exit.max_rss_mib = double(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
    while (c.out.fd >= 0 && drain(c, c.out, opt)) {
    }
    while (c.err.fd >= 0 && drain(c, c.err, opt)) {
    }
    c.exited = true;
    c.exit.seconds = std::chrono::duration<double>(Clock::now() - run.start).count();
    c.exit_system_s = seconds_between(run.system_start, SystemClock::now());
    --run.alive;
    if (WIFEXITED(status)) {
      c.exit.exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      c.exit.exit_code = 128 + WTERMSIG(status);
      c.exit.signaled = true;
    }
    if (c.exit.exit_code != 0 && !run.stopping_after_failure) {
      run.stopping_after_failure = true;
      if (opt.stop_all_on_failure) {
        signal_all(children, SIGTERM, run.system_start);
        run.kill_deadline = std::min(run.kill_deadline, Clock::now() + seconds(opt.grace_s));
      }
    }
  }
}

// The launch timeout stops the ranks (SIGTERM); past the kill deadline they get SIGKILL.
void enforce_deadlines(std::vector<Child>& children, const LaunchOptions& opt, Supervision& run,
                       LaunchResult& result) {
  const auto now = Clock::now();
  if (opt.timeout_s > 0 && !result.timed_out && now - run.start > std::chrono::duration<double>(opt.timeout_s)) {
    result.timed_out = true;
    signal_all(children, SIGTERM, run.system_start);
    run.kill_deadline = now + seconds(opt.grace_s);
  }
  if (now > run.kill_deadline) signal_all(children, SIGKILL, run.system_start);
}

// What each rank said and when, for naming the failure that caused the others: its recorded
// error (removed with `error_dir`), else its last stderr lines.
std::vector<RankOutcome> collect_outcomes(const std::vector<Child>& children, const std::string& error_dir,
                                          SystemClock::time_point system_start) {
  std::vector<RankOutcome> outcomes;
  for (const auto& c : children) {
    RankOutcome o;
    o.rank = c.rank;
    o.exit_code = c.exit.exit_code;
    o.signal = c.exit.signaled ? c.exit.exit_code - 128 : 0;
    o.signal_sent_by_launcher = o.signal != 0 && c.signals_sent.count(o.signal) > 0;
    o.exit_s = c.exit_system_s;
    o.stop_s = c.stop_s;
    const std::string file = error_dir.empty() ? "" : error_dir + "/rank_" + std::to_string(c.rank) + ".err";
    if (const auto recorded = file.empty() ? std::nullopt : read_recorded_error(file)) {
      o.error_s = double(recorded->ns) / 1e9 - std::chrono::duration<double>(system_start.time_since_epoch()).count();
      o.error = recorded->message;
      o.error_is_consequence = recorded->consequence;
    } else {
      for (const auto& l : c.last_err_lines) o.error += (o.error.empty() ? "" : "\n") + l;
    }
    if (!file.empty()) unlink(file.c_str());
    outcomes.push_back(std::move(o));
  }
  if (!error_dir.empty()) rmdir(error_dir.c_str());
  return outcomes;
}

}  // namespace

LaunchResult launch_local(const LaunchOptions& opt) {
  if (opt.nproc < 1) throw std::invalid_argument("number of local ranks must be >= 1, got " +
                                                 std::to_string(opt.nproc));
  if (opt.argv.empty()) throw std::invalid_argument("launch_local: empty argv");
  const int port = opt.master_port > 0 ? opt.master_port : find_free_port();
  SignalForwarding signals;
  signals.install();

  char dir_template[] = "/tmp/loom-launch-XXXXXX";
  const std::string error_dir = mkdtemp(dir_template) ? dir_template : "";
  Supervision run;
  run.system_start = SystemClock::now();
  std::vector<Child> children(static_cast<size_t>(opt.nproc));
  try {
    start_ranks(children, opt, port, error_dir, run.system_start);
  } catch (...) {
    signals.restore();
    throw;
  }

  LaunchResult result;
  run.start = Clock::now();
  run.alive = opt.nproc;
  while (run.alive > 0) {
    poll_signals_and_output(children, opt, run);
    reap_exited(children, opt, run);
    enforce_deadlines(children, opt, run, result);
  }
  signals.restore();
  result.interrupts = run.interrupts;
  const std::vector<RankOutcome> outcomes = collect_outcomes(children, error_dir, run.system_start);
  for (auto& c : children) result.ranks.push_back(std::move(c.exit));
  const int primary = primary_failure(outcomes);
  if (primary >= 0) {
    result.first_failed_rank = outcomes[static_cast<size_t>(primary)].rank;
    result.first_error = outcomes[static_cast<size_t>(primary)].error;
    result.failure_report = describe_failures(outcomes, primary);
  }
  return result;
}

}  // namespace loom::launch
