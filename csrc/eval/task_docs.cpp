#include "eval/task_docs.h"

#include <fmt/format.h>

#include <filesystem>
#include <cstring>
#include <fstream>
#include <set>

#include "data/data_error.h"
#include "data/input_stream.h"
#include "eval/eval_error.h"
#include "eval/text_rules.h"

namespace fs = std::filesystem;

namespace loom::eval {

namespace {

constexpr std::pair<const char*, TaskKind> kKinds[] = {
    {"lambada", TaskKind::kLambada}, {"mc", TaskKind::kMultipleChoice}, {"hellaswag", TaskKind::kHellaswag},
    {"piqa", TaskKind::kPiqa},       {"arc", TaskKind::kArc},           {"wikitext", TaskKind::kWikitext},
    {"rolling", TaskKind::kRolling}};

std::string known_kinds() {
  std::string out;
  for (const auto& [name, kind] : kKinds) out += (out.empty() ? "" : ", ") + std::string(name);
  return out;
}

std::string type_name(const nlohmann::json& v) {
  return v.is_null() ? "null" : v.is_string() ? "a string" : v.is_boolean() ? "a boolean"
       : v.is_number() ? "a number" : v.is_array() ? "an array" : "an object";
}

// Field readers: `where` is "FILE:LINE".
const nlohmann::json& field(const nlohmann::json& rec, const char* name, const std::string& where) {
  auto it = rec.find(name);
  if (it == rec.end()) throw EvalInputError(fmt::format("{}: field \"{}\" is missing", where, name));
  return *it;
}

std::string string_field(const nlohmann::json& rec, const char* name, const std::string& where) {
  const auto& v = field(rec, name, where);
  if (!v.is_string())
    throw EvalInputError(fmt::format("{}: field \"{}\": expected a string, found {}", where, name, type_name(v)));
  return v.get<std::string>();
}

// An integer, or a string of decimal digits (HellaSwag writes its label as "3"; the harness
// reads it with int()).
int64_t index_field(const nlohmann::json& rec, const char* name, const std::string& where) {
  const auto& v = field(rec, name, where);
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) {
    const std::string s = std::string(strip(v.get<std::string>()));
    if (!s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos) return std::stoll(s);
  }
  throw EvalInputError(fmt::format("{}: field \"{}\": expected an integer index, found {}", where, name,
                                   v.is_string() ? "'" + v.get<std::string>() + "'" : type_name(v)));
}

std::vector<std::string> string_list(const nlohmann::json& v, const std::string& name, const std::string& where) {
  if (!v.is_array())
    throw EvalInputError(fmt::format("{}: field \"{}\": expected an array of strings, found {}", where, name, type_name(v)));
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string())
      throw EvalInputError(fmt::format("{}: field \"{}\"[{}]: expected a string, found {}", where, name, i, type_name(v[i])));
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

void set_choices(EvalDoc& doc, const std::string& context, std::vector<std::string> choices, int64_t gold,
                 const std::string& gold_field, const std::string& where) {
  if (choices.size() < 2)
    throw EvalInputError(fmt::format("{}: expected at least 2 choices, found {}", where, choices.size()));
  if (gold < 0 || gold >= static_cast<int64_t>(choices.size()))
    throw EvalInputError(fmt::format("{}: field \"{}\": gold index {} is out of range for {} choices", where,
                                     gold_field, gold, choices.size()));
  for (const auto& c : choices) doc.requests.push_back({context, " " + c});
  doc.choices = std::move(choices);
  doc.gold = gold;
}

void fill_doc(EvalDoc& doc, TaskKind kind, const std::string& where) {
  const nlohmann::json& rec = doc.record;
  switch (kind) {
    case TaskKind::kLambada: {
      // The harness's templates: "{{text.split(' ')[:-1]|join(' ')}}" and "{{' '+text.split(' ')[-1]}}".
      const auto words = split_on_space(string_field(rec, "text", where));
      std::string context;
      for (size_t i = 0; i + 1 < words.size(); ++i) context += (i ? " " : "") + words[i];
      doc.target = " " + words.back();
      doc.requests.push_back({context, doc.target});
      return;
    }
    case TaskKind::kMultipleChoice:
      set_choices(doc, string_field(rec, "context", where), string_list(field(rec, "choices", where), "choices", where),
                  index_field(rec, "gold", where), "gold", where);
      return;
    case TaskKind::kHellaswag: {
      const std::string ctx = string_field(rec, "ctx_a", where) + " " + capitalize_ascii(string_field(rec, "ctx_b", where));
      const std::string query = hellaswag_preprocess(string_field(rec, "activity_label", where) + ": " + ctx);
      std::vector<std::string> endings = string_list(field(rec, "endings", where), "endings", where);
      for (auto& e : endings) e = hellaswag_preprocess(e);
      set_choices(doc, query, std::move(endings), index_field(rec, "label", where), "label", where);
      return;
    }
    case TaskKind::kPiqa:
      set_choices(doc, "Question: " + string_field(rec, "goal", where) + "\nAnswer:",
                  {string_field(rec, "sol1", where), string_field(rec, "sol2", where)}, index_field(rec, "label", where),
                  "label", where);
      return;
    case TaskKind::kArc: {
      const auto& choices = field(rec, "choices", where);
      if (!choices.is_object())
        throw EvalInputError(fmt::format("{}: field \"choices\": expected an object {{\"text\": [...], \"label\": [...]}}, found {}",
                                         where, type_name(choices)));
      auto text = string_list(field(choices, "text", where), "choices.text", where);
      auto labels = string_list(field(choices, "label", where), "choices.label", where);
      if (labels.size() != text.size())
        throw EvalInputError(fmt::format("{}: field \"choices\": {} texts but {} labels", where, text.size(), labels.size()));
      const std::string key = string_field(rec, "answerKey", where);
      int64_t gold = -1;
      for (size_t i = 0; i < labels.size() && gold < 0; ++i)
        if (labels[i] == key) gold = static_cast<int64_t>(i);
      if (gold < 0)
        throw EvalInputError(fmt::format("{}: field \"answerKey\": '{}' is none of the choice labels", where, key));
      set_choices(doc, "Question: " + string_field(rec, "question", where) + "\nAnswer:", std::move(text), gold,
                  "answerKey", where);
      return;
    }
    case TaskKind::kWikitext: {
      // The harness counts words and bytes of the page as stored, and scores the detokenized text.
      const std::string page = string_field(rec, "page", where);
      doc.target = wikitext_detokenize(page);
      doc.words = count_words(page);
      doc.bytes = static_cast<int64_t>(page.size());
      return;
    }
    case TaskKind::kRolling:
      doc.target = string_field(rec, "text", where);
      doc.words = count_words(doc.target);
      doc.bytes = static_cast<int64_t>(doc.target.size());
      return;
  }
}

std::string default_name(const std::string& path) {
  std::string name = fs::path(path).filename().string();
  for (const char* ext : {".jsonl", ".json"})
    if (name.size() > std::strlen(ext) && name.compare(name.size() - std::strlen(ext), std::string::npos, ext) == 0) return name.substr(0, name.size() - std::strlen(ext));
  return name;
}

TaskSpec parse_one(const std::string& item, const std::string& what, const fs::path& base) {
  std::string rest = std::string(strip(item)), name;
  const size_t eq = rest.find('=');
  const size_t colon = rest.find(':');
  if (eq != std::string::npos && (colon == std::string::npos || eq < colon)) {
    name = rest.substr(0, eq);
    rest = rest.substr(eq + 1);
    if (name.empty()) throw EvalInputError(fmt::format("{}: '{}': the task name before '=' is empty", what, item));
  }
  const size_t sep = rest.find(':');
  if (sep == std::string::npos) {
    (void)task_kind(rest);  // an unknown word is reported as an unknown kind
    throw EvalInputError(fmt::format("{}: '{}': a {} task needs its file: {}:PATH (Loom ships no benchmark data; "
                                     "README \"Evaluate and export\" says where the real files are)",
                                     what, item, rest, rest));
  }
  TaskSpec spec;
  spec.kind = task_kind(rest.substr(0, sep));
  spec.path = rest.substr(sep + 1);
  if (spec.path.empty()) throw EvalInputError(fmt::format("{}: '{}': the file after ':' is empty", what, item));
  if (!base.empty() && fs::path(spec.path).is_relative()) spec.path = (base / spec.path).string();
  spec.name = name.empty() ? default_name(spec.path) : name;
  return spec;
}

void check_unique(const std::vector<TaskSpec>& specs, const std::string& what) {
  std::set<std::string> seen;
  for (const auto& s : specs)
    if (!seen.insert(s.name).second)
      throw EvalInputError(fmt::format("{}: two tasks are named '{}'; name them with NAME=KIND:PATH", what, s.name));
}

}  // namespace

