#include "data/gpt2_tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <tuple>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "data/byte_unicode.h"
#include "data/data_error.h"
#include "data/utf8.h"

namespace loom::data {
namespace {

// GPT-2 pre-tokenisation pattern with \s written as Unicode White_Space (see the header).
#define LOOM_WS "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
constexpr const char* kPattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" LOOM_WS "\\p{L}\\p{N}]+"
    "|[" LOOM_WS "]+(?![^" LOOM_WS "])|[" LOOM_WS "]+";
#undef LOOM_WS

constexpr size_t kCacheLimit = 1 << 18;  // pieces cached per thread before the cache is reset

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(std::string(what) + " '" + path + "': cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Decodes UTF-8 (already known valid) into code points.
std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    uint32_t cp;
    int n;
    if (b < 0x80) { cp = b; n = 1; }
    else if (b < 0xE0) { cp = b & 0x1F; n = 2; }
    else if (b < 0xF0) { cp = b & 0x0F; n = 3; }
    else { cp = b & 0x07; n = 4; }
    for (int k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
    cps.push_back(cp);
    i += n;
  }
  return cps;
}

std::atomic<uint64_t> next_instance{1};

struct MergeError {
  int32_t rank;
  std::string merge;
};

}  // namespace

struct Gpt2Tokenizer::Impl {
  uint64_t instance = next_instance++;
  std::string vocab_path;
  bool ignore_merges = false;
  std::unordered_map<std::string, int32_t> raw_vocab;  // raw bytes -> id (ignore_merges only)
  std::unordered_map<std::string, int32_t> vocab;   // vocab entry (mapped alphabet) -> id
  std::vector<std::string> id_bytes;                // id -> raw bytes
  std::vector<bool> id_present;
  std::array<int32_t, 256> byte_id{};               // single-byte token ids
  struct Merge { int32_t rank; int32_t id; };
  std::unordered_map<uint64_t, Merge> merges;       // (left id << 32 | right id) -> rank, result
  pcre2_code* regex = nullptr;
  bool jit = false;

  // Per-thread scratch: PCRE2 match data, JIT stack and the piece cache.
  struct ThreadState {
    uint64_t owner = 0;
    pcre2_match_data* match = nullptr;
    pcre2_match_context* context = nullptr;
    pcre2_jit_stack* jit_stack = nullptr;
    std::unordered_map<std::string, std::vector<int32_t>> cache;
    std::string key;
    std::vector<int32_t> symbols;
    std::vector<int64_t> prev, next;                     // linked list over symbols (merge_all)
    std::vector<bool> removed;
    std::vector<std::tuple<int32_t, int64_t, int32_t>> heap;  // (rank, left position, merged id)
    void reset() {
      if (match) pcre2_match_data_free(match);
      if (context) pcre2_match_context_free(context);
      if (jit_stack) pcre2_jit_stack_free(jit_stack);
      match = nullptr; context = nullptr; jit_stack = nullptr;
      cache.clear();
      owner = 0;
    }
    ~ThreadState() { reset(); }
  };

  ThreadState& state() const {
    thread_local ThreadState ts;
    if (ts.owner != instance) {
      ts.reset();
      ts.match = pcre2_match_data_create_from_pattern(regex, nullptr);
      ts.context = pcre2_match_context_create(nullptr);
      if (jit) {
        ts.jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
        pcre2_jit_stack_assign(ts.context, nullptr, ts.jit_stack);
      }
      if (!ts.match || !ts.context) throw std::runtime_error("GPT-2 tokenizer: out of memory for PCRE2 match data");
      ts.owner = instance;
    }
    return ts;
  }

