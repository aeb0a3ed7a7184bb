// The fuzz engine for machines without clang's libFuzzer: a seeded mutation loop over the seed
// files (bit flips, byte edits, insertions of YAML and JSON syntax, deletions, duplications,
// splices of two seeds) calling the same LLVMFuzzerTestOneInput for a bounded time. Coverage is
// not guided, so it finds less than libFuzzer; the seed makes a failing run repeatable.
//   loom_fuzz --seconds N [--seed S] DIR...     (inputs from every file under the DIRs)
// A crash, sanitizer report or abort leaves the input in ./crash-mutation-<seed>.
#include <sanitizer/common_interface_defs.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv);
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::string g_current;
char g_crash_path[256] = "crash-mutation";

// Called by the sanitizer runtime (and on abort) while the process dies: keeps the input.
void save_current_input() {
  FILE* f = std::fopen(g_crash_path, "wb");
  if (!f) return;
  std::fwrite(g_current.data(), 1, g_current.size(), f);
  std::fclose(f);
  std::fprintf(stderr, "loom_fuzz: the failing input is in %s\n", g_crash_path);
}

const char* const kTokens[] = {"${", "}", "${run.name}", "${multiply:", ",", "&a ", "*a", "---\n", ":\n", "- ",
                               "[", "]", "{", "\"", "'", "\n  ", "\0", "null", "1e308", "-1",
                               "9223372036854775807", "99999999999999999999", "iteration", "files", "bytes",
                               "fnv1a64", "supersede", "mp_rank_00/model_optim_rng.pt", "\x93NUMPY"};

std::string mutate(std::string s, const std::vector<std::string>& seeds, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 8);
  for (int e = 0; e < edits; ++e) {
    const size_t n = s.size();
    const size_t at = n ? rng() % (n + 1) : 0;
    switch (rng() % 7) {
      case 0: if (n) s[rng() % n] ^= static_cast<char>(1u << (rng() % 8)); break;
      case 1: if (n) s[rng() % n] = static_cast<char>(rng()); break;
      case 2: {
        const char* t = kTokens[rng() % (sizeof kTokens / sizeof *kTokens)];
        s.insert(at, t, std::max<size_t>(1, std::strlen(t)));
        break;
      }
      case 3: if (n) s.erase(at, rng() % 16); break;
      case 4: if (n && at < n) s.insert(at, s.substr(at, 1 + rng() % 64)); break;
      case 5: {
        const std::string& other = seeds[rng() % seeds.size()];
        if (!other.empty()) s.insert(at, other.substr(rng() % other.size(), 1 + rng() % 256));
        break;
      }
      case 6: {
        std::string digits = std::to_string(static_cast<int64_t>(rng()) >> (rng() % 64));
        s.insert(at, digits);
        break;
      }
    }
  }
  return s.size() > (1u << 20) ? s.substr(0, 1u << 20) : s;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 10;
  uint64_t seed = 1;
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) seconds = std::atof(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else dirs.push_back(a);
  }
  LLVMFuzzerInitialize(&argc, &argv);
  std::vector<std::string> seeds;
  for (const auto& d : dirs) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(d)) {
      if (!entry.is_regular_file()) continue;
      std::ifstream in(entry.path(), std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      seeds.push_back(text.str());
    }
  }
  if (seeds.empty()) seeds.push_back("");
  std::snprintf(g_crash_path, sizeof g_crash_path, "crash-mutation-%llu", static_cast<unsigned long long>(seed));
  __sanitizer_set_death_callback(save_current_input);
  std::mt19937_64 rng(seed);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t runs = 0;
  for (const auto& s : seeds) {  // every seed as it is, first
    g_current = s;
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    ++runs;
  }
  while (std::chrono::steady_clock::now() < end) {
    g_current = mutate(seeds[rng() % seeds.size()], seeds, rng);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(g_current.data()), g_current.size());
    ++runs;
  }
  std::fprintf(stderr, "loom_fuzz: %llu inputs in %.0f s (seed %llu), no crash\n",
               static_cast<unsigned long long>(runs), seconds, static_cast<unsigned long long>(seed));
  return 0;
}
