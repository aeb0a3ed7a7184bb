#include "data/preprocess.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "data/data_error.h"
#include "data/gpt2_tokenizer.h"
#include "data/indexed_dataset.h"

namespace loom::data {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool blank(const std::string& line) { return line.find_first_not_of(" \t\r\f\v") == std::string::npos; }

// One unit of input: a JSONL line or a plain-text document, with its first line number.
struct Item {
  std::string text;
  int64_t line;
};

// One encoded document per key: token ids and sequence lengths.
struct Encoded {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<int32_t>> lengths;
};

class Reader {
 public:
  Reader(const std::string& path, bool jsonl) : in_(path, std::ios::binary), jsonl_(jsonl) {
    if (!in_) throw std::runtime_error("preprocess: cannot open input '" + path + "'");
  }
  // Reads items until about `budget` bytes are collected or the input ends.
  bool read(std::vector<Item>& out, size_t budget, int64_t& bytes) {
    out.clear();
    size_t got = 0;
    std::string line;
    while (got < budget && std::getline(in_, line)) {
      ++lineno_;
      bytes += static_cast<int64_t>(line.size()) + (in_.eof() ? 0 : 1);
      got += line.size() + 1;
      if (jsonl_) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (!blank(line)) out.push_back({std::move(line), lineno_});
        continue;
      }
      if (blank(line)) {
        flush(out);
        continue;
      }
      if (doc_.text.empty()) doc_.line = lineno_;
      else doc_.text += '\n';
      doc_.text += line;
    }
    if (!in_ && !in_.eof()) throw std::runtime_error("preprocess: read error");
    if (in_.eof()) flush(out);
    return !out.empty() || !in_.eof();
  }

 private:
  void flush(std::vector<Item>& out) {
    if (!doc_.text.empty()) out.push_back(std::move(doc_));
    doc_ = Item{};
  }
  std::ifstream in_;
  bool jsonl_;
  int64_t lineno_ = 0;
  Item doc_;
};

void encode_item(const Item& item, const PreprocessOptions& o, bool jsonl, const Gpt2Tokenizer& tok, Encoded& out) {
  out.tokens.assign(o.json_keys.size(), {});
  out.lengths.assign(o.json_keys.size(), {});
  auto where = [&] { return "preprocess: '" + o.input + "' line " + std::to_string(item.line); };
  auto finish = [&](size_t k) {
    if (o.append_eod && !out.tokens[k].empty()) {
      out.tokens[k].push_back(tok.eod_id());
      out.lengths[k].back() += 1;
    }
  };
  if (!jsonl) {
    tok.encode(item.text, out.tokens[0]);
    if (!out.tokens[0].empty()) out.lengths[0].push_back(static_cast<int32_t>(out.tokens[0].size()));
    finish(0);
    return;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(item.text);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(where() + ": not a JSON object: " + e.what());
  }
  if (!j.is_object()) throw DataError(where() + ": expected a JSON object, found " + std::string(j.type_name()));
  for (size_t k = 0; k < o.json_keys.size(); ++k) {
    auto it = j.find(o.json_keys[k]);
    if (it == j.end()) throw DataError(where() + ": no key \"" + o.json_keys[k] + "\"");
    std::vector<std::string> parts;
    if (it->is_string()) parts.push_back(it->get<std::string>());
    else if (it->is_array() && std::all_of(it->begin(), it->end(), [](const auto& v) { return v.is_string(); }))
      for (const auto& v : *it) parts.push_back(v.get<std::string>());
    else
      throw DataError(where() + ": key \"" + o.json_keys[k] + "\" holds " + it->type_name() +
                      ", expected a string or an array of strings");
    for (const auto& p : parts) {
      const size_t before = out.tokens[k].size();
      tok.encode(p, out.tokens[k]);
      const size_t n = out.tokens[k].size() - before;
      if (n > 0) out.lengths[k].push_back(static_cast<int32_t>(n));
    }
    finish(k);
  }
}

}  // namespace

PreprocessResult preprocess(const PreprocessOptions& o) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  if (o.json_keys.empty()) throw DataError("preprocess: no JSON key given");
  if (o.workers < 1) throw DataError("preprocess: workers must be at least 1, got " + std::to_string(o.workers));
  const bool jsonl = ends_with(o.input, ".jsonl") || ends_with(o.input, ".json");
  if (!jsonl && o.json_keys.size() != 1)
    throw DataError("preprocess: plain-text input '" + o.input + "' has one document stream; give one key, not " +
                    std::to_string(o.json_keys.size()));
  struct stat st{};
  if (::stat(o.input.c_str(), &st) != 0) throw DataError("preprocess: input '" + o.input + "' does not exist");
  const auto total_bytes = static_cast<int64_t>(st.st_size);

  Gpt2Tokenizer tok(o.vocab_file, o.merge_file);
  if (o.append_eod && tok.eod_id() < 0)
    throw DataError("preprocess: --append-eod but vocabulary '" + o.vocab_file + "' has no <|endoftext|>");
  const DType dtype = token_dtype_for_vocab(tok.vocab_size());

  PreprocessResult r;
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (const auto& key : o.json_keys) {
    r.output_prefixes.push_back(o.output_prefix + "_" + key + "_document");
    writers.push_back(std::make_unique<IndexedDatasetWriter>(r.output_prefixes.back(), dtype));
  }

  Reader reader(o.input, jsonl);
  std::vector<Item> items;
  std::vector<Encoded> encoded;
  const size_t budget = o.chunk_bytes * static_cast<size_t>(o.workers);
  double encode_seconds = 0;
  while (reader.read(items, budget, r.bytes)) {
    encoded.assign(items.size(), {});
    const auto e0 = clock::now();
    const size_t nw = std::min<size_t>(static_cast<size_t>(o.workers), std::max<size_t>(items.size(), 1));
    std::vector<std::exception_ptr> errors(nw);
    std::vector<size_t> error_item(nw, SIZE_MAX);
    auto work = [&](size_t w) {
      for (size_t i = w; i < items.size(); i += nw) {
        try {
          encode_item(items[i], o, jsonl, tok, encoded[i]);
        } catch (...) {
          errors[w] = std::current_exception();
          error_item[w] = i;
          return;
        }
      }
    };
    if (nw == 1) {
      work(0);
    } else {
      std::vector<std::thread> threads;
      for (size_t w = 0; w < nw; ++w) threads.emplace_back(work, w);
      for (auto& t : threads) t.join();
    }
    encode_seconds += std::chrono::duration<double>(clock::now() - e0).count();
    // Report the earliest failing item (lowest line), whatever worker met it.
    size_t first = 0;
    for (size_t w = 1; w < nw; ++w)
      if (error_item[w] < error_item[first]) first = w;
    if (errors[first]) std::rethrow_exception(errors[first]);
    for (auto& e : encoded) {
      for (size_t k = 0; k < writers.size(); ++k) {
        writers[k]->add_document(e.tokens[k], e.lengths[k]);
        r.tokens += static_cast<int64_t>(e.tokens[k].size());
      }
      ++r.documents;
    }
    if (o.on_progress)
      o.on_progress({r.bytes, total_bytes, r.documents, r.tokens,
                     std::chrono::duration<double>(clock::now() - t0).count()});
  }
  for (auto& w : writers) w->finalize();
  r.encode_seconds = encode_seconds;
  r.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return r;
}

}  // namespace loom::data