TaskKind task_kind(const std::string& name) {
  for (const auto& [n, kind] : kKinds)
    if (name == n) return kind;
  throw EvalInputError(fmt::format("unknown task kind '{}': expected one of {}", name, known_kinds()));
}

std::string kind_name(TaskKind kind) {
  for (const auto& [n, k] : kKinds)
    if (k == kind) return n;
  return "?";
}

std::string output_type(TaskKind kind) {
  switch (kind) {
    case TaskKind::kLambada: return "loglikelihood";
    case TaskKind::kWikitext:
    case TaskKind::kRolling: return "loglikelihood_rolling";
    default: return "multiple_choice";
  }
}

std::vector<TaskSpec> parse_task_specs(const std::string& list, const std::string& what) {
  std::vector<TaskSpec> specs;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    const std::string item = list.substr(start, comma - start);
    if (!strip(item).empty()) {
      try {
        specs.push_back(parse_one(item, what, {}));
      } catch (const EvalInputError& e) {
        const std::string msg = e.what();
        throw EvalInputError(msg.rfind(what, 0) == 0 ? msg : what + ": '" + item + "': " + msg);
      }
    }
    start = comma + 1;
  }
  if (specs.empty()) throw EvalInputError(what + ": no tasks given (expected KIND:PATH[,KIND:PATH...])");
  check_unique(specs, what);
  return specs;
}

