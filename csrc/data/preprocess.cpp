#include "data/preprocess.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "data/data_error.h"
#include "data/indexed_dataset.h"
#include "data/input_stream.h"

namespace loom::data {
namespace {

bool blank(const std::string& line) { return line.find_first_not_of(" \t\r\f\v") == std::string::npos; }

// One unit of input: a JSON line or a plain-text document, with its file and first line.
struct Item {
  std::string text;
  int32_t file;
  int64_t line;
};

// One encoded document per key: token ids and sequence lengths; or why the line is malformed.
struct Encoded {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<int32_t>> lengths;
  std::string error;
};

// The documents of a partition's share, in input order, read in chunks of about `budget` bytes.
class CorpusReader {
 public:
  CorpusReader(const PartitionShare& share, int64_t max_line_bytes) : share_(share), max_line_bytes_(max_line_bytes) {}

  bool read(std::vector<Item>& out, size_t budget) {
    out.clear();
    size_t got = 0;
    std::string line;
    while (got < budget && !done_) {
      if (!stream_ && !open_next()) break;
      const int64_t start = base_ + stream_->bytes_out();
      if (!stream_->next_line(line)) {
        flush(out);
        base_ += stream_->bytes_out();
        bytes_in_done_ += stream_->bytes_in();
        stream_.reset();
        continue;
      }
      got += line.size() + 1;
      if (json_) {
        if (blank(line)) continue;
        if (past_end(start)) break;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (in_share(start)) out.push_back({std::move(line), file_, stream_->line_number()});
        continue;
      }
      if (blank(line)) {
        flush(out);
        continue;
      }
      if (doc_.text.empty() && !open_doc_) {
        if (past_end(start)) break;
        doc_.file = file_;
        doc_.line = stream_->line_number();
        doc_start_ = start;
        open_doc_ = true;
      } else {
        doc_.text += '\n';
      }
      doc_.text += line;
    }
    return !out.empty();
  }
  int64_t bytes() const { return base_ + (stream_ ? stream_->bytes_out() : 0); }
  int64_t bytes_in() const { return bytes_in_done_ + (stream_ ? stream_->bytes_in() : 0); }
  int64_t files_opened() const { return next_file_; }

 private:
  bool open_next() {
    if (next_file_ >= share_.files.size()) {
      done_ = true;
      return false;
    }
    file_ = static_cast<int32_t>(next_file_);
    stream_ = std::make_unique<LineStream>(share_.files[next_file_++], max_line_bytes_);
    json_ = input_kind(stream_->path()).json;
    return true;
  }
  bool in_share(int64_t start) const {
    return !share_.by_documents || (start >= share_.first_byte && start < share_.end_byte);
  }
  bool past_end(int64_t start) {
    if (share_.by_documents && start >= share_.end_byte) done_ = true;
    return done_;
  }
  void flush(std::vector<Item>& out) {
    if (open_doc_ && in_share(doc_start_)) out.push_back(std::move(doc_));
    doc_ = Item{};
    open_doc_ = false;
  }

