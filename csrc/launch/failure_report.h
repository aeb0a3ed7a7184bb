// Which rank's failure caused the others (docs/design/hardening.md, "Named failures"): when one
// rank dies, its peers fail too ("Connection closed by peer", a collective timeout) and the
// launcher stops the rest; the report names the rank whose failure came first and was not a
// consequence, with its signal or exit status and its last error line, before the others.
// No torch.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace loom::launch {

/// How one rank ended, as the launcher saw it.
struct RankOutcome {
  int rank = -1;
  int exit_code = 0;                 ///< exit status, or 128 + signal
  int signal = 0;                    ///< the signal that killed it (0: it exited)
  bool signal_sent_by_launcher = false;  ///< that signal (or an earlier stop) came from the launcher
  double exit_s = 0;                 ///< when it was reaped, seconds since launch
  std::optional<double> error_s;     ///< when it recorded its error (record_rank_error)
  std::string error;                 ///< the recorded error, else its last stderr lines
  bool error_is_consequence = false; ///< the rank said it stopped because another rank failed
  std::optional<double> stop_s;      ///< when the launcher first signalled it, if it did
};

/// Whether an error message reports a lost or silent peer: what survivors of a dead rank say
/// (Gloo/NCCL "Connection closed by peer", "Connection reset", "Broken pipe", a timed-out
/// collective or rendezvous).
bool is_peer_loss(const std::string& message);

/// The index in `outcomes` of the failure that came first and was not a consequence of
/// another (a rank killed by a signal the launcher did not send, or a rank that recorded its
/// own error), ranked by: failures of their own before peer-loss errors before ranks the
/// launcher stopped; then by time. -1 when no rank failed.
int primary_failure(const std::vector<RankOutcome>& outcomes);

/// "rank 1 failed first (killed by signal 9, SIGKILL): <error>" followed, when others
/// failed too, by "then: rank 0 (exit 1): <first line>; ..." and the ranks the launcher stopped.
std::string describe_failures(const std::vector<RankOutcome>& outcomes, int primary);

/// "SIGKILL", "SIGSEGV", ... or "signal N".
std::string signal_name(int signal);

}  // namespace loom::launch
