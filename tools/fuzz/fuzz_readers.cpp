// The entry point both fuzz engines call (libFuzzer, or mutation_driver.cpp): one input through
// one of Loom's readers of untrusted files, chosen by LOOM_FUZZ_TARGET:
//   recipe      YAML text (then '\0'-separated overrides) through load_recipe_from_string; a
//               recipe that loads must read back from its own to_yaml (what config.yaml holds)
//   idx         bytes as an .idx beside a fixed .bin through IndexedDataset, then every token read
//   npy         bytes as an index-cache .npy through read_npy
//   checkpoint  text as a tracker, as metadata.json, and as the commit journal that
//               recover_checkpoint_dir acts on; afterwards the tracker must name a complete
//               iteration
//   stream      a corpus file (first byte: which of .jsonl, .jsonl.zst, .jsonl.gz, .txt.xz; the
//               rest: its bytes) read line by line through LineStream (decompression)
//   jsonl       a .jsonl corpus through preprocess with --skip-bad-lines 2 and a byte-level
//               tokenizer: it succeeds with at most 2 lines skipped, or fails leaving no output
//   hftokenizer a tokenizer.json through HfTokenizer; one that loads must encode a fixed
//               multilingual text to ids inside its vocabulary and decode them
// Each reader may refuse its input only with its documented error (RecipeError, DataError,
// CheckpointError); anything else - a crash, a sanitizer report, another exception - is a bug.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "config/recipe.h"
#include <nlohmann/json.hpp>

#include "data/byte_unicode.h"
#include "data/data_error.h"
#include "data/hf_tokenizer.h"
#include "data/indexed_dataset.h"
#include "data/input_stream.h"
#include "data/npy.h"
#include "data/preprocess.h"
#include "launch/file_util.h"
#include "train/checkpoint_files.h"

namespace {

enum class Target { kRecipe, kIdx, kNpy, kCheckpoint, kStream, kJsonl, kHfTokenizer };
Target g_target = Target::kRecipe;
std::string g_dir;  // this process's scratch directory

[[noreturn]] void bug(const std::string& what) {
  std::fprintf(stderr, "loom_fuzz: %s\n", what.c_str());
  std::abort();
}

void write_file(const std::string& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// to_yaml's text without its leading comment lines.
std::string without_header(const std::string& yaml) {
  size_t at = 0;
  while (at < yaml.size() && yaml[at] == '#') {
    const size_t nl = yaml.find('\n', at);
    at = nl == std::string::npos ? yaml.size() : nl + 1;
  }
  return yaml.substr(at);
}

void fuzz_recipe(const std::string& input) {
  // The text before the first '\0' is the document; each further '\0'-separated part an override.
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t nul; (nul = input.find('\0', start)) != std::string::npos; start = nul + 1)
    parts.push_back(input.substr(start, nul - start));
  parts.push_back(input.substr(start));
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  std::string yaml;
  try {
    yaml = loom::config::to_yaml(loom::config::load_recipe_from_string(parts[0], "fuzz.yaml", overrides));
  } catch (const loom::config::RecipeError&) {
    return;
  }
  try {
    const std::string again = loom::config::to_yaml(loom::config::load_recipe_from_string(yaml, "config.yaml"));
    // The comment header names the source file and overrides; the fields must match.
    if (without_header(again) != without_header(yaml))
      bug("to_yaml of a loaded recipe does not read back to the same fields:\n" + yaml + "\n---\n" + again);
  } catch (const loom::config::RecipeError& e) {
    bug(std::string("to_yaml of a loaded recipe does not load again: ") + e.what() + "\n" + yaml);
  }
}

void fuzz_idx(const uint8_t* data, size_t size) {
  const std::string prefix = g_dir + "/d";
  write_file(prefix + ".idx", data, size);
  try {
    loom::data::IndexedDataset ds(prefix);
    if (ds.num_tokens() > (1 << 16)) return;  // the .bin is 4 KiB: validation bounded this already
    for (size_t s = 0; s < ds.num_sequences(); ++s) ds.read(s);
    ds.check_token_range(50257);
  } catch (const loom::data::DataError&) {
  }
}

void fuzz_npy(const uint8_t* data, size_t size) {
  const std::string path = g_dir + "/a.npy";
  write_file(path, data, size);
  try {
    const auto a = loom::data::read_npy(path);
    size_t count = 1;
    for (size_t d : a.shape) count *= d;
    if (count != a.data.size()) bug("read_npy returned " + std::to_string(a.data.size()) + " values for its shape");
  } catch (const loom::data::DataError&) {
  }
}

void make_iteration(const std::string& dir, const std::string& name, int64_t iteration) {
  const std::string folder = dir + "/" + name;
  ::mkdir(folder.c_str(), 0755);
  ::mkdir((folder + "/mp_rank_00").c_str(), 0755);
  const std::string shard = "shard of " + name;
  write_file(folder + "/mp_rank_00/model_optim_rng.pt", shard.data(), shard.size());
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(loom::train::fnv1a64(shard.data(), shard.size())));
  const std::string meta =
      "{\"format\": \"loom-megatron-legacy-1\", \"iteration\": " + std::to_string(iteration) +
      ", \"layout\": {\"tensor_model_parallel_size\": 1, \"pipeline_model_parallel_size\": 1, "
      "\"virtual_pipeline_model_parallel_size\": 1, \"data_parallel_size\": 1, \"model\": {}}, \"files\": "
      "{\"mp_rank_00/model_optim_rng.pt\": {\"bytes\": " +
      std::to_string(shard.size()) + ", \"fnv1a64\": \"" + hash + "\"}}}";
  write_file(folder + "/metadata.json", meta.data(), meta.size());
}

