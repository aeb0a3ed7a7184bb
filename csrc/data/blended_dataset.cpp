#include "data/blended_dataset.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "data/data_error.h"
#include "data/gpt_dataset.h"
#include "data/npy.h"

namespace loom::data {

BlendingIndices build_blending_indices(const std::vector<double>& weights, int64_t size) {
  BlendingIndices b;
  b.dataset_index.resize(static_cast<size_t>(size));
  b.dataset_sample_index.resize(static_cast<size_t>(size));
  std::vector<int64_t> current(weights.size(), 0);
  for (int64_t i = 0; i < size; ++i) {
    const double x = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_err = weights[0] * x - static_cast<double>(current[0]);
    for (size_t d = 1; d < weights.size(); ++d) {
      const double err = weights[d] * x - static_cast<double>(current[d]);
      if (err > best_err) {
        best_err = err;
        best = d;
      }
    }
    b.dataset_index[i] = static_cast<int16_t>(best);
    b.dataset_sample_index[i] = current[best]++;
  }
  return b;
}

std::string check_blending_indices(const std::vector<int64_t>& dataset_index,
                                   const std::vector<int64_t>& dataset_sample_index, size_t components,
                                   int64_t size) {
  if (dataset_index.size() != static_cast<size_t>(size) || dataset_sample_index.size() != static_cast<size_t>(size))
    return "expected " + std::to_string(size) + " entries, found " + std::to_string(dataset_index.size()) + " and " +
           std::to_string(dataset_sample_index.size());
  std::vector<int64_t> drawn(components, 0);
  for (size_t i = 0; i < dataset_index.size(); ++i) {
    const int64_t c = dataset_index[i];
    if (c < 0 || c >= static_cast<int64_t>(components))
      return "dataset_index[" + std::to_string(i) + "] = " + std::to_string(c) + " names no component (there are " +
             std::to_string(components) + ")";
    // build_blending_indices hands out each component's samples in order.
    if (dataset_sample_index[i] != drawn[static_cast<size_t>(c)]++)
      return "dataset_sample_index[" + std::to_string(i) + "] = " + std::to_string(dataset_sample_index[i]) +
             ", expected " + std::to_string(drawn[static_cast<size_t>(c)] - 1) + " (component " + std::to_string(c) +
             "'s next sample)";
  }
  return "";
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> datasets, std::vector<double> weights,
                               int64_t size, const std::string& description, const std::string& cache_dir)
    : datasets_(std::move(datasets)), weights_(std::move(weights)) {
  if (datasets_.empty() || datasets_.size() != weights_.size() || datasets_.size() >= 32767)
    throw DataError("blended dataset: need 1 to 32766 datasets with one weight each, got " +
                    std::to_string(datasets_.size()) + " datasets and " + std::to_string(weights_.size()) + " weights");
  double sum = 0;
  for (double w : weights_) {
    if (!(w > 0)) throw DataError("blended dataset: weights must be positive, got " + std::to_string(w));
    sum += w;
  }
  for (double& w : weights_) w /= sum;
  if (size < 0) throw DataError("blended dataset: negative size");

  std::ostringstream d;
  d << "{\"class\": \"BlendedDataset\", \"datasets\": [" << description << "], \"weights\": [";
  char buf[32];
  for (size_t i = 0; i < weights_.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%.17g", weights_[i]);
    d << (i ? ", " : "") << buf;
  }
  d << "], \"size\": " << size << "}\n";
  const std::string desc = d.str();
  std::string base;
  bool loaded = false;
  if (!cache_dir.empty()) {
    base = cache_dir + "/" + fnv1a_hex(desc) + "-BlendedDataset-";
    std::ifstream in(base + "description.txt", std::ios::binary);
    std::stringstream ss;
    if (in) ss << in.rdbuf();
    if (in && ss.str() == desc) {
      // Derived data: a cache entry that cannot be these indices is rebuilt, never trusted.
      std::string problem;
      try {
        auto di = read_npy(base + "dataset_index.npy"), si = read_npy(base + "dataset_sample_index.npy");
        problem = check_blending_indices(di.data, si.data, datasets_.size(), size);
        if (problem.empty()) {
          indices_.dataset_index.assign(di.data.begin(), di.data.end());
          indices_.dataset_sample_index = std::move(si.data);
          loaded = true;
        }
      } catch (const DataError& e) {
        problem = e.what();
      }
      if (!loaded) cache_warning_ = "index cache '" + base + "*' is damaged (" + problem + "): rebuilt it";
    }
  }
  if (!loaded) indices_ = build_blending_indices(weights_, size);

  // Never index past a component (megatron-core raises IndexError here).
  std::vector<int64_t> drawn(datasets_.size(), 0);
  for (int16_t c : indices_.dataset_index) ++drawn[c];
  for (size_t c = 0; c < datasets_.size(); ++c)
    if (drawn[c] > datasets_[c]->size())
      throw DataError("blended dataset: the blend draws " + std::to_string(drawn[c]) + " samples from component " +
                      std::to_string(c) + " (weight " + std::to_string(weights_[c]) + ") which has only " +
                      std::to_string(datasets_[c]->size()) + "; request more samples from the component");

  if (!cache_dir.empty() && !loaded) {
    std::vector<int64_t> di(indices_.dataset_index.begin(), indices_.dataset_index.end());
    write_npy(base + "dataset_index.npy", di, {di.size()}, "<i2");
    write_npy(base + "dataset_sample_index.npy", indices_.dataset_sample_index, {di.size()}, "<i8");
    const std::string tmp = base + "description.txt.tmp." + std::to_string(::getpid());
    { std::ofstream(tmp, std::ios::binary) << desc; }
    if (std::rename(tmp.c_str(), (base + "description.txt").c_str()) != 0)
      throw std::runtime_error("cannot write '" + base + "description.txt': " + std::strerror(errno));
  }
}

void BlendedDataset::check(int64_t id) const {
  if (id < 0 || id >= size())
    throw std::out_of_range("blended dataset: sample " + std::to_string(id) + " out of range [0, " + std::to_string(size()) + ")");
}

GptSample BlendedDataset::get(int64_t id) const {
  check(id);
  const int16_t c = indices_.dataset_index[id];
  GptSample s = datasets_[c]->get(indices_.dataset_sample_index[id]);
  s.dataset_id = c;
  return s;
}

std::vector<int64_t> BlendedDataset::text(int64_t id) const {
  check(id);
  return datasets_[indices_.dataset_index[id]]->text(indices_.dataset_sample_index[id]);
}

}  // namespace loom::data
