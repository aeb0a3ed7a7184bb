// Shards are read in place (train/mapped_shard.h): read_checkpoint_shard returns exactly what
// torch::pickle_load of the file's bytes holds, tensor for tensor; the inference read
// (ShardParts::kModel) leaves out the optimizer state yet still checks the whole file's hash;
// writing to a loaded tensor never reaches the file; loaded tensors outlive the reader. A stage
// built without initial values (load_stage) and filled equals one built as training builds it.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "generate/checkpoint_reader.h"
#include "generate/model_loader.h"
#include "generate_test_util.h"

using namespace loom;
using namespace loom::generate;
using namespace loom::generate::test;
namespace fs = std::filesystem;

namespace {

const std::string kShard = "mp_rank_00/model_optim_rng.pt";

// A t=1 checkpoint of the truth model with two fp32 moments per parameter, as a training run
// writes them: most of the file is optimizer state.
std::string save_with_optimizer(const std::string& dir) {
  auto groups = runtime::ProcessGroups::single_process();
  const model::GptConfig config = tiny_config();
  model::GptStage stage(config, groups->tensor_ptr());
  set_truth(stage, 0, 1);
  train::RankCheckpoint state;
  for (const auto& p : stage.parameters()) {
    state.model[p.name] = p.tensor.detach().clone();
    state.shard_info[p.name] = {{"global_shape", p.tensor.sizes().vec()},
                                {"offset", std::vector<int64_t>(p.tensor.dim(), 0)}};
    state.optimizer["exp_avg." + p.name] = model::full_normal(11, p.name, p.tensor.sizes().vec(), 1.0);
    state.optimizer["exp_avg_sq." + p.name] = model::full_normal(12, p.name, p.tensor.sizes().vec(), 1.0).abs();
  }
  state.values = {{"iteration", 5}, {"optimizer", {{"step", 5}}}};
  train::CheckpointLayout layout;
  layout.model_shape = config;
  train::save_checkpoint(dir, 5, layout, state, *groups);
  return dir;
}

// The file's tensors as torch::pickle_load reads them (copies), name -> tensor per dictionary.
std::map<std::string, std::map<std::string, at::Tensor>> reference(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto top = torch::pickle_load(bytes).toGenericDict();
  std::map<std::string, std::map<std::string, at::Tensor>> out;
  for (const char* part : {"model", "optimizer"})
    for (const auto& e : top.at(part).toGenericDict()) out[part][e.key().toStringRef()] = e.value().toTensor();
  return out;
}

// "" when `got` holds exactly `want`'s tensors (names, dtypes, shapes, bits), else the first difference.
std::string first_difference(const std::map<std::string, at::Tensor>& got,
                             const std::map<std::string, at::Tensor>& want) {
  if (got.size() != want.size()) return fmt::format("{} tensors, expected {}", got.size(), want.size());
  for (const auto& [name, w] : want) {
    const auto it = got.find(name);
    if (it == got.end()) return "no " + name;
    if (it->second.scalar_type() != w.scalar_type() || !at::equal(it->second, w)) return name;
  }
  return "";
}

struct TempDir {
  std::string path = temp_dir("in_place");
  ~TempDir() {
    try {
      launch::remove_tree(path);
    } catch (const std::exception&) {
    }
  }
};

}  // namespace

