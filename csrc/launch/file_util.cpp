#include "launch/file_util.h"

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace loom::launch {
namespace {
std::string g_failed;  // nftw's callback has no user pointer

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (::remove(path) != 0 && errno != ENOENT) {
    g_failed = std::string(path) + ": " + std::strerror(errno);
    return 1;
  }
  return 0;
}
}  // namespace

void remove_tree(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return;  // nothing there
  g_failed.clear();
  // Depth first (FTW_DEPTH) so directories are empty when removed; do not follow links.
  if (nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    throw std::runtime_error("cannot remove " + (g_failed.empty() ? path : g_failed));
  }
}

std::vector<std::string> list_directory(const std::string& path) {
  DIR* dir = opendir(path.c_str());
  if (!dir) throw std::runtime_error("cannot read directory " + path + ": " + std::strerror(errno));
  std::vector<std::string> names;
  while (dirent* e = readdir(dir)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace loom::launch