void fuzz_checkpoint(const std::string& text) {
  using namespace loom::train;
  try {
    parse_tracker(text, "tracker");
  } catch (const CheckpointError&) {
  }
  try {
    parse_checkpoint_metadata(text, "metadata.json");
  } catch (const CheckpointError&) {
  }
  // A directory a killed commit could have left, with this input as its journal and as the
  // metadata of another iteration.
  const std::string dir = g_dir + "/checkpoints";
  loom::launch::remove_tree(dir);
  ::mkdir(dir.c_str(), 0755);
  make_iteration(dir, iteration_dir_name(2), 2);
  make_iteration(dir, iteration_dir_name(4) + ".tmp", 4);
  ::mkdir((dir + "/" + iteration_dir_name(6)).c_str(), 0755);
  write_file(dir + "/" + iteration_dir_name(6) + "/metadata.json", text.data(), text.size());
  write_file(dir + "/" + kTrackerFile, "2\n", 2);
  write_file(dir + "/" + kCommitJournal, text.data(), text.size());
  try {
    recover_checkpoint_dir(dir);
  } catch (const CheckpointError&) {
    return;  // a rename refused: reported to the user as such
  }
  const int64_t named = parse_tracker(read_file(dir + "/" + kTrackerFile), "tracker");
  if (!incomplete_reason(dir, named).empty())
    bug("after recovery the tracker names an incomplete iteration: " + incomplete_reason(dir, named));
  newest_complete_iteration(dir);
}

void fuzz_stream(const uint8_t* data, size_t size) {
  if (size == 0) return;
  static const char* const kNames[] = {"c.jsonl", "c.jsonl.zst", "c.jsonl.gz", "c.txt.xz"};
  const std::string path = g_dir + "/" + kNames[data[0] % 4];
  write_file(path, data + 1, size - 1);
  try {
    loom::data::LineStream in(path, /*max_line_bytes=*/int64_t{1} << 16);  // the cap's refusal is fuzzed too
    std::string line;
    int64_t bytes = 0;
    // A small compressed input may stand for a huge one: 1 MiB of lines is enough.
    while (bytes < (int64_t{1} << 20) && in.next_line(line)) bytes += static_cast<int64_t>(line.size()) + 1;
    if (in.bytes_out() < bytes - 1) bug("LineStream counted fewer bytes than it returned");
  } catch (const loom::data::DataError&) {
  }
  ::unlink(path.c_str());
}

// A byte-level BPE tokenizer.json with one token per byte and no merges (it loads in
// microseconds), plus <|endoftext|>.
std::string byte_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    std::string entry;
    loom::data::append_utf8(entry, loom::data::byte_to_codepoint()[b]);
    vocab[entry] = b;
  }
  return nlohmann::json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                        {"added_tokens", {{{"id", 256}, {"content", "<|endoftext|>"}}}}}
      .dump();
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

