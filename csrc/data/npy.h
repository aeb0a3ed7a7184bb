// Minimal .npy (NumPy format 1.0) reading and writing of 1-D and 2-D little-endian integer
// arrays: Loom's cached GPT/blending indices use it, so they can be inspected with numpy and
// compared with the .npy files megatron-core caches.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace loom::data {

struct NpyArray {
  std::vector<int64_t> data;    ///< values widened to int64, C order
  std::vector<size_t> shape;    ///< 1 or 2 dimensions
  std::string descr;            ///< e.g. "<i4", "<i8", "<u4", "<i2"
};

/// Reads an .npy file holding <i2, <i4, <i8, <u2, <u4 or <u8 data in C order. Throws
/// DataError naming the file on anything else or on truncation.
NpyArray read_npy(const std::string& path);

/// Writes `values` with the given shape and descr ("<i2", "<i4" or "<i8"; values must fit).
/// Writes to `path`.tmp.<pid> and renames, so readers never see a partial file.
void write_npy(const std::string& path, const std::vector<int64_t>& values, const std::vector<size_t>& shape,
               const std::string& descr);

}  // namespace loom::data