  const PartitionShare& share_;
  int64_t max_line_bytes_;
  size_t next_file_ = 0;
  int32_t file_ = -1;
  std::unique_ptr<LineStream> stream_;
  bool json_ = false, done_ = false, open_doc_ = false;
  int64_t base_ = 0, bytes_in_done_ = 0, doc_start_ = 0;
  Item doc_;
};

// Encodes one item; a malformed JSON line is reported in out.error (not thrown) so that the
// writer can skip it in input order.
void encode_item(const Item& item, bool json, const PreprocessOptions& o, const Tokenizer& tok, Encoded& out) {
  out.tokens.assign(o.json_keys.size(), {});
  out.lengths.assign(o.json_keys.size(), {});
  auto finish = [&](size_t k) {
    if (o.append_eod && !out.tokens[k].empty()) {
      out.tokens[k].push_back(tok.eod_id());
      out.lengths[k].back() += 1;
    }
  };
  if (!json) {
    tok.encode(item.text, out.tokens[0]);
    if (!out.tokens[0].empty()) out.lengths[0].push_back(static_cast<int32_t>(out.tokens[0].size()));
    finish(0);
    return;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(item.text);
  } catch (const nlohmann::json::exception& e) {
    out.error = std::string("not a JSON object: ") + e.what();
    return;
  }
  if (!j.is_object()) {
    out.error = "expected a JSON object, found " + std::string(j.type_name());
    return;
  }
  for (size_t k = 0; k < o.json_keys.size(); ++k) {
    auto it = j.find(o.json_keys[k]);
    if (it == j.end()) {
      out.error = "no key \"" + o.json_keys[k] + "\"";
      return;
    }
    std::vector<const std::string*> parts;
    if (it->is_string()) {
      parts.push_back(it->get_ptr<const std::string*>());
    } else if (it->is_array() && std::all_of(it->begin(), it->end(), [](const auto& v) { return v.is_string(); })) {
      for (const auto& v : *it) parts.push_back(v.get_ptr<const std::string*>());
    } else {
      out.error = "key \"" + o.json_keys[k] + "\" holds " + it->type_name() + ", expected a string or an array of strings";
      return;
    }
    for (const auto* p : parts) {
      const size_t before = out.tokens[k].size();
      tok.encode(*p, out.tokens[k]);
      const size_t n = out.tokens[k].size() - before;
      if (n > 0) out.lengths[k].push_back(static_cast<int32_t>(n));
    }
    finish(k);
  }
}

std::string parent_directory(const std::string& prefix) {
  const auto slash = prefix.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : prefix.substr(0, slash);
}

// The writers of one run: temporary files renamed into place by commit(), removed otherwise.
class Outputs {
 public:
  Outputs(const std::vector<std::string>& finals, DType dtype) : finals_(finals) {
    const std::string tag = ".partial-" + std::to_string(::getpid());
    for (const auto& f : finals) {
      temps_.push_back(f + tag);
      writers_.push_back(std::make_unique<IndexedDatasetWriter>(temps_.back(), dtype));
    }
  }
  ~Outputs() {
    if (committed_) return;
    for (auto& w : writers_) w->discard();
  }
  IndexedDatasetWriter& operator[](size_t k) { return *writers_[k]; }
  void commit() {
    for (auto& w : writers_) w->finalize();
    for (size_t k = 0; k < finals_.size(); ++k)
      for (auto path : {bin_path, idx_path})
        if (std::rename(path(temps_[k]).c_str(), path(finals_[k]).c_str()) != 0)
          throw std::runtime_error("preprocess: cannot rename '" + path(temps_[k]) + "' to '" + path(finals_[k]) + "'");
    committed_ = true;
  }

