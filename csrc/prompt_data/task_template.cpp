#include "prompt_data/task_template.h"

#include <fmt/format.h>

#include <map>
#include <set>
#include <utility>

namespace loom::prompt_data {
namespace {

constexpr const char* kMarkerStem = "<|VIRTUAL_PROMPT";  // "<|VIRTUAL_PROMPT_k|>"

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

std::string join(const std::vector<int64_t>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + std::to_string(items[i]);
  return out;
}

// At most `n` bytes of `s` from `pos`, with "..." when cut.
std::string excerpt(const std::string& s, size_t pos, size_t n = 24) {
  if (s.size() - pos <= n) return s.substr(pos);
  return s.substr(pos, n) + "...";
}

// Checks one task and, when `out` is given and the task is fine, fills it.
class TaskChecker {
 public:
  TaskChecker(const config::TaskTemplate& t, int64_t index, std::optional<int64_t> max_seq_length,
              std::vector<TemplateProblem>& problems)
      : t_(t), index_(index), max_seq_length_(max_seq_length), problems_(problems) {
    who_ = t.taskname.empty() ? fmt::format("task_templates[{}] (empty taskname)", index)
                              : fmt::format("task '{}'", t.taskname);
  }

  bool run(ParsedTemplate* out) {
    const size_t before = problems_.size();
    check_name();
    check_fields();
    const bool splits_ok = check_splits();
    const bool template_ok = scan_template();
    if (template_ok) check_placeholders();
    if (template_ok) check_markers(splits_ok);
    check_answer(template_ok);
    check_truncate();
    if (problems_.size() != before) return false;
    if (out) {
      out->spec = t_;
      out->pieces = std::move(pieces_);
      out->answer_piece.reset();
      out->truncate_piece.reset();
      for (size_t i = 0; i < out->pieces.size(); ++i) {
        const auto& p = out->pieces[i];
        if (p.kind != TemplatePiece::Kind::kField) continue;
        if (t_.answer_field && p.field == *t_.answer_field) out->answer_piece = i;
        if (t_.truncate_field && p.field == *t_.truncate_field) out->truncate_piece = i;
      }
    }
    return true;
  }

 private:
  void problem(const std::string& key, const std::string& message) {
    problems_.push_back({index_, key, who_ + ": " + message});
  }

  bool listed(const std::string& field) const {
    for (const auto& f : t_.prompt_template_fields)
      if (f == field) return true;
    return false;
  }

  std::string fields_list() const { return "[" + join(t_.prompt_template_fields) + "]"; }

  void check_name() {
    if (t_.taskname.empty()) problem("taskname", "taskname is empty; expected a non-empty task name");
  }

  void check_fields() {
    std::set<std::string> seen;
    for (size_t j = 0; j < t_.prompt_template_fields.size(); ++j) {
      const std::string& f = t_.prompt_template_fields[j];
      if (f.empty()) {
        problem("prompt_template_fields", fmt::format("prompt_template_fields[{}] is empty; expected a field name", j));
      } else if (f == "taskname") {
        problem("prompt_template_fields",
                fmt::format("prompt_template_fields[{}] is 'taskname', the record key that names the task; "
                            "expected another field name",
                            j));
      } else if (f.find_first_of("{}") != std::string::npos) {
        problem("prompt_template_fields",
                fmt::format("prompt_template_fields[{}] '{}' contains a brace; expected a name that can be written "
                            "as a {{field}} placeholder",
                            j, f));
      } else if (!seen.insert(f).second) {
        problem("prompt_template_fields", fmt::format("prompt_template_fields lists '{}' twice; expected each field once", f));
      }
    }
  }