  // Calls fn(offset, length) for each pre-tokenisation piece of valid UTF-8 text.
  template <class Fn>
  void for_each_piece(std::string_view text, ThreadState& ts, Fn&& fn) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t start = 0, search = 0;
    while (search < text.size()) {
      int rc = pcre2_match(regex, subject, text.size(), search, PCRE2_NO_UTF_CHECK, ts.match, ts.context);
      if (rc == PCRE2_ERROR_NOMATCH) break;  // GPT-2's pattern matches every character
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw std::runtime_error("GPT-2 tokenizer: PCRE2 match failed at byte " + std::to_string(start) +
                                 ": " + reinterpret_cast<char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ts.match);
      if (ov[1] <= ov[0]) {  // an empty match splits nothing: look again one character on
        search = ov[0] + 1;
        while (search < text.size() && (static_cast<uint8_t>(text[search]) & 0xC0) == 0x80) ++search;
        continue;
      }
      // Text between matches is a piece of its own (Hugging Face's Split "Isolated").
      if (ov[0] > start) fn(start, ov[0] - start);
      fn(ov[0], ov[1] - ov[0]);
      start = search = ov[1];
    }
    if (start < text.size()) fn(start, text.size() - start);
  }

  // Applies the merges to `sym` in place: the lowest-ranked adjacent pair first, the leftmost
  // on equal ranks, until none applies. A heap of candidate pairs over a linked list of
  // symbols makes this O(n log n) in the piece's length, as the reference tokenizers do; the
  // former scan of every pair per merge was quadratic (a long word without spaces took
  // seconds per 100 KB).
  void merge_all(std::vector<int32_t>& sym, ThreadState& ts) const {
    const size_t n = sym.size();
    if (n < 2) return;
    auto& prev = ts.prev;
    auto& next = ts.next;
    prev.resize(n);
    next.resize(n);
    for (size_t i = 0; i < n; ++i) {
      prev[i] = static_cast<int64_t>(i) - 1;
      next[i] = i + 1 < n ? static_cast<int64_t>(i + 1) : -1;
    }
    auto& heap = ts.heap;
    heap.clear();
    // (rank, left position, result id); std::greater makes a min-heap: lowest rank, then leftmost.
    auto push = [&](int64_t left) {
      const int64_t right = next[static_cast<size_t>(left)];
      if (right < 0) return;
      auto m = merges.find(pair_key(sym[static_cast<size_t>(left)], sym[static_cast<size_t>(right)]));
      if (m == merges.end()) return;
      heap.push_back({m->second.rank, left, m->second.id});
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int64_t>(i));
    std::vector<bool>& removed = ts.removed;
    removed.assign(n, false);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      const auto [rank, left, id] = heap.back();
      heap.pop_back();
      const auto l = static_cast<size_t>(left);
      if (removed[l]) continue;
      const int64_t right = next[l];
      if (right < 0) continue;
      // Stale entry: the pair at `left` changed since it was pushed (a neighbour merged).
      auto m = merges.find(pair_key(sym[l], sym[static_cast<size_t>(right)]));
      if (m == merges.end() || m->second.id != id || m->second.rank != rank) continue;
      sym[l] = id;
      removed[static_cast<size_t>(right)] = true;
      next[l] = next[static_cast<size_t>(right)];
      if (next[l] >= 0) prev[static_cast<size_t>(next[l])] = left;
      if (prev[l] >= 0) push(prev[l]);
      push(left);
    }
    size_t w = 0;
    for (int64_t i = 0; i >= 0; i = next[static_cast<size_t>(i)]) sym[w++] = sym[static_cast<size_t>(i)];
    sym.resize(w);
  }

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  // BPE of one piece's bytes; appends ids to out.
  void bpe(std::string_view piece, std::vector<int32_t>& out, ThreadState& ts) const {
    if (piece.size() == 1) {
      out.push_back(byte_id[static_cast<uint8_t>(piece[0])]);
      return;
    }
    ts.key.assign(piece.data(), piece.size());
    auto hit = ts.cache.find(ts.key);
    if (hit != ts.cache.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
    if (ignore_merges) {
      auto whole = raw_vocab.find(ts.key);
      if (whole != raw_vocab.end()) {
        out.push_back(whole->second);
        return;
      }
    }
    auto& sym = ts.symbols;
    sym.clear();
    for (char c : piece) sym.push_back(byte_id[static_cast<uint8_t>(c)]);
    merge_all(sym, ts);
    out.insert(out.end(), sym.begin(), sym.end());
    if (ts.cache.size() >= kCacheLimit) ts.cache.clear();
    ts.cache.emplace(ts.key, sym);
  }

  ~Impl() {
    if (regex) pcre2_code_free(regex);
  }
};

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& vocab_json_path, const std::string& merges_path)
    : impl_(std::make_unique<Impl>()) {
  Parts parts;
  parts.source = vocab_json_path;
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(read_file(vocab_json_path, "GPT-2 vocab file"));
  } catch (const nlohmann::json::exception& e) {
    throw DataError("GPT-2 vocab file '" + vocab_json_path + "': not valid JSON: " + e.what());
  }
  if (!vocab.is_object() || vocab.empty())
    throw DataError("GPT-2 vocab file '" + vocab_json_path + "': expected a non-empty JSON object token -> id");
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > (1 << 30))
      throw DataError("GPT-2 vocab file '" + vocab_json_path + "': token '" + it.key() + "' has id " +
                      it.value().dump() + ", expected a non-negative integer");
    parts.vocab.emplace_back(it.key(), it.value().get<int32_t>());
  }
  std::istringstream merges(read_file(merges_path, "GPT-2 merges file"));
  std::string line;
  std::vector<size_t> merge_lines;
  for (size_t lineno = 1; std::getline(merges, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lineno == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) continue;
    const auto sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size() || line.find(' ', sp + 1) != std::string::npos)
      throw DataError("GPT-2 merges file '" + merges_path + "' line " + std::to_string(lineno) +
                      ": expected two tokens separated by one space, found '" + line + "'");
    parts.merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
    merge_lines.push_back(lineno);
  }
  try {
    build(parts);
  } catch (const MergeError& e) {
    throw DataError("GPT-2 merges file '" + merges_path + "' line " + std::to_string(merge_lines[e.rank]) + ": merge '" +
                    e.merge + "' uses a token missing from the vocabulary '" + vocab_json_path + "'");
  }
}

Gpt2Tokenizer::Gpt2Tokenizer(const Parts& parts) : impl_(std::make_unique<Impl>()) {
  try {
    build(parts);
  } catch (const MergeError& e) {
    throw DataError("tokenizer '" + parts.source + "': merge " + std::to_string(e.rank + 1) + " '" + e.merge +
                    "' uses a token missing from the vocabulary");
  }
}

