#include "runlog/record_scalars.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace loom::runlog {

std::vector<Scalar> record_scalars(const nlohmann::json& record) {
  std::vector<Scalar> out;
  if (!record.is_object()) return out;
  const std::string kind = record.value("kind", "train");
  for (const auto& [key, value] : record.items()) {
    if (key == "step" || key == "max_steps" || !value.is_number()) continue;
    out.push_back({kind + "/" + key, value.get<double>()});
  }
  if (record.contains("val_loss") && record["val_loss"].is_number())
    out.push_back({kind + "/val_perplexity", std::exp(record["val_loss"].get<double>())});
  return out;
}

std::vector<Scalar> eval_result_scalars(const nlohmann::json& results) {
  std::vector<Scalar> out;
  if (!results.is_object() || !results.contains("results")) return out;
  for (const auto& [task, metrics] : results["results"].items()) {
    if (!metrics.is_object()) continue;
    for (const auto& [key, value] : metrics.items()) {
      if (!value.is_number()) continue;
      std::string metric = key;
      const auto comma = metric.find(',');
      if (comma != std::string::npos) metric.resize(comma);
      out.push_back({"eval/" + task + "/" + metric, value.get<double>()});
    }
  }
  return out;
}

}  // namespace loom::runlog
