#include "serve/kv_block_pool.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace loom::serve {

namespace {

// splitmix64's finalizer: a fixed, well-mixing step (the hash must be the same on every rank
// and every run, which std::hash does not promise).
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

uint64_t combine(uint64_t h, uint64_t v) { return mix(h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2))); }

}  // namespace

uint64_t block_hash(uint64_t parent, const int64_t* tokens, int64_t count, int64_t extra) {
  uint64_t h = combine(mix(parent), static_cast<uint64_t>(extra));
  h = combine(h, static_cast<uint64_t>(count));
  for (int64_t i = 0; i < count; ++i) h = combine(h, static_cast<uint64_t>(tokens[i]));
  return h;
}

KvBlockPool::KvBlockPool(int64_t num_blocks, int64_t block_size, bool prefix_caching)
    : block_size_(block_size), prefix_caching_(prefix_caching) {
  if (num_blocks < 1)
    throw std::invalid_argument("KvBlockPool: num_blocks must be >= 1, found " + std::to_string(num_blocks));
  if (block_size < 1)
    throw std::invalid_argument("KvBlockPool: block_size must be >= 1, found " + std::to_string(block_size));
  blocks_.resize(static_cast<size_t>(num_blocks));
  for (int64_t b = 0; b < num_blocks; ++b) at(b).in_free = free_.insert(free_.end(), b);
}

KvBlockPool::Block& KvBlockPool::at(int64_t block) {
  if (block < 0 || block >= num_blocks())
    throw std::out_of_range("KvBlockPool: block " + std::to_string(block) + " is outside [0, " +
                            std::to_string(num_blocks()) + ")");
  return blocks_[static_cast<size_t>(block)];
}

const KvBlockPool::Block& KvBlockPool::at(int64_t block) const {
  return const_cast<KvBlockPool*>(this)->at(block);
}

int KvBlockPool::ref_count(int64_t block) const { return at(block).ref; }

std::optional<uint64_t> KvBlockPool::hash_of(int64_t block) const {
  const Block& b = at(block);
  if (!b.cached) return std::nullopt;
  return b.hash;
}

std::vector<int64_t> KvBlockPool::free_queue() const { return {free_.begin(), free_.end()}; }

std::optional<int64_t> KvBlockPool::lookup(uint64_t parent, const int64_t* tokens, int64_t extra) const {
  const uint64_t h = block_hash(parent, tokens, block_size_, extra);
  auto it = cached_.find(h);
  if (it == cached_.end()) return std::nullopt;
  const Block& b = blocks_[static_cast<size_t>(it->second)];
  // The full key, so that equal 64-bit hashes of different blocks never share keys.
  if (b.parent != parent || b.extra != extra || !std::equal(b.tokens.begin(), b.tokens.end(), tokens))
    return std::nullopt;
  return it->second;
}

std::vector<int64_t> KvBlockPool::match_prefix(const std::vector<int64_t>& tokens, int64_t extra,
                                               int64_t max_blocks) {
  ++stats_.lookups;
  stats_.queried_tokens += static_cast<int64_t>(tokens.size());
  std::vector<int64_t> hits;
  if (!prefix_caching_) return hits;
  const int64_t full = std::min<int64_t>(static_cast<int64_t>(tokens.size()) / block_size_, max_blocks);
  uint64_t parent = kRootHash;
  for (int64_t i = 0; i < full; ++i) {
    auto b = lookup(parent, tokens.data() + i * block_size_, extra);
    if (!b) break;
    hits.push_back(*b);
    parent = blocks_[static_cast<size_t>(*b)].hash;
  }
  stats_.hit_tokens += static_cast<int64_t>(hits.size()) * block_size_;
  return hits;
}

int64_t KvBlockPool::blocks_needed(const std::vector<int64_t>& tokens, int64_t extra, int64_t max_hit_blocks,
                                   int64_t positions) const {
  int64_t hits = 0, idle_hits = 0;
  if (prefix_caching_) {
    const int64_t full = std::min<int64_t>(static_cast<int64_t>(tokens.size()) / block_size_, max_hit_blocks);
    uint64_t parent = kRootHash;
    for (; hits < full; ++hits) {
      auto b = lookup(parent, tokens.data() + hits * block_size_, extra);
      if (!b) break;
      const Block& blk = blocks_[static_cast<size_t>(*b)];
      if (blk.ref == 0) ++idle_hits;
      parent = blk.hash;
    }
  }
  return std::max<int64_t>(blocks_for(positions) - hits, 0) + idle_hits;
}

