#include "data/gpt_dataset.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "data/data_error.h"
#include "data/npy.h"

namespace loom::data {
namespace {

constexpr int64_t kPad = -1;  // megatron_dataset.py _PAD_TOKEN_ID (GPT-2 has no pad token)

bool file_exists(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0;
}

void make_dirs(const std::string& dir) {
  std::string cur;
  std::stringstream ss(dir);
  std::string part;
  if (!dir.empty() && dir[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      throw std::runtime_error("cannot create index cache directory '" + cur + "': " + std::strerror(errno));
  }
}

std::string read_text(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int64_t> widen(const std::vector<int32_t>& v) { return {v.begin(), v.end()}; }

std::string fits_i4(const std::vector<int64_t>& v) {
  for (int64_t x : v)
    if (x < INT32_MIN || x > INT32_MAX) return "<i8";
  return "<i4";
}

}  // namespace

std::string fnv1a_hex(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

bool GptDataset::load_cache(const std::string& base, std::pair<int64_t, int64_t> range, const GptIndexParams& p) {
  const std::string desc = base + "description.txt", doc = base + "document_index.npy",
                    smp = base + "sample_index.npy", shf = base + "shuffle_index.npy";
  if (!(file_exists(desc) && file_exists(doc) && file_exists(smp) && file_exists(shf) && read_text(desc) == description_))
    return false;
  // The cache is derived data: one that cannot be these indices (a damaged disk, an edited
  // file) is rebuilt, never trusted; the warning names it.
  std::string problem;
  try {
    auto a = read_npy(doc), b = read_npy(smp), c = read_npy(shf);
    if (a.shape.size() != 1) problem = doc + ": expected a 1-D array";
    else if (b.shape.size() != 2 || b.shape[1] != 2) problem = smp + ": expected an array of shape (N, 2)";
    else if (c.shape.size() != 1) problem = shf + ": expected a 1-D array";
    GptIndices loaded;
    if (problem.empty()) {
      for (int64_t v : a.data) {
        if (v < INT32_MIN || v > INT32_MAX) {
          problem = doc + ": a value does not fit int32";
          break;
        }
      }
    }
    if (problem.empty()) {
      loaded.document_index.assign(a.data.begin(), a.data.end());
      loaded.sample_index = std::move(b.data);
      loaded.shuffle_index = std::move(c.data);
      const std::string why = check_gpt_indices(loaded, data_->sequence_lengths(), range.first, range.second, p);
      if (why.empty()) {
        indices_ = std::move(loaded);
        from_cache_ = true;
        return true;
      }
      problem = base + "*.npy: " + why;
    }
  } catch (const DataError& e) {
    problem = e.what();
  }
  cache_warning_ = "index cache '" + base + "*' is damaged (" + problem + "): rebuilt it";
  return false;
}

GptDataset::GptDataset(std::shared_ptr<const IndexedDataset> data, Split split, std::pair<int64_t, int64_t> range,
                       const GptDatasetOptions& options)
    : data_(std::move(data)), split_(split), options_(options) {
  if (range.first < 0 || range.second > static_cast<int64_t>(data_->num_sequences()) || range.first > range.second)
    throw DataError("GPT dataset '" + data_->prefix() + "': sequence range [" + std::to_string(range.first) + ", " +
                    std::to_string(range.second) + ") outside [0, " + std::to_string(data_->num_sequences()) + ")");
  GptIndexParams p;
  p.seq_length = options.seq_length;
  p.seed = options.seed;
  p.num_samples = options.num_samples;
  p.drop_last_partial_sequence = split == Split::kValid ? options.drop_last_partial_validation_sequence : true;
  p.add_extra_token = true;

  std::ostringstream d;
  d << "{\n  \"class\": \"GPTDataset\",\n  \"dataset_path\": \"" << data_->prefix() << "\",\n"
    << "  \"num_sequences\": " << data_->num_sequences() << ",\n  \"num_tokens\": " << data_->num_tokens() << ",\n"
    << "  \"index_split\": \"" << split_name(split) << "\",\n  \"sequence_range\": [" << range.first << ", " << range.second
    << "],\n  \"num_samples\": " << (p.num_samples ? std::to_string(*p.num_samples) : "null") << ",\n"
    << "  \"random_seed\": " << p.seed << ",\n  \"sequence_length\": " << p.seq_length << ",\n"
    << "  \"drop_last_partial_sequence\": " << (p.drop_last_partial_sequence ? "true" : "false") << "\n}\n";
  description_ = d.str();

  std::string base;
  if (!options.cache_dir.empty()) {
    base = options.cache_dir + "/" + fnv1a_hex(description_) + "-GPTDataset-" + split_name(split) + "-";
    if (load_cache(base, range, p)) return;
  }
  indices_ = build_gpt_indices(data_->sequence_lengths(), range.first, range.second, p);
  if (!base.empty()) {
    make_dirs(options.cache_dir);
    const auto& ix = indices_;
    write_npy(base + "document_index.npy", widen(ix.document_index), {ix.document_index.size()}, "<i4");
    write_npy(base + "sample_index.npy", ix.sample_index, {ix.sample_index.size() / 2, 2}, fits_i4(ix.sample_index));
    write_npy(base + "shuffle_index.npy", ix.shuffle_index, {ix.shuffle_index.size()}, fits_i4(ix.shuffle_index));
    // The description goes last: its presence marks a complete cache entry.
    const std::string tmp = base + "description.txt.tmp." + std::to_string(::getpid());
    { std::ofstream(tmp, std::ios::binary) << description_; }
    if (std::rename(tmp.c_str(), (base + "description.txt").c_str()) != 0)
      throw std::runtime_error("cannot write index cache description '" + base + "description.txt': " + std::strerror(errno));
  }
}

std::vector<int64_t> GptDataset::text(int64_t id) const {
  if (id < 0 || id >= size())
    throw std::out_of_range("GPT dataset '" + data_->prefix() + "' (" + split_name(split_) + "): sample " +
                            std::to_string(id) + " out of range [0, " + std::to_string(size()) + ")");
  const int64_t s = indices_.shuffle_index[id];
  const int64_t beg = indices_.sample_index[2 * s], beg_off = indices_.sample_index[2 * s + 1];
  const int64_t end = indices_.sample_index[2 * s + 2], end_off = indices_.sample_index[2 * s + 3];
  const auto& doc = indices_.document_index;
  std::vector<int64_t> out;
  out.reserve(options_.seq_length + 1);
  if (beg == end) {
    data_->read(doc[beg], beg_off, end_off - beg_off + 1, out);
  } else {
    for (int64_t i = beg; i <= end; ++i) {
      const size_t off = i == beg ? beg_off : 0;
      std::optional<size_t> len;
      if (i == end) len = end_off + 1;
      data_->read(doc[i], off, len, out);
    }
  }
  if (static_cast<int64_t>(out.size()) < options_.seq_length + 1) out.resize(options_.seq_length + 1, kPad);
  return out;
}

GptSample GptDataset::get(int64_t id) const {
  const auto t = text(id);
  const size_t S = static_cast<size_t>(options_.seq_length);
  GptSample s;
  s.tokens.assign(t.begin(), t.begin() + S);
  s.labels.assign(t.begin() + 1, t.begin() + S + 1);
  s.loss_mask.assign(S, 1.0f);
  for (size_t i = 0; i < S; ++i) {
    if (options_.eod_mask_loss && s.tokens[i] == options_.eod_id) s.loss_mask[i] = 0.0f;
    if (s.labels[i] == kPad) s.loss_mask[i] = 0.0f;
    if (s.tokens[i] == kPad) s.tokens[i] = 0;
    if (s.labels[i] == kPad) s.labels[i] = 0;
  }
  return s;
}

}  // namespace loom::data
