// GPT samples against megatron-core: for the same files, split, sequence length, sample
// counts and seed, Loom must give the same indices and the same samples in the same order.
// Golden arrays come from tools/make_data_golden.py (megatron-core's GPTDataset/BlendedDataset);
// tests/python/test_data_megatron.py checks they are still what the live package produces.
#include <catch2/catch.hpp>

#include <cctype>
#include <cmath>

#include <nlohmann/json.hpp>

#include "data/blended_dataset.h"
#include "data/data_error.h"
#include "data/gpt_data_factory.h"
#include "data/gpt_dataset.h"
#include "data/npy.h"
#include "data_test_util.h"

using namespace loom::data;
using namespace loom::data::test;

namespace {

const char* kSplits[3] = {"train", "valid", "test"};

GptDataConfig config_for(const nlohmann::json& c, const std::string& cache) {
  GptDataConfig g;
  for (const auto& b : c["blend"]) {
    const auto s = b.get<std::string>();
    g.data_prefix.push_back(std::isdigit(static_cast<unsigned char>(s[0])) ? s : golden("mcore/" + s + "_text_document"));
  }
  g.splits_string = c["split"];
  g.seq_length = c["seq_length"];
  g.seed = c["seed"];
  g.eod_mask_loss = c["eod_mask_loss"];
  for (int i = 0; i < 3; ++i)
    if (!c["num_samples"][i].is_null()) g.num_samples[i] = c["num_samples"][i].get<int64_t>();
  g.index_cache_dir = cache;
  g.vocab_size = 50257;
  return g;
}

void check_case(const std::string& name, const std::string& cache, bool expect_cached) {
  INFO("case " << name);
  const std::string dir = golden("mcore/" + name + "/");
  const auto c = nlohmann::json::parse(read_bytes(dir + "config.json"));
  const auto ds = build_gpt_datasets(config_for(c, cache));
  const int64_t S = c["seq_length"];
  for (int i = 0; i < 3; ++i) {
    INFO("split " << kSplits[i]);
    const std::string pre = dir + kSplits[i] + "-";
    if (c["sizes"][i].is_null()) {
      CHECK(ds[i] == nullptr);
      continue;
    }
    REQUIRE(ds[i] != nullptr);
    CHECK(ds[i]->size() == c["sizes"][i].get<int64_t>());
    if (auto g = std::dynamic_pointer_cast<const GptDataset>(ds[i])) {
      CHECK(g->loaded_from_cache() == expect_cached);
      const auto& ix = g->indices();
      const auto doc = read_npy(pre + "document_index.npy");
      CHECK(std::vector<int64_t>(ix.document_index.begin(), ix.document_index.end()) == doc.data);
      CHECK(ix.sample_index == read_npy(pre + "sample_index.npy").data);
      CHECK(ix.shuffle_index == read_npy(pre + "shuffle_index.npy").data);
    } else {
      auto b = std::dynamic_pointer_cast<const BlendedDataset>(ds[i]);
      REQUIRE(b != nullptr);
      const auto& ix = b->indices();
      CHECK(std::vector<int64_t>(ix.dataset_index.begin(), ix.dataset_index.end()) ==
            read_npy(pre + "dataset_index.npy").data);
      CHECK(ix.dataset_sample_index == read_npy(pre + "dataset_sample_index.npy").data);
    }
    if (!c["store_text"].get<bool>()) continue;
    const auto text = read_npy(pre + "text.npy");
    const auto mask = read_npy(pre + "loss_mask.npy");
    REQUIRE(text.shape == std::vector<size_t>{static_cast<size_t>(ds[i]->size()), static_cast<size_t>(S + 1)});
    bool same_text = true, same_mask = true, same_tokens = true;
    for (int64_t k = 0; k < ds[i]->size(); ++k) {
      const auto t = ds[i]->text(k);
      const auto s = ds[i]->get(k);
      for (int64_t j = 0; j <= S; ++j) same_text &= t[j] == text.data[k * (S + 1) + j];
      for (int64_t j = 0; j < S; ++j) {
        same_tokens &= s.tokens[j] == t[j] && s.labels[j] == t[j + 1];
        same_mask &= static_cast<int64_t>(s.loss_mask[j]) == mask.data[k * S + j];
      }
    }
    CHECK(same_text);
    CHECK(same_tokens);
    CHECK(same_mask);
  }
}

const std::vector<std::string> kCases = {"single_multi_epoch", "epoch_exact", "epoch_minus_one", "epoch_plus_one",
                                         "three_epochs_joint_last", "one_epoch_none", "blend_30_70", "blend_0001_0999"};

}  // namespace