void fuzz_jsonl(const uint8_t* data, size_t size) {
  loom::data::PreprocessOptions o;
  o.inputs = {g_dir + "/corpus.jsonl"};
  write_file(o.inputs[0], data, size);
  o.output_prefix = g_dir + "/out";
  o.json_keys = {"text", "title"};
  o.tokenizer.library = "huggingface";
  o.tokenizer.model = g_dir + "/tokenizer.json";
  o.append_eod = true;
  o.skip_bad_lines = 2;
  const std::vector<std::string> outputs = {g_dir + "/out_text_document.bin", g_dir + "/out_text_document.idx",
                                            g_dir + "/out_title_document.bin", g_dir + "/out_title_document.idx"};
  try {
    const auto result = loom::data::preprocess(o);
    if (result.bad_lines.size() > 2) bug("preprocess skipped more lines than --skip-bad-lines 2");
    for (const auto& f : outputs)
      if (!exists(f)) bug("preprocess succeeded without writing " + f);
  } catch (const loom::data::DataError&) {
    for (const auto& f : outputs)
      if (exists(f)) bug("a failed preprocess left " + f);
  }
  for (const auto& f : outputs) ::unlink(f.c_str());
}

void fuzz_hf_tokenizer(const uint8_t* data, size_t size) {
  const std::string path = g_dir + "/fuzzed.json";
  write_file(path, data, size);
  std::unique_ptr<loom::data::HfTokenizer> tok;
  try {
    tok = std::make_unique<loom::data::HfTokenizer>(path);
  } catch (const loom::data::DataError&) {
    return;
  }
  static const std::string kText = "Hello, world! Grüße 我能吞下玻璃 <|endoftext|> ﬁ ＡＢＣ  \n\t 123 e\u0301";
  const std::vector<int32_t> ids = tok->encode(kText);
  for (int32_t id : ids)
    if (id < 0 || static_cast<size_t>(id) >= tok->vocab_size())
      bug("HfTokenizer encoded id " + std::to_string(id) + " outside its vocabulary of " +
          std::to_string(tok->vocab_size()));
  (void)tok->decode(ids);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* target = std::getenv("LOOM_FUZZ_TARGET");
  const std::string t = target ? target : "recipe";
  if (t == "recipe") g_target = Target::kRecipe;
  else if (t == "idx") g_target = Target::kIdx;
  else if (t == "npy") g_target = Target::kNpy;
  else if (t == "checkpoint") g_target = Target::kCheckpoint;
  else if (t == "stream") g_target = Target::kStream;
  else if (t == "jsonl") g_target = Target::kJsonl;
  else if (t == "hftokenizer") g_target = Target::kHfTokenizer;
  else bug("LOOM_FUZZ_TARGET must be recipe, idx, npy, checkpoint, stream, jsonl or hftokenizer, found '" + t + "'");
  // In memory when possible: the checkpoint target fsyncs what it renames.
  struct stat shm {};
  std::string tmpl = ::stat("/dev/shm", &shm) == 0 && S_ISDIR(shm.st_mode) ? "/dev/shm/loom_fuzz_XXXXXX"
                                                                             : "/tmp/loom_fuzz_XXXXXX";
  if (!::mkdtemp(tmpl.data())) bug("cannot create a scratch directory");
  g_dir = tmpl;
  // A fixed .bin for the .idx target: 4 KiB of varied bytes.
  std::string bin(4096, '\0');
  for (size_t i = 0; i < bin.size(); ++i) bin[i] = static_cast<char>((i * 7919) >> 3);
  write_file(g_dir + "/d.bin", bin.data(), bin.size());
  const std::string tokenizer = byte_tokenizer_json();
  write_file(g_dir + "/tokenizer.json", tokenizer.data(), tokenizer.size());
  std::atexit([] { loom::launch::remove_tree(g_dir); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  switch (g_target) {
    case Target::kRecipe: fuzz_recipe(std::string(reinterpret_cast<const char*>(data), size)); break;
    case Target::kIdx: fuzz_idx(data, size); break;
    case Target::kNpy: fuzz_npy(data, size); break;
    case Target::kCheckpoint: fuzz_checkpoint(std::string(reinterpret_cast<const char*>(data), size)); break;
    case Target::kStream: fuzz_stream(data, size); break;
    case Target::kJsonl: fuzz_jsonl(data, size); break;
    case Target::kHfTokenizer: fuzz_hf_tokenizer(data, size); break;
  }
  return 0;
}
