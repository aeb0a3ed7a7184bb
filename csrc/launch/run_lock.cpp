#include "launch/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>

namespace loom::launch {
namespace {

std::string read_all(int fd) {
  std::string text;
  char buf[512];
  ::lseek(fd, 0, SEEK_SET);
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 && text.size() < 4096) text.append(buf, static_cast<size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::string holder_text(const std::string& command) {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
  return "pid " + std::to_string(::getpid()) + " on " + host + " since " + when + ": " + command + "\n";
}

}  // namespace

RunDirectoryLock::RunDirectoryLock(const std::string& run_dir, const std::string& command)
    : path_(run_dir + "/train.lock") {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("cannot create the run directory lock " + path_ + ": " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = read_all(fd_);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK) {
      throw RunLockError("run directory " + run_dir + " is in use by another run (" +
                         (holder.empty() ? std::string("holder unknown") : holder) +
                         "): wait for it to finish, stop it, or give this run another exp_manager.explicit_log_dir");
    }
    throw std::runtime_error("cannot lock " + path_ + ": " + std::strerror(err));
  }
  // Ours now. Text left in the file means its last holder ended without unlocking.
  stale_holder_ = read_all(fd_);
  const std::string text = holder_text(command);
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    // The lock holds without the description; only messages lose the holder's name.
  }
}

RunDirectoryLock::~RunDirectoryLock() {
  if (fd_ < 0) return;
  // Emptied on a clean release, so that a later holder can tell a crash from a normal end.
  [[maybe_unused]] int rc = ::ftruncate(fd_, 0);
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

}  // namespace loom::launch
