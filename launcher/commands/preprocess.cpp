// `loom preprocess`: corpus files (JSONL or plain text, optionally .zst/.gz/.xz) -> Megatron
// indexed dataset (.bin/.idx). Options follow Megatron-LM's tools/preprocess_data.py; the
// tokenizer options follow NeMo's model.tokenizer keys (docs/design/tokenizers.md).
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "command_registry.h"
#include "data/data_error.h"
#include "data/preprocess.h"
#include "runlog/progress_line.h"

namespace {

// What was asked, as parsed.
struct PreprocessArgs {
  loom::data::PreprocessOptions options;
  std::string tokenizer_type, library = "megatron", partition = "0/1";
  bool quiet = false;
};

void add_flags(CLI::App& app, PreprocessArgs& a) {
  auto& o = a.options;
  app.add_option("--input", o.inputs, "input file, directory or glob (repeatable, or several after one --input)")
      ->required()
      ->expected(1, -1);
  app.add_option("--output-prefix", o.output_prefix, "output path prefix")->required();
  app.add_option("--json-keys", o.json_keys, "JSON keys to extract (default: text)")->expected(1, -1);
  app.add_option("--tokenizer-library", a.library, "megatron (GPT-2 BPE), sentencepiece or huggingface")
      ->check(CLI::IsMember({"megatron", "sentencepiece", "huggingface"}));
  app.add_option("--tokenizer-type", a.tokenizer_type,
                 "megatron: GPT2BPETokenizer (default); also selects the library: SentencePieceTokenizer, "
                 "HuggingFaceTokenizer (Megatron's spellings)");
  app.add_option("--tokenizer-model", o.tokenizer.model, "sentencepiece: the .model file; huggingface: tokenizer.json");
  app.add_option("--vocab-file", o.tokenizer.vocab_file, "GPT-2 vocab.json (megatron)");
  app.add_option("--merge-file", o.tokenizer.merge_file, "GPT-2 merges.txt (megatron)");
  app.add_flag("--append-eod", o.append_eod, "end each document with the tokenizer's end-of-document id");
  app.add_option("--partition", a.partition,
                 "I/N: process share I (0-based) of N: whole files when there are at least N, else documents "
                 "(docs/design/corpus_inputs.md); merge the N outputs with loom merge-datasets");
  app.add_option("--skip-bad-lines", o.skip_bad_lines,
                 "skip up to N malformed JSON lines, each reported with file and line (default 0: stop at the first)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-line-bytes", o.max_line_bytes,
                 "refuse an input line longer than this many (decompressed) bytes, naming file and line; a line "
                 "is held whole in memory (default 1 GiB)")
      ->check(CLI::PositiveNumber);
  app.add_option("--workers", o.workers, "tokenizing threads")->check(CLI::PositiveNumber);
  app.add_flag("--quiet", a.quiet, "no progress display");
}

// Megatron's --tokenizer-type names pick the library too.
void choose_tokenizer(PreprocessArgs& a) {
  if (a.tokenizer_type == "SentencePieceTokenizer" || a.tokenizer_type == "GPTSentencePieceTokenizer")
    a.library = "sentencepiece";
  else if (a.tokenizer_type == "HuggingFaceTokenizer")
    a.library = "huggingface";
  auto& t = a.options.tokenizer;
  t.library = a.library;
  t.type = a.library == "megatron" ? (a.tokenizer_type.empty() ? "GPT2BPETokenizer" : a.tokenizer_type) : a.tokenizer_type;
}

// Progress on stderr (runlog/progress_line.h): one line rewritten on a terminal, a plain line
// every 5 s otherwise; skipped lines reported on lines of their own.
class ProgressDisplay {
 public:
  explicit ProgressDisplay(loom::data::PreprocessOptions& o, bool quiet)
      : line_({"[preprocess]", "MB", /*decimals=*/1, /*plain_every_s=*/5}) {
    if (!quiet)
      o.on_progress = [this](const loom::data::PreprocessOptions::Progress& p) {
        line_.update(p.bytes_read / 1e6, p.bytes_total / 1e6,
                     fmt::format("{} docs, {} tokens", p.documents, p.tokens));
      };
    o.on_bad_line = [this](const loom::data::PreprocessOptions::BadLine& b) {
      end_line();
      std::fprintf(stderr, "[preprocess] skipped '%s' line %lld: %s\n", b.file.c_str(), static_cast<long long>(b.line),
                   b.reason.c_str());
    };
  }
  void end_line() { line_.end_line(); }

 private:
  loom::runlog::ProgressLine line_;
};

void report(const loom::data::PreprocessResult& r, const PreprocessArgs& a) {
  for (const auto& p : r.output_prefixes) std::fprintf(stderr, "[preprocess] wrote %s.bin/.idx\n", p.c_str());
  std::fprintf(stderr,
               "[preprocess] %lld documents, %lld tokens from %lld file(s), %.2f MB in %.2f s; tokenize %.2f MB/s "
               "with %d worker(s)%s\n",
               static_cast<long long>(r.documents), static_cast<long long>(r.tokens), static_cast<long long>(r.files),
               r.bytes / 1e6, r.seconds, r.encode_seconds > 0 ? r.bytes / 1e6 / r.encode_seconds : 0.0,
               a.options.workers, a.options.partition.whole() ? "" : (", partition " + a.partition).c_str());
  if (!r.bad_lines.empty())
    std::fprintf(stderr, "[preprocess] %zu malformed line(s) skipped (listed above)\n", r.bad_lines.size());
}

int run_preprocess(int argc, char** argv) {
  PreprocessArgs a;
  CLI::App app{"Tokenize a corpus into a Megatron indexed dataset: {output-prefix}_{key}_document.bin/.idx.\n"
               "Inputs: files, directories (all files below, sorted) or glob patterns, in the order given.\n"
               ".jsonl/.json: one JSON object per line, documents under --json-keys; other files: plain UTF-8\n"
               "text, documents separated by blank lines. A .zst, .gz or .xz suffix is decompressed on the fly.",
               "loom preprocess"};
  add_flags(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  choose_tokenizer(a);
  ProgressDisplay progress(a.options, a.quiet);
  try {
    a.options.partition = loom::data::parse_partition(a.partition);
    const auto r = loom::data::preprocess(a.options);
    progress.end_line();
    report(r, a);
    return 0;
  } catch (const loom::data::DataError& e) {
    progress.end_line();
    std::fprintf(stderr, "loom preprocess: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    progress.end_line();
    std::fprintf(stderr, "loom preprocess: failed: %s\n", e.what());
    return 1;
  }
}

}  // namespace

LOOM_REGISTER_COMMAND("preprocess", "tokenize a corpus into a Megatron indexed dataset (.bin/.idx)", run_preprocess);
