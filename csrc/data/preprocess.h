// Corpus -> Megatron indexed dataset, like Megatron-LM's tools/preprocess_data.py for GPT
// (docs/design/formats.md, "Megatron indexed dataset"; docs/design/corpus_inputs.md): each document becomes
// one sequence of token ids (a JSON array of strings becomes one sequence per element),
// optionally ending with the EOD id; output {prefix}_{key}_document.bin/.idx per JSON key,
// uint16 when the vocabulary has < 65500 entries, else int32. `loom preprocess` is the
// command-line front end.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/corpus_inputs.h"
#include "data/tokenizer.h"

namespace loom::data {

struct PreprocessOptions {
  /// Files, directories or glob patterns (corpus_inputs.h), read in that order. By name:
  /// `.jsonl`/`.json` hold one JSON object per line, documents under `json_keys`; anything
  /// else is plain UTF-8 text, documents separated by one or more blank (empty or
  /// whitespace-only) lines, a document being its lines joined by "\n"; each may carry a
  /// `.zst`, `.gz` or `.xz` suffix and is then decompressed as it is read.
  std::vector<std::string> inputs;
  std::string output_prefix;
  std::vector<std::string> json_keys{"text"};
  TokenizerSpec tokenizer;
  bool append_eod = false;
  Partition partition;                   ///< this run's share of the inputs (corpus_inputs.h)
  int64_t skip_bad_lines = 0;            ///< malformed JSON lines skipped (and reported) before stopping
  int64_t max_line_bytes = kDefaultMaxLineBytes;  ///< a longer input line is refused (input_stream.h)
  int workers = 1;                       ///< tokenizing threads
  size_t chunk_bytes = size_t{4} << 20;  ///< input bytes handed to each worker at a time
  struct Progress {
    int64_t bytes_read, bytes_total, documents, tokens;
    double seconds;
  };
  std::function<void(const Progress&)> on_progress;  ///< called after each chunk
  struct BadLine {
    std::string file;
    int64_t line;
    std::string reason;
  };
  std::function<void(const BadLine&)> on_bad_line;  ///< called for each skipped line, in order
};

struct PreprocessResult {
  int64_t documents = 0;      ///< documents written (per key)
  int64_t tokens = 0;         ///< tokens written over all keys
  int64_t bytes = 0;          ///< decompressed input bytes read
  int64_t files = 0;          ///< input files read
  double seconds = 0;         ///< wall time of the whole run
  double encode_seconds = 0;  ///< wall time spent in the parallel parse + tokenize phase
  std::vector<PreprocessOptions::BadLine> bad_lines;  ///< the lines skipped, in input order
  std::vector<std::string> output_prefixes;  ///< {prefix}_{key}_document, one per key
};

/// Runs the conversion. The outputs are written under temporary names and renamed when
/// complete: on any failure they are removed and files of an earlier run are left as they were.
/// Throws DataError for bad input naming the file (and line): a malformed JSON line beyond
/// skip_bad_lines (not JSON, not an object, a key missing or not a string / array of strings,
/// ill-formed UTF-8 inside JSON), a compressed file that is truncated or not what its extension
/// says, a line longer than max_line_bytes, a tokenizer file that does not parse, no keys,
/// workers < 1, several keys with plain-text input, an output that is one of the inputs (before
/// anything is written). std::runtime_error for I/O failures. Plain-text input with ill-formed
/// UTF-8 is repaired as the tokenizer does (tokenizer.h).
PreprocessResult preprocess(const PreprocessOptions& options);

}  // namespace loom::data