TEST_CASE("a shard read in place holds what torch::pickle_load reads, optimizer state only when asked") {
  const TempDir tmp;
  const std::string dir = save_with_optimizer(tmp.path + "/run");
  const std::string file = dir + "/iter_0000005/" + kShard;
  const auto want = reference(file);
  REQUIRE(want.at("optimizer").size() == 2 * want.at("model").size());
  const nlohmann::json metadata = train::read_checkpoint_metadata(dir, 5);

  const train::RankCheckpoint all = train::read_checkpoint_shard(dir, 5, kShard, metadata);
  CHECK(first_difference(all.model, want.at("model")) == "");
  CHECK(first_difference(all.optimizer, want.at("optimizer")) == "");
  CHECK(all.values.at("optimizer").at("step") == 5);

  const train::RankCheckpoint model_only =
      train::read_checkpoint_shard(dir, 5, kShard, metadata, train::ShardParts::kModel);
  CHECK(first_difference(model_only.model, want.at("model")) == "");
  CHECK(model_only.optimizer.empty());
  CHECK(model_only.shard_info == all.shard_info);
  CHECK(model_only.values == all.values);

  // The whole-model read merges the one shard without copying and equals it too.
  const FullCheckpoint full = read_full_checkpoint(dir, read_checkpoint_info(dir));
  CHECK(first_difference(full.params, want.at("model")) == "");
}

TEST_CASE("loaded tensors are private: writes never reach the file, and they outlive the reader") {
  const TempDir tmp;
  const std::string dir = save_with_optimizer(tmp.path + "/run");
  const std::string file = dir + "/iter_0000005/" + kShard;
  const nlohmann::json metadata = train::read_checkpoint_metadata(dir, 5);
  const auto want = reference(file);
  at::Tensor kept;
  {
    train::RankCheckpoint state = train::read_checkpoint_shard(dir, 5, kShard, metadata);
    for (auto& [name, t] : state.model) t.fill_(0.0);  // copy-on-write pages of the mapping
    kept = state.optimizer.begin()->second;
  }
  CHECK(at::equal(kept, want.at("optimizer").begin()->second));
  // The file is unchanged: it still hashes to its record and reads as before.
  const train::RankCheckpoint again = train::read_checkpoint_shard(dir, 5, kShard, metadata);
  CHECK(first_difference(again.model, want.at("model")) == "");
}

TEST_CASE("the inference read checks the whole file: damaged optimizer state refuses the shard") {
  const TempDir tmp;
  const std::string dir = save_with_optimizer(tmp.path + "/run");
  const std::string file = dir + "/iter_0000005/" + kShard;
  const auto size = fs::file_size(file);
  {
    // 7/8 into the file: inside the optimizer's records, which kModel does not return.
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(size * 7 / 8));
    const char c = static_cast<char>(f.get());
    f.seekp(static_cast<std::streamoff>(size * 7 / 8));
    f.put(static_cast<char>(~c));
  }
  const nlohmann::json metadata = train::read_checkpoint_metadata(dir, 5);
  CHECK_THROWS_WITH(train::read_checkpoint_shard(dir, 5, kShard, metadata, train::ShardParts::kModel),
                    Catch::Contains(file) && Catch::Contains("corrupt"));
  CHECK_THROWS_WITH(read_full_checkpoint(dir, read_checkpoint_info(dir)),
                    Catch::Contains(file) && Catch::Contains("corrupt"));
}

TEST_CASE("a stage loaded without initial values equals a trained-path stage filled alike") {
  const TempDir tmp;
  const std::string dir = save_with_optimizer(tmp.path + "/run");
  const FullCheckpoint full = read_full_checkpoint(dir, read_checkpoint_info(dir));
  const model::GptConfig config = inference_config(full.info.layout.model_shape);
  const auto tp = runtime::Communicator::solo();
  model::GptStage drawn(config, tp);  // initial values drawn, as training builds it
  fill_stage_parameters(full, drawn, 0, 1);
  std::set<std::string> used;
  const model::GptStage loaded = load_stage(full, config, tp, model::StageChunk{}, at::kCPU, 0, 1, &used);
  CHECK(used.size() == full.params.size());
  const auto a = drawn.parameters(), b = loaded.parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].name);
    CHECK(a[i].name == b[i].name);
    CHECK(b[i].tensor.requires_grad());
    CHECK(b[i].tensor.scalar_type() == a[i].tensor.scalar_type());
    CHECK(at::equal(a[i].tensor, b[i].tensor));
  }
}