std::vector<TaskSpec> read_task_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw EvalInputError("--task-file " + path + ": cannot open the file");
  const fs::path base = fs::path(path).parent_path();
  std::vector<TaskSpec> specs;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    if (strip(line).empty()) continue;
    const std::string where = fmt::format("{}:{}", path, n);
    try {
      specs.push_back(parse_one(line, where, base.empty() ? fs::path(".") : base));
    } catch (const EvalInputError& e) {
      const std::string msg = e.what();
      throw EvalInputError(msg.rfind(where, 0) == 0 ? msg : where + ": " + msg);
    }
  }
  if (specs.empty()) throw EvalInputError("--task-file " + path + ": no tasks in the file");
  check_unique(specs, "--task-file " + path);
  return specs;
}

namespace {

// Line `n` of a task's file into `task` (blank lines skipped; at most `limit` documents kept
// when limit > 0, all counted).
void read_doc(EvalTask& task, const std::string& line, int64_t n, int64_t limit) {
  if (strip(line).empty()) return;
  const std::string where = fmt::format("{}:{}", task.spec.path, n);
  EvalDoc doc;
  doc.line = n;
  try {
    doc.record = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    throw EvalInputError(fmt::format("{}: not valid JSON ({})", where, e.what()));
  }
  if (!doc.record.is_object())
    throw EvalInputError(fmt::format("{}: expected a JSON object, found {}", where, type_name(doc.record)));
  fill_doc(doc, task.spec.kind, where);
  ++task.total_docs;
  if (limit <= 0 || static_cast<int64_t>(task.docs.size()) < limit) task.docs.push_back(std::move(doc));
}

}  // namespace

EvalTask read_task(const TaskSpec& spec, int64_t limit) {
  if (!std::ifstream(spec.path, std::ios::binary))
    throw EvalInputError(fmt::format("task {}: cannot open {}", spec.name, spec.path));
  EvalTask task{spec, {}};
  try {
    data::LineStream in(spec.path, data::kMaxRecordLineBytes, "a document is at most one line of 64 MiB");
    std::string line;
    for (int64_t n = 1; in.next_line(line); ++n) read_doc(task, line, n, limit);
  } catch (const data::DataError& e) {  // the file itself: a line past the limit, bad compression
    throw EvalInputError(fmt::format("task {}: {}", spec.name, e.what()));
  }
  if (task.docs.empty())
    throw EvalInputError(fmt::format("{}: task {} ({}) holds no documents", spec.path, spec.name, kind_name(spec.kind)));
  return task;
}

}  // namespace loom::eval
