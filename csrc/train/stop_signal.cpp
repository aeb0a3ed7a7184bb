#include "train/stop_signal.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <csignal>

namespace loom::train {
namespace {

std::atomic<int> g_stop_signal{0};
std::atomic<int> g_interrupts{0};

extern "C" void loom_on_stop_signal(int sig) {
  if (sig == SIGINT && g_interrupts.fetch_add(1) >= 1) {
    // A second Ctrl-C: the user does not want to wait for the save. Die of SIGINT, as an
    // interrupted program does (async-signal-safe: sigaction and raise only).
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGINT, &dfl, nullptr);
    raise(SIGINT);
    return;
  }
  g_stop_signal = sig;
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = loom_on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

StopReason agreed_stop_reason(runtime::ProcessGroups& groups, StopReason local) {
  if (g_stop_signal.load() != 0) local = std::max(local, StopReason::kRequested);
  // host: a value of this process, reduced on the host group.
  at::Tensor reason = at::full({1}, static_cast<int64_t>(local), at::TensorOptions().dtype(at::kLong));
  groups.host_world().all_reduce(reason, runtime::ReduceOp::kMax);
  return static_cast<StopReason>(reason.item<int64_t>());
}

}  // namespace loom::train
