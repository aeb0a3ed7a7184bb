// File-system helpers that do not go through std::filesystem's directory iteration.
// Why: the pip torch wheel's libtorch.so exports its own copies of std::filesystem symbols
// (built with a newer libstdc++); in a binary linked against it, calls such as
// std::filesystem::remove_all bind to those copies and crash (null call inside). POSIX
// nftw/opendir have no such clash. Simple queries (exists, rename, create_directories) are
// unaffected and may stay on std::filesystem.
#pragma once
#include <string>
#include <vector>

namespace loom::launch {

/// Removes `path` and everything below it; a missing path is not an error. Throws
/// std::runtime_error naming the entry that could not be removed.
void remove_tree(const std::string& path);

/// Names (not paths) of the entries of directory `path`, sorted, without "." and "..".
/// Throws std::runtime_error naming the directory when it cannot be read.
std::vector<std::string> list_directory(const std::string& path);

}  // namespace loom::launch
