#include "data/hf_tokenizer.h"

#include <sys/stat.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "data/data_error.h"
#include "data/gpt2_tokenizer.h"
#include "data/utf8.h"

namespace loom::data {
namespace {

using nlohmann::json;

std::string tokenizer_json_path(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return path + "/tokenizer.json";
  return path;
}

// PCRE2 pattern matching `s` literally.
std::string quote_regex(const std::string& s) { return "\\Q" + s + "\\E"; }

bool is_null_or_empty(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty());
}

// Each reader below takes one top-level section of the file; `bad` makes the DataError that
// names the file.
using Bad = std::function<DataError(const std::string&)>;

json read_tokenizer_json(const std::string& path, const Bad& bad) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw bad("cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {
    throw bad(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw bad("expected a JSON object");
  return j;
}

std::pair<std::string, std::string> read_merge(const json& merge, size_t index, const Bad& bad) {
  if (merge.is_string()) {
    const auto s = merge.get<std::string>();
    const auto sp = s.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size())
      throw bad("model.merges[" + std::to_string(index) + "]: expected \"left right\", found '" + s + "'");
    return {s.substr(0, sp), s.substr(sp + 1)};
  }
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string())
    return {merge[0].get<std::string>(), merge[1].get<std::string>()};
  throw bad("model.merges[" + std::to_string(index) + "]: expected \"left right\" or [left, right]");
}

// "model": a byte-level BPE's vocabulary and merges, into `parts`.
void read_bpe_model(const json& m, Gpt2Tokenizer::Parts& parts, const Bad& bad) {
  if (m.value("type", std::string("BPE")) != "BPE")
    throw bad("model.type is '" + m.value("type", std::string()) + "'; Loom reads byte-level BPE tokenizers only");
  if (!is_null_or_empty(m, "dropout")) throw bad("model.dropout is set; BPE dropout is for training, not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!is_null_or_empty(m, key)) throw bad(std::string("model.") + key + " is set; Loom reads byte-level BPE only");
  if (m.value("byte_fallback", false)) throw bad("model.byte_fallback is true; Loom reads byte-level BPE only");
  parts.ignore_merges = m.value("ignore_merges", false);
  const json& vocab = m.at("vocab");
  if (!vocab.is_object()) throw bad("model.vocab: expected an object token -> id");
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer()) throw bad("model.vocab['" + it.key() + "']: expected an integer id");
    parts.vocab.emplace_back(it.key(), it.value().get<int32_t>());
  }
  size_t index = 0;
  for (const json& merge : m.at("merges")) parts.merges.push_back(read_merge(merge, index++, bad));
}

