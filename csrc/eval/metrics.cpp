#include "eval/metrics.h"

#include <cmath>
#include <stdexcept>

#include "eval/python_random.h"
#include "eval/text_rules.h"

namespace loom::eval {

namespace {

double mean(const std::vector<double>& xs) {
  double s = 0;
  for (double x : xs) s += x;  // Python's sum(): left to right
  return s / static_cast<double>(xs.size());
}

double sample_stddev(const std::vector<double>& xs) {
  const double mu = mean(xs);
  double s = 0;
  for (double x : xs) s += (x - mu) * (x - mu);
  return std::sqrt(s / static_cast<double>(xs.size() - 1));
}

struct ChoiceOutcome {
  double acc = 0, acc_norm = 0;
};

ChoiceOutcome choose(const EvalDoc& doc, const std::vector<RequestScore>& scores) {
  std::vector<double> lls, normed;
  for (size_t i = 0; i < scores.size(); ++i) {
    lls.push_back(scores[i].loglikelihood);
    normed.push_back(scores[i].loglikelihood / static_cast<double>(python_length(doc.choices[i])));
  }
  return {numpy_argmax(lls) == doc.gold ? 1.0 : 0.0, numpy_argmax(normed) == doc.gold ? 1.0 : 0.0};
}

bool is_multiple_choice(TaskKind kind) { return output_type(kind) == "multiple_choice"; }

}  // namespace

int64_t numpy_argmax(const std::vector<double>& values) {
  int64_t best = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) return static_cast<int64_t>(i);
    if (values[i] > values[best]) best = static_cast<int64_t>(i);
  }
  return best;
}

double mean_stderr(const std::vector<double>& xs) {
  return sample_stddev(xs) / std::sqrt(static_cast<double>(xs.size()));
}

double perplexity_bootstrap_stderr(const std::vector<double>& lls, int64_t iters) {
  const int64_t chunk = std::min<int64_t>(1000, iters);
  const int64_t n = static_cast<int64_t>(lls.size());
  std::vector<double> replicates;
  replicates.reserve(static_cast<size_t>(iters));
  for (int64_t i = 0; i < iters / chunk; ++i) {
    PythonRandom rnd(static_cast<uint32_t>(i));
    for (int64_t r = 0; r < chunk; ++r) {
      double s = 0;
      for (int64_t k = 0; k < n; ++k) s += lls[static_cast<size_t>(rnd.choice_index(n))];
      replicates.push_back(std::exp(-(s / static_cast<double>(n))));
    }
  }
  return sample_stddev(replicates);
}

nlohmann::json document_metrics(TaskKind kind, const EvalDoc& doc, const std::vector<RequestScore>& scores) {
  if (kind == TaskKind::kLambada)
    return {{"perplexity", scores.at(0).loglikelihood}, {"acc", scores.at(0).greedy ? 1 : 0}};
  if (is_multiple_choice(kind)) {
    const ChoiceOutcome c = choose(doc, scores);
    return {{"acc", c.acc}, {"acc_norm", c.acc_norm}};
  }
  const double ll = scores.at(0).loglikelihood;
  return {{"word_perplexity", {ll, doc.words}}, {"byte_perplexity", {ll, doc.bytes}}, {"bits_per_byte", {ll, doc.bytes}}};
}

std::vector<MetricValue> aggregate(TaskKind kind, const std::vector<EvalDoc>& docs,
                                   const std::vector<std::vector<RequestScore>>& scores, int64_t bootstrap_iters) {
  if (docs.size() != scores.size() || docs.empty())
    throw std::invalid_argument("aggregate: expected one score list per document");
  const bool stderr_wanted = bootstrap_iters > 0 && docs.size() > 1;
  auto with_mean_stderr = [&](std::string name, const std::vector<double>& xs) {
    return MetricValue{std::move(name), mean(xs), stderr_wanted ? std::optional(mean_stderr(xs)) : std::nullopt, true};
  };
  if (kind == TaskKind::kLambada) {
    std::vector<double> lls, acc;
    for (const auto& s : scores) {
      lls.push_back(s.at(0).loglikelihood);
      acc.push_back(s.at(0).greedy ? 1.0 : 0.0);
    }
    MetricValue ppl{"perplexity", std::exp(-mean(lls)),
                    stderr_wanted ? std::optional(perplexity_bootstrap_stderr(lls, bootstrap_iters)) : std::nullopt,
                    false};
    return {ppl, with_mean_stderr("acc", acc)};
  }
  if (is_multiple_choice(kind)) {
    std::vector<double> acc, acc_norm;
    for (size_t i = 0; i < docs.size(); ++i) {
      const ChoiceOutcome c = choose(docs[i], scores[i]);
      acc.push_back(c.acc);
      acc_norm.push_back(c.acc_norm);
    }
    return {with_mean_stderr("acc", acc), with_mean_stderr("acc_norm", acc_norm)};
  }
  double ll = 0, words = 0, bytes = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    ll += scores[i].at(0).loglikelihood;
    words += static_cast<double>(docs[i].words);
    bytes += static_cast<double>(docs[i].bytes);
  }
  return {MetricValue{"word_perplexity", std::exp(-ll / words), std::nullopt, false},
          MetricValue{"byte_perplexity", std::exp(-ll / bytes), std::nullopt, false},
          MetricValue{"bits_per_byte", -ll / bytes / std::log(2.0), std::nullopt, false}};
}

}  // namespace loom::eval