  bool check_splits() {
    bool ok = true;
    if (t_.total_virtual_tokens < 0) {
      problem("total_virtual_tokens",
              fmt::format("total_virtual_tokens is {}; expected a number >= 0", t_.total_virtual_tokens));
      ok = false;
    }
    int64_t sum = 0;
    for (size_t k = 0; k < t_.virtual_token_splits.size(); ++k) {
      const int64_t v = t_.virtual_token_splits[k];
      if (v < 1) {
        problem("virtual_token_splits",
                fmt::format("virtual_token_splits[{}] is {}; expected a positive number of virtual tokens", k, v));
        ok = false;
      } else if (sum > (int64_t{1} << 40)) {
        ok = false;  // absurd; the sum check below reports it
      } else {
        sum += v;
      }
    }
    if (ok && sum != t_.total_virtual_tokens) {
      problem("virtual_token_splits",
              fmt::format("virtual_token_splits [{}] sum to {}, expected total_virtual_tokens {}",
                          join(t_.virtual_token_splits), sum, t_.total_virtual_tokens));
      ok = false;
    }
    if (max_seq_length_ && t_.total_virtual_tokens >= 0 && t_.total_virtual_tokens >= *max_seq_length_) {
      problem("total_virtual_tokens",
              fmt::format("total_virtual_tokens {} does not fit max_seq_length {}; expected fewer virtual tokens "
                          "than max_seq_length (a record needs tokens of its own)",
                          t_.total_virtual_tokens, *max_seq_length_));
    }
    return ok;
  }

  void add_text(const std::string& s, size_t from, size_t to) {
    if (to <= from) return;
    if (!pieces_.empty() && pieces_.back().kind == TemplatePiece::Kind::kText) {
      pieces_.back().text += s.substr(from, to - from);
      return;
    }
    TemplatePiece p;
    p.kind = TemplatePiece::Kind::kText;
    p.text = s.substr(from, to - from);
    pieces_.push_back(std::move(p));
  }

  // Splits prompt_template into pieces; false (with problems) on a syntax error.
  bool scan_template() {
    const std::string& s = t_.prompt_template;
    const std::string stem = kMarkerStem;
    bool ok = true;
    size_t text_from = 0, i = 0;
    while (i < s.size()) {
      if (s.compare(i, stem.size(), stem) == 0) {
        i = scan_marker(i, text_from, ok);
      } else if (s[i] == '{') {
        i = scan_placeholder(i, text_from, ok);
      } else if (s[i] == '}') {
        problem("prompt_template",
                fmt::format("prompt_template has an unmatched '}}' at offset {}; braces are reserved for "
                            "{{field}} placeholders",
                            i));
        ok = false;
        i = text_from = i + 1;
      } else {
        ++i;
      }
    }
    add_text(s, text_from, s.size());
    return ok;
  }

  // The k of the "<|VIRTUAL_PROMPT_k|>" marker at `i` of prompt_template (digits, no leading
  // zeros) and the offset after it; k = -1 when the marker is malformed.
  std::pair<int64_t, size_t> parse_marker(size_t i) const {
    const std::string& s = t_.prompt_template;
    const size_t j = i + std::string(kMarkerStem).size();
    if (j < s.size() && s[j] == '_') {
      size_t d = j + 1, e = d;
      while (e < s.size() && e - d < 10 && s[e] >= '0' && s[e] <= '9') ++e;
      const bool digits_ok = e > d && !(s[d] == '0' && e - d > 1);
      if (digits_ok && s.compare(e, 2, "|>") == 0) return {std::stoll(s.substr(d, e - d)), e + 2};
    }
    return {-1, j};
  }

  // The marker starting at `i`: a virtual-token piece, or a problem (scanning resumes after the
  // stem). Returns the offset where scanning continues (also the new `text_from`).
  size_t scan_marker(size_t i, size_t& text_from, bool& ok) {
    const std::string& s = t_.prompt_template;
    const auto [k, end] = parse_marker(i);
    if (k < 0) {
      problem("prompt_template",
              fmt::format("prompt_template has a malformed marker '{}' at offset {}; expected "
                          "<|VIRTUAL_PROMPT_k|> with k = 0, 1, ...",
                          excerpt(s, i), i));
      ok = false;
      return text_from = end;
    }
    add_text(s, text_from, i);
    TemplatePiece p;
    p.kind = TemplatePiece::Kind::kVirtual;
    p.marker = k;
    pieces_.push_back(p);
    return text_from = end;
  }

