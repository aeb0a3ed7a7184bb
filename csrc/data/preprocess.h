// Corpus -> Megatron indexed dataset, like Megatron-LM's tools/preprocess_data.py for GPT
// (formats.md, "Megatron indexed dataset"): each document becomes one sequence of GPT-2 BPE ids
// (a JSON array of strings becomes one sequence per element), optionally ending with the EOD id;
// output {prefix}_{key}_document.bin/.idx per JSON key, uint16 when the vocabulary has < 65500
// entries. `loom preprocess` is the command-line front end.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace loom::data {

struct PreprocessOptions {
  /// `.jsonl`/`.json`: one JSON object per line, documents under `json_keys`.
  /// Anything else is plain UTF-8 text: documents are separated by one or more blank
  /// (empty or whitespace-only) lines; a document is its lines joined by "\n".
  std::string input;
  std::string output_prefix;
  std::vector<std::string> json_keys{"text"};
  std::string vocab_file, merge_file;
  bool append_eod = false;
  int workers = 1;                       ///< tokenizing threads
  size_t chunk_bytes = size_t{4} << 20;  ///< input bytes handed to each worker at a time
  struct Progress {
    int64_t bytes_read, bytes_total, documents, tokens;
    double seconds;
  };
  std::function<void(const Progress&)> on_progress;  ///< called after each chunk
};

struct PreprocessResult {
  int64_t documents = 0;      ///< documents written (per key)
  int64_t tokens = 0;         ///< tokens written over all keys
  int64_t bytes = 0;          ///< input bytes
  double seconds = 0;         ///< wall time of the whole run
  double encode_seconds = 0;  ///< wall time spent in the parallel parse + tokenize phase
  std::vector<std::string> output_prefixes;  ///< {prefix}_{key}_document, one per key
};

/// Runs the conversion. Throws DataError for bad input (unreadable JSON line, missing key,
/// ill-formed UTF-8 in JSON, no keys, workers < 1) naming the file and line; std::runtime_error
/// for I/O failures. Plain-text input with ill-formed UTF-8 is repaired as the tokenizer does
/// (gpt2_tokenizer.h).
PreprocessResult preprocess(const PreprocessOptions& options);

}  // namespace loom::data
