// lm-evaluation-harness's per-document metrics, their aggregation over a task and their
// standard errors (api/task.py ConfigurableTask.process_results, api/metrics.py;
// docs/design/evaluation.md, "Metrics"):
// - loglikelihood (LAMBADA): acc = is_greedy, mean, stderr = sample stddev / sqrt(n);
//   perplexity = exp(−mean ll), stderr by the harness's bootstrap (`bootstrap_iters` draws in
//   chunks of 1000, chunk i drawn with Python's Random(i); the sample stddev of the draws).
// - multiple choice: acc = argmax(ll) == gold, acc_norm = argmax(ll / len(choice)) == gold
//   (len counts the choice's code points, without the leading space); mean, mean stderr.
// - rolling: word_perplexity = exp(−Σll/Σwords), byte_perplexity = exp(−Σll/Σbytes),
//   bits_per_byte = −Σll/Σbytes/ln 2; the harness gives these no stderr ("N/A").
// argmax is numpy's: the first maximum (a NaN counts as the maximum).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "eval/task_docs.h"

namespace loom::eval {

/// What the model said about one request: Σ log p(continuation) and whether every
/// continuation token was the argmax.
struct RequestScore {
  double loglikelihood = 0;
  bool greedy = false;
};

/// One metric of a task: its value and the harness's stderr (nullopt: "N/A").
struct MetricValue {
  std::string name;
  double value = 0;
  std::optional<double> stderr_value;
  bool higher_is_better = true;
};

/// The first index of the largest value (numpy.argmax).
int64_t numpy_argmax(const std::vector<double>& values);

/// sample_stddev(xs) / sqrt(n).
double mean_stderr(const std::vector<double>& xs);

/// The harness's bootstrap_stderr(perplexity, xs, iters): replicates exp(−mean(resample)).
double perplexity_bootstrap_stderr(const std::vector<double>& lls, int64_t iters);

/// Per-document metric values (for --log-samples): "acc", "perplexity" (the ll), "acc_norm",
/// "word_perplexity" ([ll, words]) ... as the harness's process_results returns them.
/// `scores` holds the document's requests' scores (rolling: the sum over its windows, one
/// entry).
nlohmann::json document_metrics(TaskKind kind, const EvalDoc& doc, const std::vector<RequestScore>& scores);

/// The task's metrics (in the harness's order) from every document's scores.
/// `bootstrap_iters` <= 0 gives no stderr at all (as the harness).
std::vector<MetricValue> aggregate(TaskKind kind, const std::vector<EvalDoc>& docs,
                                   const std::vector<std::vector<RequestScore>>& scores, int64_t bootstrap_iters);

}  // namespace loom::eval
