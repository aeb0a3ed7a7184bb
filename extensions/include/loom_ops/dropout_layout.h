// Layout-independent dropout: which *global* element each local element is.
//
// A Loom dropout mask bit is a pure function of (seed, stream, g, p) where g is the
// element's row-major index in the tensor the single-process run would hold (philox.h).
// A rank that holds only a piece of that tensor describes the piece as a sub-block:
//
//     the local tensor, of shape L[0..n), is the block starting at offset O[0..n)
//     of a global row-major tensor of shape G[0..n)        (O[d] + L[d] <= G[d])
//
// and local element (c0, ..., c{n-1}) gets g = sum_d (O[d] + c[d]) * stride_G[d]. Then
// every tensor/sequence/pipeline/data-parallel layout, every micro-batch split and every
// recomputation draws exactly the bits of the single-process run. Examples (GPT, [s, b, h]
// activations, a heads, t tensor-parallel ranks, rank r, micro-batch starting at global
// sample b0 of the global batch B):
//   - hidden dropout under sequence parallelism, local [s/t, b, h]:
//       G = [s, B, h], O = [r * s/t, b0, 0]
//   - hidden dropout without sequence parallelism (replicated over TP), local [s, b, h]:
//       G = [s, B, h], O = [0, b0, 0]          (same bits on every TP rank)
//   - attention-probability dropout, local [b, a/t, s, s]:
//       G = [B, a, s, s], O = [b0, r * a/t, 0, 0]
// An empty G means "the local tensor is the whole global tensor" (O must be empty too).
// Tensors with more than kMaxDropoutDims dimensions are rejected.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom_ops/philox.h"

namespace loom::ops {

constexpr int kMaxDropoutDims = 6;

/// Device-copyable description of a local contiguous tensor's global element indices.
/// Rows are the local tensor's last dimension; the global last stride is always 1, so the
/// elements of one local row are consecutive global indices.
struct ElementLayout {
  int ndim = 0;                                 ///< number of dimensions (>= 1)
  int64_t sizes[kMaxDropoutDims] = {};          ///< local shape
  int64_t global_strides[kMaxDropoutDims] = {}; ///< row-major strides of the global shape
  int64_t base = 0;                             ///< global index of local element (0, ..., 0)

  /// Elements per row (the last local dimension).
  LOOM_HOST_DEVICE int64_t row_length() const { return sizes[ndim - 1]; }

  /// Global index of the first element of local row `row` (row-major over dims [0, n-1)).
  LOOM_HOST_DEVICE int64_t row_start(int64_t row) const {
    int64_t g = base;
    for (int d = ndim - 2; d >= 0; --d) {
      const int64_t c = row % sizes[d];
      row /= sizes[d];
      g += c * global_strides[d];
    }
    return g;
  }
};

/// Builds the layout of a local tensor of shape `local` that is the block at `offset` of a
/// global tensor of shape `global` (both empty: the local tensor is the whole tensor).
/// Throws std::invalid_argument naming the offending dimension.
inline ElementLayout make_element_layout(const std::vector<int64_t>& local,
                                         const std::vector<int64_t>& global,
                                         const std::vector<int64_t>& offset) {
  auto shape_str = [](const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  };
  const std::string where = "loom dropout layout (local " + shape_str(local) + ", global " +
                            shape_str(global) + ", offset " + shape_str(offset) + "): ";
  std::vector<int64_t> loc = local.empty() ? std::vector<int64_t>{1} : local;  // 0-dim -> [1]
  std::vector<int64_t> glob = global, off = offset;
  if (glob.empty()) {
    if (!off.empty()) throw std::invalid_argument(where + "an offset needs a global shape");
    glob = loc;
    off.assign(loc.size(), 0);
  }
  if (glob.size() != loc.size())
    throw std::invalid_argument(where + "the global shape must have as many dimensions as "
                                "the local tensor");
  if (off.empty()) off.assign(loc.size(), 0);
  if (off.size() != loc.size())
    throw std::invalid_argument(where + "the offset must have one entry per dimension");
  if (loc.size() > static_cast<size_t>(kMaxDropoutDims))
    throw std::invalid_argument(where + "at most " + std::to_string(kMaxDropoutDims) +
                                " dimensions are supported");
  ElementLayout layout;
  layout.ndim = static_cast<int>(loc.size());
  int64_t stride = 1;
  const int64_t limit = int64_t{1} << 62;
  for (int d = layout.ndim - 1; d >= 0; --d) {
    if (off[d] < 0 || loc[d] < 0 || off[d] + loc[d] > glob[d])
      throw std::invalid_argument(where + "dimension " + std::to_string(d) + ": offset " +
                                  std::to_string(off[d]) + " + local size " +
                                  std::to_string(loc[d]) + " exceeds the global size " +
                                  std::to_string(glob[d]));
    layout.sizes[d] = loc[d];
    layout.global_strides[d] = stride;
    layout.base += off[d] * stride;
    if (glob[d] > 0 && stride > limit / glob[d])
      throw std::invalid_argument(where + "the global tensor has more than 2^62 elements");
    stride *= glob[d];
  }
  return layout;
}

}  // namespace loom::ops
