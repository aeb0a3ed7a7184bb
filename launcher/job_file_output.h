// How `loom slurm` and `loom k8s` hand over the job file they wrote: to stdout ("-"), or to a
// file with a note on stderr saying how to submit it.
#pragma once
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

namespace loom::cli {

/// Writes `text` to `output` ("-" = stdout). Returns 0, or 1 after an error naming the file;
/// `command` ("loom slurm") prefixes the messages, `submit` ("sbatch") the hint.
inline int write_job_file(const std::string& command, const std::string& output, const std::string& text,
                          const std::string& submit) {
  if (output == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  std::ofstream out(output);
  if (!out || !(out << text)) {
    std::cerr << command << ": " << output << ": cannot write file\n";
    return 1;
  }
  std::cerr << command << ": wrote " << output << " (submit with: " << submit << " " << output << ")\n";
  return 0;
}

}  // namespace loom::cli