TEST_CASE("GPT samples equal megatron-core's (built, then from the index cache)", "[gpt][megatron]") {
  TempDir cache;
  for (const auto& name : kCases) check_case(name, cache.path, false);
  for (const auto& name : kCases) check_case(name, cache.path, true);
  CHECK_NOTHROW(check_case("single_multi_epoch", "", false));  // no cache at all
}

TEST_CASE("epoch boundary: exactly one epoch, one below, one above", "[gpt]") {
  auto data = std::make_shared<const IndexedDataset>(golden("mcore/corpus_a_text_document"));
  const int64_t n = static_cast<int64_t>(data->num_sequences());
  const int64_t S = 16;
  const int64_t per_epoch = (data->num_tokens() - 1) / S;
  auto build = [&](int64_t samples) {
    GptDatasetOptions o;
    o.seq_length = S;
    o.seed = 7;
    o.num_samples = samples;
    return GptDataset(data, Split::kTrain, {0, n}, o);
  };
  auto at = build(per_epoch);
  CHECK(at.indices().num_epochs == 1);
  CHECK(at.size() == per_epoch);
  auto below = build(per_epoch - 1);
  CHECK(below.indices().num_epochs == 1);
  CHECK(below.indices().shuffle_index == at.indices().shuffle_index);
  auto above = build(per_epoch + 1);
  CHECK(above.indices().num_epochs == 2);
  CHECK(above.indices().separate_final_epoch);
  CHECK(above.size() == (2 * data->num_tokens() - 1) / S);
  // With the last epoch separate, the first per_epoch shuffled ids stay within the first epoch.
  bool first_epoch_only = true;
  const int64_t sans_final = (data->num_tokens() - 1) / S;
  for (int64_t i = 0; i < sans_final; ++i) first_epoch_only &= above.indices().shuffle_index[i] < sans_final;
  CHECK(first_epoch_only);
  // Every sample reads S + 1 tokens and consecutive (unshuffled) samples overlap by one token.
  const auto& si = at.indices().sample_index;
  for (int64_t k = 0; k + 1 < at.size(); ++k) {
    const auto t = at.text(k);
    REQUIRE(t.size() == static_cast<size_t>(S + 1));
  }
  CHECK(si[0] == 0);
  CHECK(si[1] == 0);
}

TEST_CASE("blend 0.001/0.999 never indexes past a component", "[gpt][blend]") {
  GptDataConfig g;
  g.data_prefix = {"0.001", golden("mcore/corpus_a_text_document"), "0.999", golden("mcore/corpus_b_text_document")};
  g.splits_string = "1";
  g.seq_length = 16;
  g.seed = 11;
  for (int64_t n : {1, 2, 999, 1000, 1001, 2500}) {
    INFO("samples " << n);
    g.num_samples = {n, std::nullopt, std::nullopt};
    const auto ds = build_gpt_datasets(g);
    auto b = std::dynamic_pointer_cast<const BlendedDataset>(ds.train);
    REQUIRE(b);
    std::vector<int64_t> max_id(2, -1);
    for (size_t i = 0; i < b->indices().dataset_index.size(); ++i) {
      const int c = b->indices().dataset_index[i];
      max_id[c] = std::max(max_id[c], b->indices().dataset_sample_index[i]);
    }
    CHECK(b->size() == (int64_t)std::ceil(n * 0.001) + (int64_t)std::ceil(n * 0.999));
    CHECK_NOTHROW(b->get(b->size() - 1));
  }
  // Asking a component for more than it has is an error, not an out-of-bounds read.
  struct Tiny : SampleDataset {
    int64_t size() const override { return 1; }
    GptSample get(int64_t) const override { return {}; }
    std::vector<int64_t> text(int64_t) const override { return {}; }
  };
  auto tiny = std::make_shared<const Tiny>();
  CHECK_THROWS_WITH(BlendedDataset({tiny, tiny}, {0.5, 0.5}, 10), Catch::Contains("has only 1"));
}

