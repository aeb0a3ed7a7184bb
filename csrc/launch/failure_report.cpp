#include "launch/failure_report.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <tuple>

namespace loom::launch {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string first_line(const std::string& text) {
  const size_t start = text.find_first_not_of('\n');
  if (start == std::string::npos) return "";
  return text.substr(start, text.find('\n', start) - start);
}

// A failure the rank had by itself; one the launcher caused by stopping it; or in between.
enum Kind { kOwn = 0, kPeerLoss = 1, kStopped = 2 };

bool failed(const RankOutcome& o) { return o.exit_code != 0; }

// A rank that recorded an error before the launcher signalled it failed by itself, even if
// the launcher's signal then ended it.
bool recorded_before_stop(const RankOutcome& o) { return o.error_s && (!o.stop_s || *o.error_s <= *o.stop_s); }

Kind kind_of(const RankOutcome& o) {
  if (o.signal != 0) {
    if (!o.signal_sent_by_launcher) return kOwn;  // SIGKILL from outside, SIGSEGV, SIGABRT ...
    if (!recorded_before_stop(o)) return kStopped;
  } else if (o.stop_s && !recorded_before_stop(o)) {
    return kStopped;  // it exited (with an error) after the launcher asked it to stop
  }
  if (o.error_is_consequence || is_peer_loss(o.error)) return kPeerLoss;
  return kOwn;
}

double time_of(const RankOutcome& o) { return o.error_s ? std::min(*o.error_s, o.exit_s) : o.exit_s; }

std::string how(const RankOutcome& o) {
  // It recorded its error and was still exiting when the launcher stopped the rest: the signal
  // is the launcher's, not what went wrong.
  if (o.signal != 0 && o.signal_sent_by_launcher && recorded_before_stop(o))
    return "stopped by the launcher's " + signal_name(o.signal) + " after its error";
  if (o.signal != 0) return "killed by signal " + std::to_string(o.signal) + ", " + signal_name(o.signal);
  return "exit " + std::to_string(o.exit_code);
}

}  // namespace

std::string signal_name(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
}

bool is_peer_loss(const std::string& message) {
  const std::string text = lower(message);
  for (const char* pattern : {"connection closed by peer", "connection reset by peer", "connection reset",
                              "broken pipe", "timed out", "timeout", "connection refused",
                              "rendezvous", "another rank"}) {
    if (text.find(pattern) != std::string::npos) return true;
  }
  return false;
}

int primary_failure(const std::vector<RankOutcome>& outcomes) {
  int best = -1;
  std::tuple<int, double, int> best_key;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const RankOutcome& o = outcomes[i];
    if (!failed(o)) continue;
    const auto key = std::make_tuple(int(kind_of(o)), time_of(o), o.rank);
    if (best < 0 || key < best_key) {
      best = static_cast<int>(i);
      best_key = key;
    }
  }
  return best;
}

std::string describe_failures(const std::vector<RankOutcome>& outcomes, int primary) {
  if (primary < 0) return "";
  const RankOutcome& p = outcomes[static_cast<size_t>(primary)];
  std::string text = "rank " + std::to_string(p.rank) + " failed first (" + how(p) + ")";
  text += p.error.empty() ? ", with no error message" : ":\n" + p.error;
  std::string then, stopped;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const RankOutcome& o = outcomes[i];
    if (static_cast<int>(i) == primary || !failed(o)) continue;
    if (kind_of(o) == kStopped) {
      stopped += (stopped.empty() ? "" : ", ") + std::to_string(o.rank);
      continue;
    }
    then += (then.empty() ? "" : "; ") + ("rank " + std::to_string(o.rank) + " (" + how(o) + ")");
    const std::string line = first_line(o.error);
    if (!line.empty()) then += ": " + line;
  }
  if (!then.empty()) text += "\nthen, as a consequence: " + then;
  if (!stopped.empty()) text += "\nstopped by the launcher: rank" + std::string(stopped.find(',') != std::string::npos ? "s " : " ") + stopped;
  return text;
}

}  // namespace loom::launch
