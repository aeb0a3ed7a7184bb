// `loom merge-datasets`: joins Megatron indexed datasets (.bin/.idx) into one, as Megatron-LM's
// tools/merge_datasets.py does (csrc/data/merge_datasets.h), e.g. the partitions of a
// `loom preprocess --partition I/N` array job.
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "command_registry.h"
#include "data/data_error.h"
#include "data/merge_datasets.h"

namespace {

int run_merge(int argc, char** argv) {
  std::vector<std::string> inputs;
  std::string output_prefix;
  CLI::App app{"Merge Megatron indexed datasets into {output-prefix}.bin/.idx, byte-identical to preprocessing\n"
               "their documents in one go. --input DIR takes every <name>.idx/.bin pair in DIR, sorted by name\n"
               "(as Megatron's tools/merge_datasets.py); --input PREFIX... takes the datasets in the order given.",
               "loom merge-datasets"};
  app.add_option("--input", inputs, "a directory of .bin/.idx pairs, or dataset prefixes in order")->required()->expected(1, -1);
  app.add_option("--output-prefix", output_prefix, "output path prefix (without .bin/.idx)")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    std::vector<std::string> prefixes;
    struct stat st{};
    if (inputs.size() == 1 && ::stat(inputs[0].c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      prefixes = loom::data::datasets_in_directory(inputs[0]);
    else
      prefixes = inputs;
    const auto r = loom::data::merge_datasets(prefixes, output_prefix);
    std::fprintf(stderr, "[merge-datasets] %zu datasets -> %s.bin/.idx: %lld documents, %lld sequences, %.2f MB\n",
                 prefixes.size(), output_prefix.c_str(), static_cast<long long>(r.documents),
                 static_cast<long long>(r.sequences), r.bytes / 1e6);
    return 0;
  } catch (const loom::data::DataError& e) {
    std::fprintf(stderr, "loom merge-datasets: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom merge-datasets: failed: %s\n", e.what());
    return 1;
  }
}

}  // namespace

LOOM_REGISTER_COMMAND("merge-datasets", "merge Megatron indexed datasets (.bin/.idx) into one", run_merge);
