#include "data/gpt_data_factory.h"

#include <array>
#include <cmath>
#include <optional>
#include <tuple>

#include "data/blended_dataset.h"
#include "data/data_error.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/split.h"

namespace loom::data {

std::pair<std::vector<std::string>, std::vector<double>> parse_data_prefix(const std::vector<std::string>& list) {
  if (list.empty()) throw DataError("data_prefix: empty; expected paths, or weight, path, weight, path, ...");
  std::vector<std::string> prefixes;
  std::vector<double> weights;
  bool weighted = list.size() % 2 == 0;
  if (weighted) {
    for (size_t i = 0; i < list.size() && weighted; i += 2) {
      size_t used = 0;
      try {
        const double w = std::stod(list[i], &used);
        if (used != list[i].size()) weighted = false;
        else weights.push_back(w);
      } catch (const std::exception&) {
        weighted = false;
      }
    }
  }
  if (!weighted) {
    weights.clear();
    for (const auto& p : list) prefixes.push_back(p);
  } else {
    for (size_t i = 1; i < list.size(); i += 2) prefixes.push_back(list[i]);
    for (double w : weights)
      if (!(w >= 0)) throw DataError("data_prefix: weight " + std::to_string(w) + " is negative");
  }
  for (auto& p : prefixes) {
    const auto a = p.find_first_not_of(" \t"), b = p.find_last_not_of(" \t");
    p = a == std::string::npos ? "" : p.substr(a, b - a + 1);
    if (p.empty()) throw DataError("data_prefix: empty path");
  }
  return {prefixes, weights};
}

namespace {

// Megatron's BlendedMegatronDatasetBuilder, one split at a time: the low-level datasets (one
// per prefix), their mid-level GPT datasets over the split's document range, and the blend.
class GptDatasetBuilder {
 public:
  explicit GptDatasetBuilder(const GptDataConfig& c) : c_(c), matrix_(parse_split(c.splits_string)) {
    std::tie(prefixes_, weights_) = parse_data_prefix(c.data_prefix);
    normalize_weights();
    // Each split's datasets take these with their own num_samples.
    base_ = {c.seq_length, c.seed, /*num_samples=*/std::nullopt, c.eod_mask_loss, c.eod_id,
             c.drop_last_partial_validation_sequence, c.index_cache_dir};
    for (const auto& p : prefixes_) {
      auto ds = std::make_shared<const IndexedDataset>(p);
      if (c.vocab_size > 0) ds->check_token_range(c.vocab_size);
      low_.push_back(std::move(ds));
    }
  }

  GptDatasets build() {
    std::array<std::shared_ptr<const SampleDataset>, 3> res;
    for (int i = 0; i < 3; ++i) {
      if (!matrix_[i]) continue;
      const auto split = static_cast<Split>(i);
      if (prefixes_.size() == 1 && weights_.empty()) res[i] = mid_level(0, split, c_.num_samples[i]);
      else if (!weights_.empty()) res[i] = blend_by_weights(split, c_.num_samples[i]);
      else res[i] = blend_by_sizes(split, c_.num_samples[i]);
    }
    out_.train = res[0];
    out_.valid = res[1];
    out_.test = res[2];
    return std::move(out_);
  }

 private:
  void normalize_weights() {
    if (weights_.empty()) return;
    double sum = 0;
    for (double w : weights_) sum += w;
    if (!(sum > 0)) throw DataError("data_prefix: the weights sum to 0");
    for (double& w : weights_) w /= sum;
  }

  // The GPT dataset of prefix d over `split`'s documents, `n` samples (nullopt: one epoch).
  std::shared_ptr<const GptDataset> mid_level(size_t d, Split split, std::optional<int64_t> n) {
    GptDatasetOptions o = base_;
    o.num_samples = n;
    const auto range = split_range(matrix_, split, low_[d]->num_sequences());
    const int64_t tokens = tokens_per_epoch(low_[d]->sequence_lengths(), range.first, range.second);
    if (tokens < 2)
      throw DataError("splits_string \"" + c_.splits_string + "\" gives the " + split_name(split) + " split of '" +
                      low_[d]->prefix() + "' sequences [" + std::to_string(range.first) + ", " +
                      std::to_string(range.second) + ") of " + std::to_string(low_[d]->num_sequences()) + ", " +
                      std::to_string(tokens) + " tokens; a split needs at least 2 (give the " + split_name(split) +
                      " split a larger share, or 0 for none)");
    auto g = std::make_shared<const GptDataset>(low_[d], split, range, o);
    if (!g->cache_warning().empty()) out_.warnings.push_back(g->cache_warning());
    return g;
  }

  // Weighted blend: each prefix gets ceil(n * w) samples, built with the surplus on top
  // (Megatron's _get_size_per_split_per_dataset).
  std::shared_ptr<const SampleDataset> blend_by_weights(Split split, std::optional<int64_t> size) {
    if (!size)
      throw DataError(std::string("data_prefix has weights, so the ") + split_name(split) + " split needs a sample count");
    Components parts;
    int64_t blended_size = 0;
    for (size_t d = 0; d < prefixes_.size(); ++d) {
      const double target = std::ceil(static_cast<double>(*size) * weights_[d]);
      const auto buffered = static_cast<int64_t>(std::ceil(target * (1.0 + c_.mid_level_dataset_surplus)));
      blended_size += static_cast<int64_t>(target);
      parts.add(mid_level(d, split, buffered));
    }
    parts.weights = weights_;
    return blend(std::move(parts), blended_size);
  }

  // Unweighted blend of several prefixes: each one epoch, weighted by its size.
  std::shared_ptr<const SampleDataset> blend_by_sizes(Split split, std::optional<int64_t> size) {
    if (!size)
      throw DataError(std::string("blending several data_prefix paths without weights needs a sample count for the ") +
                      split_name(split) + " split");
    Components parts;
    int64_t total = 0;
    for (size_t d = 0; d < prefixes_.size(); ++d) {
      auto g = mid_level(d, split, std::nullopt);
      parts.weights.push_back(static_cast<double>(g->size()));
      total += g->size();
      parts.add(std::move(g));
    }
    return blend(std::move(parts), std::min(*size, total));
  }

  struct Components {
    std::vector<std::shared_ptr<const SampleDataset>> datasets;
    std::vector<double> weights;
    std::string description;
    void add(std::shared_ptr<const GptDataset> g) {
      description += (datasets.empty() ? "" : ", ") + g->description();
      datasets.push_back(std::move(g));
    }
  };

  std::shared_ptr<const SampleDataset> blend(Components parts, int64_t size) {
    auto b = std::make_shared<const BlendedDataset>(std::move(parts.datasets), parts.weights, size, parts.description,
                                                    c_.index_cache_dir);
    if (!b->cache_warning().empty()) out_.warnings.push_back(b->cache_warning());
    return b;
  }

  const GptDataConfig& c_;
  SplitMatrix matrix_;
  std::vector<std::string> prefixes_;
  std::vector<double> weights_;
  GptDatasetOptions base_;
  std::vector<std::shared_ptr<const IndexedDataset>> low_;
  GptDatasets out_;
};

}  // namespace

GptDatasets build_gpt_datasets(const GptDataConfig& c) { return GptDatasetBuilder(c).build(); }

}  // namespace loom::data
