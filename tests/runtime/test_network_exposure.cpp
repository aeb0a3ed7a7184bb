// A run whose ranks meet on loopback listens on loopback only: the rendezvous store (no
// authentication) and Gloo's pairs must not be reachable from another host
// (docs/design/hardening.md, "Network exposure").
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>

#include "harness/multiprocess.h"
#include "launch/env_rendezvous.h"
#include "runtime/process_groups.h"

using namespace loom;

namespace {

/// Socket inodes of this process's open files.
std::set<std::string> own_socket_inodes() {
  std::set<std::string> inodes;
  DIR* dir = opendir("/proc/self/fd");
  while (dirent* e = dir ? readdir(dir) : nullptr) {
    char target[256] = {};
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
    const std::string t(target, n > 0 ? static_cast<size_t>(n) : 0);
    if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
  }
  if (dir) closedir(dir);
  return inodes;
}

/// "address:port" (hex, as /proc/net/tcp writes them) of every listening socket of ours.
std::vector<std::string> own_listening_addresses(const char* table) {
  const auto mine = own_socket_inodes();
  std::ifstream in(table);
  std::string line;
  std::getline(in, line);  // header
  std::vector<std::string> out;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    f >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
    if (state == "0A" && mine.count(inode)) out.push_back(local);  // 0A: LISTEN
  }
  return out;
}

bool is_loopback_hex(const std::string& local) {
  const std::string address = local.substr(0, local.find(':'));
  if (address.size() == 8) return address.substr(6, 2) == "7F";  // 127.x.x.x, little-endian
  return address == "00000000000000000000000001000000";         // ::1
}

}  // namespace

LOOM_WORKER("listens_on_loopback_only") {
  at::set_num_threads(1);
  runtime::ProcessGroupOptions opt;
  opt.timeout = std::chrono::milliseconds(30000);
  auto groups = runtime::ProcessGroups::create(launch::rendezvous_from_env(), opt);
  groups->world().barrier();
  std::vector<std::string> listening = own_listening_addresses("/proc/self/net/tcp");
  for (const auto& a : own_listening_addresses("/proc/self/net/tcp6")) listening.push_back(a);
  if (groups->rank() == 0) LOOM_WCHECK(!listening.empty(), "(rank 0 hosts the store: it must listen somewhere)");
  for (const auto& address : listening) LOOM_WCHECK(is_loopback_hex(address), "(listening on " + address + ")");
  groups->world().barrier();
  groups->shutdown();
}

TEST_CASE("the store and Gloo of a loopback run listen on loopback only", "[runtime][multiprocess][security]") {
  auto r = test::run_ranks("listens_on_loopback_only", 2);
  CHECK(r.exit_code() == 0);
}
