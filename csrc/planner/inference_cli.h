// `loom plan infer`: command-line front end of the inference planner (launcher/commands/plan.cpp
// dispatches to it), and the table / CSV it prints.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "planner/inference_search.h"

namespace loom::planner {

/// Parses `loom plan infer` arguments (argv[0] is the program label), searches the serving
/// layouts and prints the ranked table on stderr (CSV to a file or stdout with --csv); with
/// --measure K --checkpoint DIR it then serves the K best on this machine and prints measured
/// beside predicted figures (inference_measure.h). Returns the exit status: 0 success, 2 bad
/// usage or input, 1 no layout fits and meets the limits, no measured run succeeded, or an
/// output file cannot be written.
int run_plan_inference_command(int argc, char** argv);

/// Fixed-width table of the first `rows` candidates: TP PP batch replicas, memory per GPU
/// (worst stage, GiB), TTFT, per-token and request latency (ms), generated tokens/s of the
/// cluster and per GPU.
std::string format_inference_table(const std::vector<InferenceCandidate>& cands, std::size_t rows);

/// Every candidate as CSV with a header line: the table's columns plus the memory terms, the
/// binding term, tokens/s per replica and the prefill / decode terms (s).
std::string format_inference_csv(const std::vector<InferenceCandidate>& cands);

}  // namespace loom::planner
