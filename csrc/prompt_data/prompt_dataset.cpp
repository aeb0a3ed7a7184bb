#include "prompt_data/prompt_dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "data/input_stream.h"

namespace loom::prompt_data {
namespace {

bool blank(const std::string& line) { return line.find_first_not_of(" \t\r\n\f\v") == std::string::npos; }

std::string fields_list(const ParsedTemplate& t) {
  std::string out = "[";
  for (size_t i = 0; i < t.spec.prompt_template_fields.size(); ++i)
    out += (i ? ", " : "") + t.spec.prompt_template_fields[i];
  return out + "]";
}

// "a number", "an array", ...
std::string a_type(const nlohmann::json& j) {
  const std::string t = j.type_name();
  return (t == "array" || t == "object") ? "an " + t : "a " + t;
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

PromptDataset::PromptDataset(const std::vector<std::string>& files, std::vector<ParsedTemplate> templates,
                             const data::Tokenizer& tokenizer, const ExampleOptions& options,
                             const std::string& default_task)
    : files_(files),
      templates_(std::move(templates)),
      options_(options),
      default_task_(default_task),
      dropped_(templates_.size(), 0) {
  if (options_.max_seq_length < 1) {
    throw data::DataError(
        fmt::format("prompt dataset: max_seq_length is {}; expected at least 1", options_.max_seq_length));
  }
  if (!default_task_.empty() && find_task(templates_, default_task_) < 0) {
    throw data::DataError(fmt::format("prompt dataset: unknown default task '{}'; expected one of the tasks {}",
                                      default_task_, task_names(templates_)));
  }
  for (size_t f = 0; f < files_.size(); ++f) read_file(files_[f], static_cast<int32_t>(f), tokenizer);
}

void PromptDataset::read_file(const std::string& path, int32_t file_index, const data::Tokenizer& tokenizer) {
  if (!std::ifstream(path, std::ios::binary))
    throw data::DataError(fmt::format("{}: cannot open the JSONL file ({})", path, std::strerror(errno)));
  data::LineStream in(path, data::kMaxRecordLineBytes, "a record is at most one line of 64 MiB");
  std::string line;
  int64_t line_no = 0, records_in_file = 0;
  while (in.next_line(line)) {
    ++line_no;
    if (blank(line)) continue;
    ++records_in_file;
    const std::string where = fmt::format("{}:{}: ", path, line_no);
    auto fail = [&](const std::string& message) { throw data::DataError(where + message); };

    // Parse, noticing a key given twice in the record (nlohmann keeps the last silently).
    std::set<std::string> keys;
    std::string duplicate;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line, [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        if (event == nlohmann::json::parse_event_t::key && depth == 1 && duplicate.empty()) {
          const std::string k = parsed.get<std::string>();
          if (!keys.insert(k).second) duplicate = k;
        }
        return true;
      });
    } catch (const nlohmann::json::exception& e) {
      fail(fmt::format("not valid JSON ({}); expected one JSON object per line", e.what()));
    }
    if (!j.is_object()) fail(fmt::format("expected a JSON object (one record per line), found {}", a_type(j)));
    if (!duplicate.empty()) fail(fmt::format("key '{}' appears twice in the record", duplicate));

    auto name_it = j.find("taskname");
    if (name_it == j.end() && default_task_.empty()) {
      fail(fmt::format("the record has no 'taskname'; expected one of the tasks {}", task_names(templates_)));
    }
    if (name_it != j.end() && !name_it->is_string()) {
      fail(fmt::format("'taskname' is {}; expected a string naming one of the tasks {}", a_type(*name_it),
                       task_names(templates_)));
    }
    const std::string taskname = name_it == j.end() ? default_task_ : name_it->get<std::string>();
    const int64_t task = find_task(templates_, taskname);
    if (task < 0) fail(fmt::format("unknown task '{}'; expected one of the tasks {}", taskname, task_names(templates_)));
    const ParsedTemplate& tmpl = templates_[static_cast<size_t>(task)];

    PromptRecord record;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "taskname") continue;
      bool known = false;
      for (const auto& f : tmpl.spec.prompt_template_fields) known = known || f == it.key();
      if (!known) {
        fail(fmt::format("task '{}': key '{}' is not a field of the task; expected 'taskname' or one of "
                         "prompt_template_fields {}",
                         taskname, it.key(), fields_list(tmpl)));
      }
      if (!it.value().is_string()) {
        fail(fmt::format("task '{}': field '{}' is {}; expected a string", taskname, it.key(), a_type(it.value())));
      }
      record.emplace(it.key(), it.value().get<std::string>());
    }
    if (auto problem = record_problem(record, tmpl, !options_.for_inference)) fail(*problem);