const char* Gpt2Tokenizer::gpt2_pattern() { return kPattern; }

void Gpt2Tokenizer::build(const Parts& parts) {
  auto& im = *impl_;
  im.vocab_path = parts.source;
  im.ignore_merges = parts.ignore_merges;
  const std::string& vocab_json_path = parts.source;
  int64_t max_id = -1;
  for (const auto& [entry, id] : parts.vocab) {
    if (id < 0 || id > (1 << 30))
      throw DataError("tokenizer '" + vocab_json_path + "': token '" + entry + "' has id " + std::to_string(id) +
                      ", expected a non-negative integer");
    im.vocab.emplace(entry, id);
    max_id = std::max<int64_t>(max_id, id);
  }
  im.id_bytes.assign(max_id + 1, std::string());
  im.id_present.assign(max_id + 1, false);
  for (const auto& [entry, id] : im.vocab) {
    std::string bytes;
    for (uint32_t cp : code_points(entry)) {
      const int b = codepoint_to_byte(cp);
      if (b >= 0) bytes += static_cast<char>(b);
      else append_utf8(bytes, cp);  // not from the byte alphabet (e.g. added tokens): keep as is
    }
    if (im.id_present[id])
      throw DataError("tokenizer vocabulary '" + vocab_json_path + "': id " + std::to_string(id) + " used twice");
    if (im.ignore_merges) im.raw_vocab.emplace(bytes, id);
    im.id_bytes[id] = std::move(bytes);
    im.id_present[id] = true;
  }
  const auto& b2c = byte_to_codepoint();
  for (int b = 0; b < 256; ++b) {
    std::string entry;
    append_utf8(entry, b2c[b]);
    auto it = im.vocab.find(entry);
    if (it == im.vocab.end())
      throw DataError("tokenizer vocabulary '" + vocab_json_path + "': no token for byte " + std::to_string(b) +
                      " (a byte-level vocabulary needs all 256)");
    im.byte_id[b] = it->second;
  }
  if (auto it = im.vocab.find("<|endoftext|>"); it != im.vocab.end()) eod_id_ = it->second;

  int32_t rank = 0;
  for (const auto& [left, right] : parts.merges) {
    auto l = im.vocab.find(left), r = im.vocab.find(right), m = im.vocab.find(left + right);
    if (l == im.vocab.end() || r == im.vocab.end() || m == im.vocab.end()) throw MergeError{rank, left + " " + right};
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(l->second)) << 32) | static_cast<uint32_t>(r->second);
    im.merges.emplace(key, Impl::Merge{rank++, m->second});  // first (lowest) rank wins on duplicates
  }

  // Pre-tokenisation regex.
  const std::string pattern = parts.pattern.empty() ? std::string(kPattern) : parts.pattern;
  int err = 0;
  PCRE2_SIZE erroff = 0;
  im.regex = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                           &err, &erroff, nullptr);
  if (!im.regex) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw DataError("tokenizer '" + vocab_json_path + "': cannot compile the pre-tokenisation pattern at offset " +
                    std::to_string(erroff) + ": " + reinterpret_cast<char*>(msg));
  }
  im.jit = pcre2_jit_compile(im.regex, PCRE2_JIT_COMPLETE) == 0;
}

Gpt2Tokenizer::~Gpt2Tokenizer() = default;

size_t Gpt2Tokenizer::vocab_size() const { return impl_->id_bytes.size(); }
size_t Gpt2Tokenizer::num_merges() const { return impl_->merges.size(); }

void Gpt2Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::string repaired;
  if (utf8_valid_prefix(text) != text.size()) {
    repaired = utf8_replace_invalid(text);
    text = repaired;
  }
  auto& ts = impl_->state();
  impl_->for_each_piece(text, ts, [&](size_t off, size_t len) { impl_->bpe(text.substr(off, len), out, ts); });
}

std::string Gpt2Tokenizer::description() const { return "GPT-2 BPE ('" + impl_->vocab_path + "')"; }

const std::string& Gpt2Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_bytes.size() || !impl_->id_present[id])
    throw std::out_of_range("GPT-2 tokenizer: token id " + std::to_string(id) + " is not in the vocabulary (size " +
                            std::to_string(impl_->id_bytes.size()) + ")");
  return impl_->id_bytes[id];
}

std::string Gpt2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

int32_t Gpt2Tokenizer::token_id(const std::string& vocab_entry) const {
  auto it = impl_->vocab.find(vocab_entry);
  return it == impl_->vocab.end() ? -1 : it->second;
}

std::vector<std::string> Gpt2Tokenizer::pretokenize(std::string_view text) const {
  if (utf8_valid_prefix(text) != text.size())
    throw std::invalid_argument("GPT-2 tokenizer: pretokenize needs valid UTF-8");
  std::vector<std::string> pieces;
  auto& ts = impl_->state();
  impl_->for_each_piece(text, ts, [&](size_t off, size_t len) { pieces.emplace_back(text.substr(off, len)); });
  return pieces;
}

}  // namespace loom::data