 private:
  std::vector<std::string> finals_, temps_;
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers_;
  bool committed_ = false;
};

std::vector<std::string> output_prefixes(const PreprocessOptions& o) {
  std::vector<std::string> out;
  for (const auto& key : o.json_keys) out.push_back(o.output_prefix + "_" + key + "_document");
  return out;
}

// An output that is one of the inputs (by device and inode: links and other spellings of the
// path count) would be replaced by the run that reads it.
void refuse_outputs_that_are_inputs(const std::vector<std::string>& inputs, const PreprocessOptions& o) {
  struct stat out_st{}, in_st{};
  for (const auto& prefix : output_prefixes(o))
    for (const auto& out : {bin_path(prefix), idx_path(prefix)}) {
      if (::stat(out.c_str(), &out_st) != 0) continue;  // not there yet: not an input
      for (const auto& in : inputs)
        if (::stat(in.c_str(), &in_st) == 0 && in_st.st_dev == out_st.st_dev && in_st.st_ino == out_st.st_ino)
          throw DataError("preprocess: --output-prefix '" + o.output_prefix + "' would write '" + out +
                          "', which is the input '" + in + "'; choose an output prefix that names no input");
    }
}

// The inputs, after checking the options that do not need the tokenizer.
std::vector<std::string> checked_inputs(const PreprocessOptions& o) {
  if (o.json_keys.empty()) throw DataError("preprocess: no JSON key given");
  if (o.workers < 1) throw DataError("preprocess: workers must be at least 1, got " + std::to_string(o.workers));
  if (o.max_line_bytes < 1) throw DataError("preprocess: --max-line-bytes must be at least 1, got " + std::to_string(o.max_line_bytes));
  if (o.skip_bad_lines < 0) throw DataError("preprocess: --skip-bad-lines must be >= 0, got " + std::to_string(o.skip_bad_lines));
  std::vector<std::string> files = expand_inputs(o.inputs);
  for (const auto& f : files)
    if (!input_kind(f).json && o.json_keys.size() != 1)
      throw DataError("preprocess: plain-text input '" + f + "' has one document stream; give one key, not " +
                      std::to_string(o.json_keys.size()));
  struct stat st{};
  const std::string out_dir = parent_directory(o.output_prefix);
  if (::stat(out_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw DataError("preprocess: --output-prefix '" + o.output_prefix + "': directory '" + out_dir + "' does not exist");
  refuse_outputs_that_are_inputs(files, o);
  return files;
}

int64_t file_bytes(const std::vector<std::string>& files) {
  int64_t total = 0;
  struct stat st{};
  for (const auto& f : files)
    if (::stat(f.c_str(), &st) == 0) total += static_cast<int64_t>(st.st_size);
  return total;
}

// Tokenizes `items` into `encoded` on o.workers threads while `reader` reads (and
// decompresses) the next chunk into `next`. A worker's failure is rethrown here; the reader's
// is returned, to be rethrown once this chunk is written.
struct NextChunk {
  bool have = false;
  std::exception_ptr failure;
};
NextChunk encode_while_reading(const std::vector<Item>& items, std::vector<Encoded>& encoded, CorpusReader& reader,
                               std::vector<Item>& next, size_t budget, const std::vector<std::string>& files,
                               const PreprocessOptions& o, const Tokenizer& tok) {
  encoded.assign(items.size(), {});
  const size_t nw = std::min<size_t>(static_cast<size_t>(o.workers), items.size());
  std::vector<std::exception_ptr> failures(nw);
  auto work = [&](size_t w) {
    try {
      for (size_t i = w; i < items.size(); i += nw)
        encode_item(items[i], input_kind(files[items[i].file]).json, o, tok, encoded[i]);
    } catch (...) {
      failures[w] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (size_t w = 0; w < nw; ++w) threads.emplace_back(work, w);
  NextChunk out;
  try {
    out.have = reader.read(next, budget);
  } catch (...) {
    out.failure = std::current_exception();
  }
  for (auto& t : threads) t.join();
  for (auto& f : failures)
    if (f) std::rethrow_exception(f);
  return out;
}

// Appends the encoded documents in input order; a malformed line is skipped and reported while
// o.skip_bad_lines allows, else DataError names it.
void write_chunk(const std::vector<Item>& items, const std::vector<Encoded>& encoded,
                 const std::vector<std::string>& files, const PreprocessOptions& o, Outputs& outputs,
                 PreprocessResult& r) {
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& e = encoded[i];
    if (!e.error.empty()) {
      PreprocessOptions::BadLine bad{files[items[i].file], items[i].line, e.error};
      const std::string where = "'" + bad.file + "' line " + std::to_string(bad.line) + ": " + bad.reason;
      if (static_cast<int64_t>(r.bad_lines.size()) >= o.skip_bad_lines)
        throw DataError(o.skip_bad_lines == 0
                            ? where + " (--skip-bad-lines N skips and reports up to N such lines)"
                            : where + " (more than --skip-bad-lines " + std::to_string(o.skip_bad_lines) +
                                  " malformed lines; the earlier ones were reported)");
      if (o.on_bad_line) o.on_bad_line(bad);
      r.bad_lines.push_back(std::move(bad));
      continue;
    }
    for (size_t k = 0; k < o.json_keys.size(); ++k) {
      outputs[k].add_document(e.tokens[k], e.lengths[k]);
      r.tokens += static_cast<int64_t>(e.tokens[k].size());
    }
    ++r.documents;
  }
}

}  // namespace

PreprocessResult preprocess(const PreprocessOptions& o) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const std::vector<std::string> files = checked_inputs(o);
  const auto tok = make_tokenizer(o.tokenizer);
  if (o.append_eod && tok->eod_id() < 0)
    throw DataError("preprocess: --append-eod but the tokenizer " + tok->description() + " has no end-of-document token");
  const PartitionShare share = partition_share(
      files, o.partition, [&](const std::vector<std::string>& f) { return decompressed_bytes(f, o.max_line_bytes); });
  const int64_t total_bytes = file_bytes(share.files);

  PreprocessResult r;
  r.output_prefixes = output_prefixes(o);
  Outputs outputs(r.output_prefixes, token_dtype_for_vocab(tok->vocab_size()));

  CorpusReader reader(share, o.max_line_bytes);
  std::vector<Item> items, next;
  std::vector<Encoded> encoded;
  const size_t budget = o.chunk_bytes * static_cast<size_t>(o.workers);
  bool have = reader.read(items, budget);
  while (have) {
    const auto e0 = clock::now();
    const NextChunk after = encode_while_reading(items, encoded, reader, next, budget, share.files, o, *tok);
    r.encode_seconds += std::chrono::duration<double>(clock::now() - e0).count();
    write_chunk(items, encoded, share.files, o, outputs, r);
    if (after.failure) std::rethrow_exception(after.failure);
    if (o.on_progress)
      o.on_progress({reader.bytes_in(), total_bytes, r.documents, r.tokens,
                     std::chrono::duration<double>(clock::now() - t0).count()});
    items.swap(next);
    have = after.have;
  }
  outputs.commit();
  r.bytes = reader.bytes();
  r.files = reader.files_opened();
  r.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return r;
}

}  // namespace loom::data