// "normalizer": the utf8proc option sets to apply in order (none for null).
std::vector<int> read_normalizers(const json& j, const Bad& bad) {
  std::vector<int> out;
  auto add = [&](const json& n) {
    const std::string type = n.at("type").get<std::string>();
    if (type == "NFC") out.push_back(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    else if (type == "NFD") out.push_back(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    else if (type == "NFKC") out.push_back(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    else if (type == "NFKD") out.push_back(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
    else throw bad("normalizer type '" + type + "' is not supported (null, NFC, NFD, NFKC, NFKD or a Sequence of them)");
  };
  if (auto n = j.find("normalizer"); n != j.end() && !n->is_null()) {
    if (n->at("type") == "Sequence") for (const json& x : n->at("normalizers")) add(x);
    else add(*n);
  }
  return out;
}

// "pre_tokenizer": the split pattern (into `parts`; empty: GPT-2's) and whether a space is put
// before a segment that does not start with one.
bool read_pre_tokenizer(const json& j, Gpt2Tokenizer::Parts& parts, const Bad& bad) {
  bool add_prefix_space = false;
  auto byte_level = [&](const json& p, bool regex_allowed) {
    add_prefix_space = p.value("add_prefix_space", false);
    const bool use_regex = p.value("use_regex", true);
    if (use_regex && !regex_allowed) throw bad("pre_tokenizer: ByteLevel with use_regex after a Split is not supported");
    return use_regex;
  };
  const json& pre = j.at("pre_tokenizer");
  if (pre.is_null()) throw bad("pre_tokenizer is null; Loom reads byte-level BPE (a ByteLevel pre-tokenizer)");
  const std::string pre_type = pre.at("type").get<std::string>();
  if (pre_type == "ByteLevel") {
    if (!byte_level(pre, true)) throw bad("pre_tokenizer: ByteLevel without use_regex (no split at all) is not supported");
    return add_prefix_space;
  }
  if (pre_type != "Sequence")
    throw bad("pre_tokenizer type '" + pre_type + "' is not supported (ByteLevel, or Sequence [Split, ByteLevel])");
  const json& seq = pre.at("pretokenizers");
  if (seq.size() != 2 || seq[0].at("type") != "Split" || seq[1].at("type") != "ByteLevel")
    throw bad("pre_tokenizer: a Sequence must be [Split, ByteLevel] (as Llama 3's); found another sequence");
  const json& split = seq[0];
  if (split.value("behavior", std::string()) != "Isolated" || split.value("invert", false))
    throw bad("pre_tokenizer Split: behavior Isolated without invert is supported, found '" +
              split.value("behavior", std::string()) + "'");
  const json& pattern = split.at("pattern");
  if (pattern.contains("Regex")) parts.pattern = pattern.at("Regex").get<std::string>();
  else parts.pattern = quote_regex(pattern.at("String").get<std::string>());
  byte_level(seq[1], false);
  return add_prefix_space;
}

// "added_tokens": (content, id) pairs.
std::vector<std::pair<std::string, int32_t>> read_added_tokens(const json& j, const Bad& bad) {
  std::vector<std::pair<std::string, int32_t>> out;
  auto a = j.find("added_tokens");
  if (a == j.end() || a->is_null()) return out;
  for (const json& t : *a) {
    out.emplace_back(t.at("content").get<std::string>(), t.at("id").get<int32_t>());
    if (out.back().first.empty() || out.back().second < 0)
      throw bad("added_tokens: an entry has empty content or a negative id");
  }
  return out;
}

void check_decoder(const json& j, const Bad& bad) {
  if (auto d = j.find("decoder"); d != j.end() && !d->is_null() && d->at("type") != "ByteLevel")
    throw bad("decoder type '" + d->at("type").get<std::string>() + "' is not supported (ByteLevel)");
}

}  // namespace

HfTokenizer::HfTokenizer(const std::string& path) : path_(tokenizer_json_path(path)) {
  const Bad bad = [&](const std::string& what) { return DataError("tokenizer.json '" + path_ + "': " + what); };
  const json j = read_tokenizer_json(path_, bad);
  try {
    Gpt2Tokenizer::Parts parts;
    parts.source = path_;
    read_bpe_model(j.at("model"), parts, bad);
    normalizers_ = read_normalizers(j, bad);
    add_prefix_space_ = read_pre_tokenizer(j, parts, bad);
    check_decoder(j, bad);
    bpe_ = std::make_unique<Gpt2Tokenizer>(parts);
    vocab_size_ = bpe_->vocab_size();
    for (auto& [content, id] : read_added_tokens(j, bad)) {
      vocab_size_ = std::max(vocab_size_, static_cast<size_t>(id) + 1);
      added_.push_back({std::move(content), id});
    }
  } catch (const json::exception& e) {
    throw bad(std::string("unexpected structure: ") + e.what());
  }
  added_text_.assign(vocab_size_, std::string());
  for (const auto& t : added_) added_text_[t.id] = t.content;
  eod_id_ = added_id({"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"});
  // GPT-2-style vocabularies (NeoX's) use <|endoftext|> for both ends.
  bos_id_ = added_id({"<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"});
  if (bos_id_ < 0) bos_id_ = eod_id_;
  pad_id_ = added_id({"<pad>", "<|padding|>", "<|pad|>", "[PAD]"});
  if (pad_id_ < 0) pad_id_ = std::max(eod_id_, 0);
}

int32_t HfTokenizer::added_id(std::initializer_list<const char*> names) const {
  for (const char* name : names) {
    auto it = std::find_if(added_.begin(), added_.end(), [&](const Added& t) { return t.content == name; });
    if (it != added_.end()) return it->id;
  }
  return -1;
}

HfTokenizer::~HfTokenizer() = default;

void HfTokenizer::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized;
  const bool ascii = std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  if (!normalizers_.empty() && !ascii) {  // every normal form of ASCII is itself
    normalized.assign(text);
    for (int options : normalizers_) {
      utf8proc_uint8_t* mapped = nullptr;
      const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(normalized.data()),
                                  static_cast<utf8proc_ssize_t>(normalized.size()), &mapped,
                                  static_cast<utf8proc_option_t>(options));
      if (n < 0) throw std::runtime_error(std::string("utf8proc: ") + utf8proc_errmsg(n));
      normalized.assign(reinterpret_cast<char*>(mapped), static_cast<size_t>(n));
      std::free(mapped);
    }
    text = normalized;
  }
  if (add_prefix_space_ && text[0] != ' ') {
    std::string prefixed = " " + std::string(text);
    bpe_->encode(prefixed, out);
    return;
  }
  bpe_->encode(text, out);
}

void HfTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::string repaired;
  if (utf8_valid_prefix(text) != text.size()) {
    repaired = utf8_replace_invalid(text);
    text = repaired;
  }
  size_t pos = 0;
  while (pos < text.size()) {
    // Leftmost added token, the longest at that position.
    size_t best = std::string_view::npos;
    const Added* hit = nullptr;
    for (const auto& t : added_) {
      const size_t at = text.find(t.content, pos);
      if (at == std::string_view::npos) continue;
      if (at < best || (at == best && t.content.size() > hit->content.size())) {
        best = at;
        hit = &t;
      }
    }
    if (!hit) break;
    encode_segment(text.substr(pos, best - pos), out);
    out.push_back(hit->id);
    pos = best + hit->content.size();
  }
  encode_segment(text.substr(pos), out);
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id >= 0 && static_cast<size_t>(id) < added_text_.size() && !added_text_[id].empty()) out += added_text_[id];
    else out += bpe_->token_bytes(id);
  }
  return out;
}

}  // namespace loom::data
