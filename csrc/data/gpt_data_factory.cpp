#include "data/gpt_data_factory.h"

#include <cmath>

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

GptDatasets build_gpt_datasets(const GptDataConfig& c) {
  auto [prefixes, weights] = parse_data_prefix(c.data_prefix);
  const SplitMatrix matrix = parse_split(c.splits_string);
  if (!weights.empty()) {
    double sum = 0;
    for (double w : weights) sum += w;
    if (!(sum > 0)) throw DataError("data_prefix: the weights sum to 0");
    for (double& w : weights) w /= sum;
  }

  GptDatasetOptions base;
  base.seq_length = c.seq_length;
  base.seed = c.seed;
  base.eod_mask_loss = c.eod_mask_loss;
  base.eod_id = c.eod_id;
  base.cache_dir = c.index_cache_dir;
  base.drop_last_partial_validation_sequence = c.drop_last_partial_validation_sequence;

  std::vector<std::shared_ptr<const IndexedDataset>> low;
  for (const auto& p : prefixes) {
    auto ds = std::make_shared<const IndexedDataset>(p);
    if (c.vocab_size > 0) ds->check_token_range(c.vocab_size);
    low.push_back(std::move(ds));
  }

  GptDatasets out;
  auto mid = [&](size_t d, int split, std::optional<int64_t> n) -> std::shared_ptr<const GptDataset> {
    GptDatasetOptions o = base;
    o.num_samples = n;
    const auto s = static_cast<Split>(split);
    const auto range = split_range(matrix, s, low[d]->num_sequences());
    const int64_t tokens = tokens_per_epoch(low[d]->sequence_lengths(), range.first, range.second);
    if (tokens < 2)
      throw DataError("splits_string \"" + c.splits_string + "\" gives the " + split_name(s) + " split of '" +
                      low[d]->prefix() + "' sequences [" + std::to_string(range.first) + ", " +
                      std::to_string(range.second) + ") of " + std::to_string(low[d]->num_sequences()) + ", " +
                      std::to_string(tokens) + " tokens; a split needs at least 2 (give the " + split_name(s) +
                      " split a larger share, or 0 for none)");
    auto g = std::make_shared<const GptDataset>(low[d], s, range, o);
    if (!g->cache_warning().empty()) out.warnings.push_back(g->cache_warning());
    return g;
  };

  std::array<std::shared_ptr<const SampleDataset>, 3> res;
  for (int i = 0; i < 3; ++i) {
    if (!matrix[i]) continue;
    const auto size = c.num_samples[i];
    if (prefixes.size() == 1 && weights.empty()) {
      res[i] = mid(0, i, size);
      continue;
    }
    std::vector<std::shared_ptr<const SampleDataset>> comps;
    std::vector<double> wi;
    std::string desc;
    int64_t blended_size = 0;
    if (!weights.empty()) {
      if (!size)
        throw DataError(std::string("data_prefix has weights, so the ") + split_name(static_cast<Split>(i)) +
                        " split needs a sample count");
      for (size_t d = 0; d < prefixes.size(); ++d) {
        // _get_size_per_split_per_dataset: target ceil(n * w), built with the surplus on top.
        const double target = std::ceil(static_cast<double>(*size) * weights[d]);
        const auto buffered = static_cast<int64_t>(std::ceil(target * (1.0 + c.mid_level_dataset_surplus)));
        blended_size += static_cast<int64_t>(target);
        auto g = mid(d, i, buffered);
        desc += (d ? ", " : "") + g->description();
        comps.push_back(std::move(g));
      }
      wi = weights;
    } else {
      if (!size)
        throw DataError(std::string("blending several data_prefix paths without weights needs a sample count for the ") +
                        split_name(static_cast<Split>(i)) + " split");
      int64_t total = 0;
      for (size_t d = 0; d < prefixes.size(); ++d) {
        auto g = mid(d, i, std::nullopt);
        desc += (d ? ", " : "") + g->description();
        wi.push_back(static_cast<double>(g->size()));
        total += g->size();
        comps.push_back(std::move(g));
      }
      blended_size = std::min(*size, total);
    }
    auto blend = std::make_shared<const BlendedDataset>(std::move(comps), wi, blended_size, desc, c.index_cache_dir);
    if (!blend->cache_warning().empty()) out.warnings.push_back(blend->cache_warning());
    res[i] = std::move(blend);
  }
  out.train = res[0];
  out.valid = res[1];
  out.test = res[2];
  return out;
}

}  // namespace loom::data