    auto ex = make_prompt_example(record, task, tmpl, tokenizer, options_);
    if (!ex) {
      ++dropped_[static_cast<size_t>(task)];
      continue;
    }
    if (ex->truncated > 0) ++truncated_;
    examples_.push_back(std::move(*ex));
    records_.push_back(std::move(record));
    sources_.emplace_back(file_index, line_no);
  }
  records_per_file_.push_back(records_in_file);
  lines_per_file_.push_back(line_no);
}

std::string PromptDataset::source(int64_t i) const {
  const auto& [f, line] = sources_.at(static_cast<size_t>(i));
  return fmt::format("{}:{}", files_[static_cast<size_t>(f)], line);
}

int64_t PromptDataset::dropped() const {
  int64_t n = 0;
  for (int64_t d : dropped_) n += d;
  return n;
}

std::vector<int64_t> PromptDataset::examples_per_task() const {
  std::vector<int64_t> n(templates_.size(), 0);
  for (const auto& ex : examples_) ++n[static_cast<size_t>(ex.task)];
  return n;
}

int64_t PromptDataset::longest_input() const {
  int64_t longest = 0;
  for (const auto& ex : examples_) longest = std::max(longest, ex.size() - 1);
  return longest;
}

std::string PromptDataset::summary() const {
  auto per_task = [&](const std::vector<int64_t>& counts) {
    std::string out;
    for (size_t t = 0; t < counts.size(); ++t) {
      if (counts[t] == 0) continue;
      out += fmt::format("{}task '{}': {}", out.empty() ? "" : ", ", templates_[t].taskname(), counts[t]);
    }
    return out;
  };
  std::string out = fmt::format("{} example{} from {} file{}", size(), size() == 1 ? "" : "s", files_.size(),
                                files_.size() == 1 ? "" : "s");
  if (size() > 0) out += " (" + per_task(examples_per_task()) + ")";
  if (dropped() > 0) {
    out += fmt::format("; {} record{} longer than max_seq_length {} dropped ({})", dropped(),
                       dropped() == 1 ? "" : "s", options_.max_seq_length, per_task(dropped_));
  }
  if (truncated_ > 0) out += fmt::format("; {} truncated", truncated_);
  return out;
}

int64_t round_sequence_length(int64_t longest_input, int64_t max_seq_length, int64_t multiple,
                              int64_t required_multiple) {
  if (required_multiple < 1 || multiple < 1 || multiple % required_multiple != 0) {
    throw std::invalid_argument(fmt::format(
        "round_sequence_length: multiple {} must be a positive multiple of required_multiple {}", multiple,
        required_multiple));
  }
  if (longest_input < 1) throw data::DataError("prompt data: no examples to size the sequence length from");
  if (longest_input > max_seq_length - 1) {
    throw data::DataError(fmt::format("prompt data: the longest model input is {} tokens; expected at most "
                                      "max_seq_length - 1 = {}",
                                      longest_input, max_seq_length - 1));
  }
  const int64_t preferred = round_up(longest_input, multiple);
  if (preferred <= max_seq_length) return preferred;
  const int64_t required = round_up(longest_input, required_multiple);
  if (required <= max_seq_length) return required;
  throw data::DataError(fmt::format(
      "prompt data: the longest model input is {} tokens; rounded up to a multiple of {} (sequence parallelism) it "
      "is {}, above max_seq_length {}; expected max_seq_length to be a multiple of {}",
      longest_input, required_multiple, required, max_seq_length, required_multiple));
}

int64_t run_sequence_length(const std::vector<const PromptDataset*>& datasets, int64_t multiple,
                            int64_t required_multiple) {
  if (datasets.empty()) throw std::invalid_argument("run_sequence_length: no datasets");
  int64_t longest = 0;
  const int64_t max_seq_length = datasets.front()->options().max_seq_length;
  for (const PromptDataset* d : datasets) {
    if (d->options().for_inference) {
      throw std::invalid_argument("run_sequence_length: an inference dataset has no labels to size batches by");
    }
    if (d->options().max_seq_length != max_seq_length) {
      throw std::invalid_argument(fmt::format("run_sequence_length: datasets with max_seq_length {} and {}",
                                              max_seq_length, d->options().max_seq_length));
    }
    longest = std::max(longest, d->longest_input());
  }
  return round_sequence_length(longest, max_seq_length, multiple, required_multiple);
}

}  // namespace loom::prompt_data
