// A checkpoint shard read in place (train/checkpoint.h; docs/design/formats.md, "Checkpoints"):
// the file is mapped into memory once, hashed there, and its tensors are unpickled as views of
// the mapping, so loading copies no tensor bytes and allocates no memory for them (a 124M-
// parameter training shard is ~2 GB, 3/4 of it optimizer state that inference never touches).
//
// The mapping is private and copy-on-write: writing to a loaded tensor copies the page, never
// reaches the file. Checkpoint files are immutable once committed (a save writes iter_N.tmp and
// renames it; checkpoint_files.h), so the mapped bytes stay those that were hashed.
#pragma once
#include <ATen/core/ivalue.h>

#include <cstddef>
#include <memory>
#include <string>

namespace loom::train {

/// A whole regular file mapped read/copy-on-write; unmapped when the last owner (the file
/// object or a tensor viewing it) is gone.
class MappedShard {
 public:
  /// Maps `path`. Throws CheckpointError naming it when it is missing, not a regular file or
  /// cannot be mapped.
  static std::shared_ptr<MappedShard> open(const std::string& path);
  ~MappedShard();
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;

  const char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedShard(std::string path, char* data, size_t size) : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  char* data_ = nullptr;  // nullptr for an empty file
  size_t size_ = 0;
};

/// The torch.save archive in `shard` unpickled as torch::pickle_load would, except that every
/// tensor is a view of the mapping (which the tensors keep alive) instead of a copy. Throws
/// std::exception (c10::Error included) on an archive torch cannot read or a tensor record
/// outside the file; the caller names the file. Tensor records must be stored uncompressed, as
/// torch.save and torch::pickle_save write them (the content hash is checked first).
c10::IValue unpickle_in_place(const std::shared_ptr<const MappedShard>& shard);

}  // namespace loom::train
