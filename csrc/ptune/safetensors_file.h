// Reading and writing safetensors files (https://github.com/huggingface/safetensors, format as
// documented in docs/design/ptuning.md, "The inference table"): an 8-byte little-endian header
// length N, N bytes of JSON {"__metadata__": {string: string}, name: {"dtype", "shape",
// "data_offsets": [begin, end]}}, padded with spaces to a multiple of 8, then the tensors'
// little-endian bytes back to back. Loom writes float32 tensors only, in the key order the
// reference writer uses (__metadata__ first; dtype, shape, data_offsets; tensors by name), so
// its files are byte-identical to safetensors.torch.save_file of the same tensors (with
// metadata, up to the order of the metadata keys, which the reference takes from a hash map).
#pragma once
#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace loom::ptune {

struct SafetensorsContent {
  std::map<std::string, at::Tensor> tensors;       ///< float32 CPU tensors
  std::map<std::string, std::string> metadata;     ///< "__metadata__"
};

/// Writes `content` to `path` atomically (a temporary file renamed over it). Throws
/// std::invalid_argument for a tensor that is not float32, std::runtime_error naming the file
/// on an I/O failure.
void write_safetensors(const std::string& path, const SafetensorsContent& content);

/// Reads a file written by any safetensors writer holding float32 tensors. Throws
/// std::invalid_argument naming the file and what is wrong (short file, header length beyond
/// the file or 100 MB, bad JSON, a dtype other than F32, offsets that do not tile the data).
SafetensorsContent read_safetensors(const std::string& path);

}  // namespace loom::ptune