TEST_CASE("blending picks the component with the largest sampling error", "[gpt][blend]") {
  const auto b = build_blending_indices({0.25, 0.75}, 8);
  CHECK(std::vector<int16_t>(b.dataset_index.begin(), b.dataset_index.end()) ==
        std::vector<int16_t>{1, 0, 1, 1, 0, 1, 1, 1});
  CHECK(b.dataset_sample_index == std::vector<int64_t>{0, 0, 1, 2, 1, 3, 4, 5});
}

TEST_CASE("split strings", "[gpt][split]") {
  auto m = parse_split("949,50,1");
  REQUIRE(m[0]);
  CHECK(m[0]->second == Approx(0.949));
  CHECK(split_range(m, Split::kValid, 1000) == std::make_pair<int64_t, int64_t>(949, 999));
  CHECK(split_range(m, Split::kTest, 1000) == std::make_pair<int64_t, int64_t>(999, 1000));
  auto two = parse_split("98,2");
  CHECK_FALSE(two[2].has_value());
  // Python's round() rounds half to even: 0.5 * 5 = 2.5 -> 2.
  CHECK(split_range(parse_split("1,1"), Split::kTrain, 5) == std::make_pair<int64_t, int64_t>(0, 2));
  CHECK_THROWS_WITH(parse_split("abc"), Catch::Contains("splits_string 'abc'"));
  CHECK_THROWS_WITH(parse_split("0,0,0"), Catch::Contains("sum to 0"));
  CHECK_THROWS_AS(parse_split("1,2,3,4"), DataError);
}

TEST_CASE("data_prefix lists", "[gpt]") {
  auto [p1, w1] = parse_data_prefix({"a"});
  CHECK(p1 == std::vector<std::string>{"a"});
  CHECK(w1.empty());
  auto [p2, w2] = parse_data_prefix({"0.3", "a", "0.7", " b "});
  CHECK(p2 == std::vector<std::string>{"a", "b"});
  CHECK(w2 == std::vector<double>{0.3, 0.7});
  auto [p3, w3] = parse_data_prefix({"a", "b"});
  CHECK(p3 == std::vector<std::string>{"a", "b"});
  CHECK_THROWS_AS(parse_data_prefix({}), DataError);
}

TEST_CASE("an empty split with samples requested is an error, not a hang", "[gpt][errors]") {
  GptDataConfig g;
  g.data_prefix = {golden("mcore/corpus_a_text_document")};
  g.splits_string = "949,50,1";  // 120 documents: the test split rounds to none
  g.seq_length = 8;
  g.num_samples = {10, 10, 10};
  CHECK_THROWS_WITH(build_gpt_datasets(g), Catch::Contains("0 tokens; a split needs at least 2"));
}

TEST_CASE("eod_mask_loss masks EOD inputs only", "[gpt]") {
  auto data = std::make_shared<const IndexedDataset>(golden("mcore/corpus_a_text_document"));
  GptDatasetOptions o;
  o.seq_length = 64;
  o.num_samples = 20;
  o.eod_mask_loss = true;
  GptDataset ds(data, Split::kTrain, {0, 50}, o);
  int masked = 0;
  for (int64_t k = 0; k < ds.size(); ++k) {
    const auto s = ds.get(k);
    for (size_t j = 0; j < s.tokens.size(); ++j) {
      CHECK((s.loss_mask[j] == 0.0f) == (s.tokens[j] == 50256));
      masked += s.loss_mask[j] == 0.0f;
    }
  }
  CHECK(masked > 0);
}
