// The bytes of one checkpoint shard and the metadata.json of an iteration (train/checkpoint.h
// describes both), for writers that are not a training run: save_checkpoint writes through
// them, and `loom convert` writes the shards of another layout offline with them.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

#include "train/checkpoint.h"

namespace loom::train {

/// The torch.save-compatible pickle of `state` as mp_rank_TT[_PPP]/model_optim_rng.pt holds it.
std::vector<char> serialize_rank_checkpoint(const RankCheckpoint& state, int64_t iteration);

/// The "files" record of one shard: {"bytes", "fnv1a64"} of `bytes`.
nlohmann::json shard_file_record(const std::vector<char>& bytes);

/// metadata.json of iteration `iteration` at `layout` listing `files`
/// ({"mp_rank_TT[_PPP]/model_optim_rng.pt": shard_file_record}).
nlohmann::json checkpoint_metadata(int64_t iteration, const CheckpointLayout& layout, const nlohmann::json& files);

}  // namespace loom::train
