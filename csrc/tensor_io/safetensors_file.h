// Reading and writing safetensors files (https://github.com/huggingface/safetensors; the format
// as docs/design/ptuning.md, "The inference table", describes it): an 8-byte little-endian
// header length N, N bytes of JSON {"__metadata__": {string: string}, name: {"dtype", "shape",
// "data_offsets": [begin, end]}}, padded with spaces to a multiple of 8, then the tensors'
// little-endian bytes back to back. Loom writes in the key order the reference writer uses
// (__metadata__ first; dtype, shape, data_offsets; tensors by name), so its files are
// byte-identical to safetensors.torch.save_file of the same tensors (with metadata, up to the
// order of the metadata keys, which the reference takes from a hash map).
// Dtypes: F64, F32, F16, BF16, I64, I32 (at::kDouble, kFloat, kHalf, kBFloat16, kLong, kInt).
#pragma once
#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace loom::tensor_io {

struct SafetensorsContent {
  std::map<std::string, at::Tensor> tensors;       ///< CPU tensors of the dtypes above
  std::map<std::string, std::string> metadata;     ///< "__metadata__"
};

/// Writes `content` to `path` atomically (a temporary file renamed over it). Throws
/// std::invalid_argument naming the tensor when its dtype is not one of the above,
/// std::runtime_error naming the file on an I/O failure.
void write_safetensors(const std::string& path, const SafetensorsContent& content);

/// Reads a file written by any safetensors writer. Throws std::invalid_argument naming the file
/// and what is wrong (short file, header length beyond the file or 100 MB, bad JSON, a name
/// given twice, a dtype other than the above, offsets that do not tile the data, a dimension too large) and the
/// tensor where one is at fault.
SafetensorsContent read_safetensors(const std::string& path);

}  // namespace loom::tensor_io
