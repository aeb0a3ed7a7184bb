// The block pool of the paged KV cache with prefix caching (docs/serving.md, "Paged KV cache";
// the idea follows vLLM v1's block pool and KV cache manager, /work/shared/design/serving_v2.md).
//
// One pool per rank holds num_blocks blocks of block_size token slots; block b owns slots
// [b · block_size, (b + 1) · block_size) of every layer's paged storage (model/kv_cache.h).
// A request holds a block table (RequestBlocks): its i-th block holds its positions
// [i · block_size, (i + 1) · block_size). Blocks are reference-counted: a block cached for a
// prefix can be in several requests' tables. A block whose count drops to 0 joins the tail of
// the free queue, which is least-recently-used first: allocation takes the head. A freed block
// keeps its prefix hash until allocation takes it (then the hash is evicted), so a later
// request with the same prefix can still reuse it.
//
// Prefix caching: a full block is keyed by a hash chain, hash(parent block's hash, its
// block_size tokens, an extra key such as the learned-prompt task, -1 for none); the first
// block's parent is kRootHash. A request walks its tokens block by block and reuses every
// cached block that matches (the block's tokens, extra key and parent hash are compared, so a
// 64-bit hash collision cannot give wrong keys); partial blocks are never shared.
//
// Every operation is deterministic, so ranks that apply the same calls hold the same pool.
// Not thread-safe (the engine's step thread owns it).
#pragma once
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace loom::serve {

/// The parent hash of a sequence's first block.
constexpr uint64_t kRootHash = 0x6c6f6f6d2d6b7600ULL;

/// Chain hash of one full block: tokens[0, count) after the block hashed `parent`, with `extra`.
uint64_t block_hash(uint64_t parent, const int64_t* tokens, int64_t count, int64_t extra);

/// Prefix-cache counters (tokens, as vLLM reports them): lookups made, tokens looked up, and
/// tokens found cached.
struct PrefixCacheStats {
  int64_t lookups = 0;
  int64_t queried_tokens = 0;
  int64_t hit_tokens = 0;
};

/// One request's block table. `blocks[i]` holds positions [i·bs, (i+1)·bs); the first
/// `committed` blocks are full and registered (hashed), the last of them with `last_hash`.
struct RequestBlocks {
  std::vector<int64_t> blocks;
  int64_t committed = 0;
  uint64_t last_hash = kRootHash;
};

class KvBlockPool {
 public:
  /// Throws std::invalid_argument for num_blocks < 1 or block_size < 1 (naming the field).
  /// With prefix_caching false nothing is hashed or matched (blocks are still counted).
  KvBlockPool(int64_t num_blocks, int64_t block_size, bool prefix_caching = true);

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t block_size() const { return block_size_; }
  bool prefix_caching() const { return prefix_caching_; }
  /// Blocks no request holds (the free queue's length, cached ones included).
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  /// Blocks needed to hold `tokens` positions.
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  int ref_count(int64_t block) const;
  /// The block's prefix hash while it is cached, else nullopt.
  std::optional<uint64_t> hash_of(int64_t block) const;
  /// The free queue, next block to allocate first.
  std::vector<int64_t> free_queue() const;
  const PrefixCacheStats& stats() const { return stats_; }

  /// The cached full blocks matching tokens[0, max_blocks · bs) under `extra`, in order (stops
  /// at the first miss). Counts a lookup of tokens.size() tokens. Takes no reference.
  std::vector<int64_t> match_prefix(const std::vector<int64_t>& tokens, int64_t extra, int64_t max_blocks);

  /// Starts `table` (empty) with the cached prefix of `tokens` (at most max_blocks blocks):
  /// takes a reference on each matched block and marks them committed. Returns the number of
  /// cached positions (a multiple of block_size). The caller checks that enough blocks are
  /// free first (blocks_needed).
  int64_t attach_prefix(RequestBlocks& table, const std::vector<int64_t>& tokens, int64_t extra,
                        int64_t max_blocks);
  /// Free blocks a request starting with `tokens` needs to hold `positions` positions, given
  /// its cached prefix (at most max_hit_blocks blocks): matched blocks in the free queue count
  /// too, since taking them removes them from it.
  int64_t blocks_needed(const std::vector<int64_t>& tokens, int64_t extra, int64_t max_hit_blocks,
                        int64_t positions) const;

  /// Grows `table` to hold `positions` positions, taking blocks from the free queue's head
  /// (evicting their hashes). Returns false and takes nothing when too few are free.
  bool grow(RequestBlocks& table, int64_t positions);
  /// Registers the table's blocks that are full once `computed` positions of `tokens` (the
  /// request's token sequence) hold keys and values. A block whose hash another block already
  /// holds stays unregistered (the chain goes on with the same hash).
  void commit(RequestBlocks& table, const std::vector<int64_t>& tokens, int64_t computed, int64_t extra);
  /// Speculation's roll-back: drops the table's blocks past those holding `positions`
  /// positions (never a committed one), last first.
  void truncate(RequestBlocks& table, int64_t positions);
  /// Drops the table's references (last block first, so a request's tail is evicted before
  /// its prefix) and empties it.
  void release(RequestBlocks& table);

  /// Low-level parts of the above (tested directly): allocate n blocks from the free queue's
  /// head (std::runtime_error when fewer are free); take a reference on cached blocks; drop
  /// one reference of each block in order.
  std::vector<int64_t> allocate(int64_t n);
  void acquire(const std::vector<int64_t>& blocks);
  void free_blocks(const std::vector<int64_t>& blocks);

 private:
  struct Block {
    int ref = 0;
    bool cached = false;
    uint64_t hash = 0, parent = 0;
    int64_t extra = -1;
    std::vector<int64_t> tokens;  // the key, while cached
    std::list<int64_t>::iterator in_free;
  };
  std::optional<int64_t> lookup(uint64_t parent, const int64_t* tokens, int64_t extra) const;
  void evict(int64_t block);
  Block& at(int64_t block);
  const Block& at(int64_t block) const;

  int64_t block_size_;
  bool prefix_caching_;
  std::vector<Block> blocks_;
  std::list<int64_t> free_;                      // LRU: head is allocated next
  std::unordered_map<uint64_t, int64_t> cached_;  // hash -> block
  PrefixCacheStats stats_;
};

}  // namespace loom::serve