  // The "{field}" placeholder opening at `i`: a field piece (taking the space before it), or a
  // problem. Returns the offset where scanning continues (also the new `text_from`).
  size_t scan_placeholder(size_t i, size_t& text_from, bool& ok) {
    const std::string& s = t_.prompt_template;
    const size_t close = s.find_first_of("{}", i + 1);
    if (close == std::string::npos || s[close] == '{') {
      problem("prompt_template",
              fmt::format("prompt_template has an unmatched '{{' at offset {} ('{}'); braces are reserved "
                          "for {{field}} placeholders",
                          i, excerpt(s, i)));
      ok = false;
      return text_from = i + 1;
    }
    const std::string name = s.substr(i + 1, close - i - 1);
    if (name.empty()) {
      problem("prompt_template", fmt::format("prompt_template has an empty placeholder {{}} at offset {}", i));
      ok = false;
    } else if (!listed(name)) {
      problem("prompt_template", fmt::format("prompt_template has placeholder {{{}}}, which is not in "
                                             "prompt_template_fields {}",
                                             name, fields_list()));
      ok = false;
    }
    // A space right before the placeholder belongs to the field (see the header).
    bool space = false;
    size_t text_end = i;
    if (text_end > text_from && s[text_end - 1] == ' ') {
      space = true;
      --text_end;
    }
    add_text(s, text_from, text_end);
    TemplatePiece p;
    p.kind = TemplatePiece::Kind::kField;
    p.field = name;
    p.leading_space = space;
    pieces_.push_back(std::move(p));
    return text_from = close + 1;
  }

  void check_placeholders() {
    std::map<std::string, int> count;
    for (const auto& p : pieces_)
      if (p.kind == TemplatePiece::Kind::kField) ++count[p.field];
    std::set<std::string> reported;
    for (const auto& f : t_.prompt_template_fields) {
      if (f.empty() || !reported.insert(f).second) continue;
      const int n = count[f];
      if (n == 0) {
        problem("prompt_template_fields",
                fmt::format("prompt_template_fields lists '{}' but prompt_template has no {{{}}} placeholder", f, f));
      } else if (n > 1) {
        problem("prompt_template",
                fmt::format("prompt_template has {} placeholders {{{}}}; expected exactly one per field", n, f));
      }
    }
  }

  void check_markers(bool splits_ok) {
    std::vector<TemplatePiece*> markers;
    for (auto& p : pieces_)
      if (p.kind == TemplatePiece::Kind::kVirtual) markers.push_back(&p);
    bool ok = true;
    if (markers.size() != t_.virtual_token_splits.size()) {
      problem("prompt_template",
              fmt::format("prompt_template has {} <|VIRTUAL_PROMPT_k|> marker{} but virtual_token_splits has {} "
                          "entr{}; expected one marker per split",
                          markers.size(), markers.size() == 1 ? "" : "s", t_.virtual_token_splits.size(),
                          t_.virtual_token_splits.size() == 1 ? "y" : "ies"));
      ok = false;
    }
    for (size_t i = 0; i < markers.size(); ++i) {
      if (markers[i]->marker != static_cast<int64_t>(i)) {
        problem("prompt_template",
                fmt::format("marker {} of prompt_template is <|VIRTUAL_PROMPT_{}|>; expected "
                            "<|VIRTUAL_PROMPT_{}|> (markers are numbered 0, 1, ... in template order, each once)",
                            i, markers[i]->marker, i));
        ok = false;
        break;
      }
    }
    if (!ok || !splits_ok) return;
    int64_t first = 0;
    for (size_t i = 0; i < markers.size(); ++i) {
      markers[i]->first_virtual = first;
      markers[i]->num_virtual = t_.virtual_token_splits[i];
      first += t_.virtual_token_splits[i];
    }
  }

  void check_answer(bool template_ok) {
    if (t_.answer_only_loss && !t_.answer_field) {
      problem("answer_field", "answer_only_loss is true but answer_field is null; expected the field that holds "
                              "the answer");
    }
    if (!t_.answer_field) return;
    const std::string& a = *t_.answer_field;
    if (!listed(a)) {
      problem("answer_field", fmt::format("answer_field '{}' is not in prompt_template_fields {}", a, fields_list()));
      return;
    }
    if (!template_ok) return;
    int placeholders = 0;
    for (const auto& p : pieces_) placeholders += p.kind == TemplatePiece::Kind::kField && p.field == a;
    if (placeholders != 1) return;  // reported by check_placeholders
    const std::string placeholder = "{" + a + "}";
    const std::string& s = t_.prompt_template;
    const bool last = !pieces_.empty() && pieces_.back().kind == TemplatePiece::Kind::kField &&
                      pieces_.back().field == a && s.size() >= placeholder.size() &&
                      s.compare(s.size() - placeholder.size(), placeholder.size(), placeholder) == 0;
    if (!last) {
      const size_t tail = s.size() > 24 ? s.size() - 24 : 0;
      problem("answer_field",
              fmt::format("answer_field '{}' must end prompt_template: expected it to end with {}, found '{}{}'", a,
                          placeholder, tail ? "..." : "", s.substr(tail)));
    }
  }

