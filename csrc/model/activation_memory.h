// Measuring activation memory: the bytes autograd keeps for backward, recorded through a
// saved-tensor pack hook (every SavedVariable of every node, custom functions included),
// counted once per storage, and attributed to the transformer layer that was running
// (ActivationScope). This is what docs/design/sp_sar.md's "Activation memory per layer" formulas count.
//
// Counting rules: a storage is counted once (Q, K, V as views of one QKV tensor are one
// storage); storages of parameters given to the recorder are not counted. Besides raw bytes,
// "paper bytes" count 2 bytes per floating-point element and 1 per 1-byte element, the units of
// Korthikanti et al. (2-byte activations, 1-byte masks), so fp32 runs compare to the formulas.
//
// Implementation note: LibTorch has no C++ API for default saved-tensor hooks (Python's
// torch.autograd.graph.saved_tensors_hooks goes through the Python engine), so the first
// recorder installs, once per process, an autograd engine subclass whose only difference is to
// return the recording hooks while a recorder is active on the current thread.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/parameter.h"

namespace loom::model {

/// Scope id of saved tensors outside any transformer layer (embedding, output layer, loss).
constexpr int kOutsideLayers = -1;

struct SavedBytes {
  int64_t bytes = 0;        ///< storage bytes as allocated
  int64_t paper_bytes = 0;  ///< 2 per floating element, 1 per 1-byte element, raw otherwise
  int64_t storages = 0;     ///< distinct storages
  SavedBytes& operator+=(const SavedBytes& o);
};

/// While alive, records on this thread every tensor saved for backward. Not reentrant.
class ActivationMemoryRecorder {
 public:
  explicit ActivationMemoryRecorder(const ParamList& exclude = {});
  ~ActivationMemoryRecorder();
  ActivationMemoryRecorder(const ActivationMemoryRecorder&) = delete;
  ActivationMemoryRecorder& operator=(const ActivationMemoryRecorder&) = delete;

  /// Per scope: global layer number, or kOutsideLayers.
  std::map<int, SavedBytes> per_scope() const;
  SavedBytes total() const;
  /// One line per recorded storage ("layer 3: float [8, 2, 96] 6144 bytes"), for debugging.
  std::vector<std::string> describe() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// Marks the saved tensors recorded while it is alive (on this thread) as belonging to
/// `layer`. Costs two thread-local writes when no recorder is active.
class ActivationScope {
 public:
  explicit ActivationScope(int layer);
  ~ActivationScope();

 private:
  int previous_;
};

}  // namespace loom::model
