// `loom preprocess`: corpus (JSONL or plain text) -> Megatron indexed dataset (.bin/.idx) with
// the GPT-2 BPE tokenizer. Options follow Megatron-LM's tools/preprocess_data.py.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "command_registry.h"
#include "data/data_error.h"
#include "data/preprocess.h"

namespace {

int run_preprocess(int argc, char** argv) {
  loom::data::PreprocessOptions o;
  std::string tokenizer_type = "GPT2BPETokenizer";
  bool quiet = false;
  CLI::App app{"Tokenize a corpus into a Megatron indexed dataset: {output-prefix}_{key}_document.bin/.idx.\n"
               "Input .jsonl/.json: one JSON object per line, documents under --json-keys.\n"
               "Other input: plain UTF-8 text, documents separated by blank lines.",
               "loom preprocess"};
  app.add_option("--input", o.input, "input file (.jsonl, .json or plain text)")->required();
  app.add_option("--output-prefix", o.output_prefix, "output path prefix")->required();
  app.add_option("--json-keys", o.json_keys, "JSON keys to extract (default: text)")->expected(1, -1);
  app.add_option("--tokenizer-type", tokenizer_type, "only GPT2BPETokenizer is supported")
      ->check(CLI::IsMember({"GPT2BPETokenizer"}));
  app.add_option("--vocab-file", o.vocab_file, "GPT-2 vocab.json")->required();
  app.add_option("--merge-file", o.merge_file, "GPT-2 merges.txt")->required();
  app.add_flag("--append-eod", o.append_eod, "end each document with <|endoftext|> (50256)");
  app.add_option("--workers", o.workers, "tokenizing threads")->check(CLI::PositiveNumber);
  app.add_flag("--quiet", quiet, "no progress display");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  const bool tty = ::isatty(STDERR_FILENO);
  double last_report = -1;
  if (!quiet) {
    o.on_progress = [&](const loom::data::PreprocessOptions::Progress& p) {
      if (!tty && p.seconds - last_report < 5.0 && p.bytes_read < p.bytes_total) return;
      last_report = p.seconds;
      const double mb = p.bytes_read / 1e6, total = p.bytes_total / 1e6;
      std::fprintf(stderr, "%s[preprocess] %.1f/%.1f MB (%.0f%%), %lld docs, %lld tokens, %.2f MB/s%s",
                   tty ? "\r" : "", mb, total, total > 0 ? 100.0 * mb / total : 100.0,
                   static_cast<long long>(p.documents), static_cast<long long>(p.tokens),
                   p.seconds > 0 ? mb / p.seconds : 0.0, tty ? "" : "\n");
      std::fflush(stderr);
    };
  }
  try {
    const auto r = loom::data::preprocess(o);
    if (!quiet && tty) std::fprintf(stderr, "\n");
    for (const auto& p : r.output_prefixes) std::fprintf(stderr, "[preprocess] wrote %s.bin/.idx\n", p.c_str());
    std::fprintf(stderr,
                 "[preprocess] %lld documents, %lld tokens from %.2f MB in %.2f s; tokenize %.2f MB/s with %d "
                 "worker(s)\n",
                 static_cast<long long>(r.documents), static_cast<long long>(r.tokens), r.bytes / 1e6, r.seconds,
                 r.encode_seconds > 0 ? r.bytes / 1e6 / r.encode_seconds : 0.0, o.workers);
    return 0;
  } catch (const loom::data::DataError& e) {
    std::fprintf(stderr, "%sloom preprocess: error: %s\n", (!quiet && tty) ? "\n" : "", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%sloom preprocess: failed: %s\n", (!quiet && tty) ? "\n" : "", e.what());
    return 1;
  }
}

}  // namespace

LOOM_REGISTER_COMMAND("preprocess", "tokenize a corpus into a Megatron indexed dataset (.bin/.idx)", run_preprocess);