  void check_truncate() {
    if (!t_.truncate_field) return;
    const std::string& f = *t_.truncate_field;
    if (!listed(f)) {
      problem("truncate_field", fmt::format("truncate_field '{}' is not in prompt_template_fields {}", f, fields_list()));
    } else if (t_.answer_field && f == *t_.answer_field) {
      problem("truncate_field",
              fmt::format("truncate_field '{}' is the answer_field; expected another field (the answer is never cut)", f));
    }
  }

  const config::TaskTemplate& t_;
  int64_t index_;
  std::optional<int64_t> max_seq_length_;
  std::vector<TemplateProblem>& problems_;
  std::string who_;
  std::vector<TemplatePiece> pieces_;
};

std::string problems_text(const std::vector<TemplateProblem>& problems) {
  std::string out;
  for (size_t i = 0; i < problems.size(); ++i) out += (i ? "\n" : "") + problems[i].message;
  return out;
}

}  // namespace

std::string TemplateProblem::path(const std::string& prefix) const {
  if (task_index < 0) return prefix + (key.empty() ? "" : "." + key);
  return fmt::format("{}[{}]{}", prefix, task_index, key.empty() ? "" : "." + key);
}

TemplateError::TemplateError(std::vector<TemplateProblem> p)
    : data::DataError(problems_text(p)), problems(std::move(p)) {}

std::vector<TemplateProblem> find_template_problems(const std::vector<config::TaskTemplate>& tasks,
                                                    std::optional<int64_t> max_seq_length) {
  std::vector<TemplateProblem> problems;
  if (tasks.empty()) problems.push_back({-1, "", "task_templates is empty; expected at least one task"});
  std::map<std::string, size_t> first_use;
  for (size_t i = 0; i < tasks.size(); ++i) {
    TaskChecker(tasks[i], static_cast<int64_t>(i), max_seq_length, problems).run(nullptr);
    const std::string& name = tasks[i].taskname;
    if (name.empty()) continue;
    auto [it, fresh] = first_use.emplace(name, i);
    if (!fresh) {
      problems.push_back({static_cast<int64_t>(i), "taskname",
                          fmt::format("task '{}': taskname is also used by task_templates[{}]; expected unique "
                                      "tasknames",
                                      name, it->second)});
    }
  }
  return problems;
}

std::vector<ParsedTemplate> parse_task_templates(const std::vector<config::TaskTemplate>& tasks,
                                                 std::optional<int64_t> max_seq_length) {
  auto problems = find_template_problems(tasks, max_seq_length);
  if (!problems.empty()) throw TemplateError(std::move(problems));
  std::vector<ParsedTemplate> out(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i)
    TaskChecker(tasks[i], static_cast<int64_t>(i), max_seq_length, problems).run(&out[i]);
  return out;
}

ParsedTemplate parse_task_template(const config::TaskTemplate& task, std::optional<int64_t> max_seq_length) {
  std::vector<TemplateProblem> problems;
  ParsedTemplate out;
  if (!TaskChecker(task, 0, max_seq_length, problems).run(&out)) throw TemplateError(std::move(problems));
  return out;
}

int64_t find_task(const std::vector<ParsedTemplate>& templates, const std::string& taskname) {
  for (size_t i = 0; i < templates.size(); ++i)
    if (templates[i].taskname() == taskname) return static_cast<int64_t>(i);
  return -1;
}

std::string task_names(const std::vector<ParsedTemplate>& templates) {
  std::string out;
  for (size_t i = 0; i < templates.size(); ++i) out += (i ? ", '" : "'") + templates[i].taskname() + "'";
  return out;
}

}  // namespace loom::prompt_data