int64_t KvBlockPool::attach_prefix(RequestBlocks& table, const std::vector<int64_t>& tokens, int64_t extra,
                                   int64_t max_blocks) {
  if (!table.blocks.empty()) throw std::logic_error("KvBlockPool::attach_prefix: the table already holds blocks");
  const std::vector<int64_t> hits = match_prefix(tokens, extra, max_blocks);
  acquire(hits);
  table.blocks = hits;
  table.committed = static_cast<int64_t>(hits.size());
  table.last_hash = hits.empty() ? kRootHash : blocks_[static_cast<size_t>(hits.back())].hash;
  return table.committed * block_size_;
}

void KvBlockPool::evict(int64_t block) {
  Block& b = at(block);
  if (!b.cached) return;
  auto it = cached_.find(b.hash);
  if (it != cached_.end() && it->second == block) cached_.erase(it);
  b.cached = false;
  b.tokens.clear();
}

std::vector<int64_t> KvBlockPool::allocate(int64_t n) {
  if (n > num_free())
    throw std::runtime_error("KvBlockPool: " + std::to_string(n) + " blocks asked, " + std::to_string(num_free()) +
                             " free");
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t block = free_.front();
    free_.pop_front();
    evict(block);  // its old prefix is gone for good now
    at(block).ref = 1;
    out.push_back(block);
  }
  return out;
}

void KvBlockPool::acquire(const std::vector<int64_t>& blocks) {
  for (int64_t block : blocks) {
    Block& b = at(block);
    if (b.ref == 0) free_.erase(b.in_free);
    ++b.ref;
  }
}

void KvBlockPool::free_blocks(const std::vector<int64_t>& blocks) {
  for (int64_t block : blocks) {
    Block& b = at(block);
    if (b.ref <= 0) throw std::logic_error("KvBlockPool: block " + std::to_string(block) + " freed twice");
    if (--b.ref == 0) b.in_free = free_.insert(free_.end(), block);
  }
}

bool KvBlockPool::grow(RequestBlocks& table, int64_t positions) {
  const int64_t more = blocks_for(positions) - static_cast<int64_t>(table.blocks.size());
  if (more <= 0) return true;
  if (more > num_free()) return false;
  const std::vector<int64_t> got = allocate(more);
  table.blocks.insert(table.blocks.end(), got.begin(), got.end());
  return true;
}

void KvBlockPool::commit(RequestBlocks& table, const std::vector<int64_t>& tokens, int64_t computed, int64_t extra) {
  if (!prefix_caching_) return;
  const int64_t full = std::min<int64_t>(computed, static_cast<int64_t>(tokens.size())) / block_size_;
  for (; table.committed < full && table.committed < static_cast<int64_t>(table.blocks.size()); ++table.committed) {
    const int64_t i = table.committed;
    const int64_t* key = tokens.data() + i * block_size_;
    const uint64_t h = block_hash(table.last_hash, key, block_size_, extra);
    Block& b = at(table.blocks[static_cast<size_t>(i)]);
    if (!b.cached && !cached_.count(h)) {
      b.cached = true;
      b.hash = h;
      b.parent = table.last_hash;
      b.extra = extra;
      b.tokens.assign(key, key + block_size_);
      cached_.emplace(h, table.blocks[static_cast<size_t>(i)]);
    }
    table.last_hash = h;
  }
}

void KvBlockPool::truncate(RequestBlocks& table, int64_t positions) {
  const int64_t keep = std::max(blocks_for(positions), table.committed);
  if (keep >= static_cast<int64_t>(table.blocks.size())) return;
  std::vector<int64_t> tail(table.blocks.rbegin(), table.blocks.rend() - keep);
  free_blocks(tail);
  table.blocks.resize(static_cast<size_t>(keep));
}

void KvBlockPool::release(RequestBlocks& table) {
  free_blocks(std::vector<int64_t>(table.blocks.rbegin(), table.blocks.rend()));
  table = RequestBlocks{};
}

}  // namespace loom::serve
