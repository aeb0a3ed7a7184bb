#include "config/schema_read.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include "config/schema.h"
#include "config/suggest.h"

namespace loom::config::detail {

bool parse_int(const std::string& text, int64_t& out) {
  if (text.empty()) return false;
  size_t i = (text[0] == '-' || text[0] == '+') ? 1 : 0;
  if (i == text.size()) return false;
  for (size_t j = i; j < text.size(); ++j)
    if (text[j] < '0' || text[j] > '9') return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno == ERANGE || *end != '\0') return false;
  out = static_cast<int64_t>(v);
  return true;
}

bool parse_double(const std::string& text, double& out) {
  if (text.empty()) return false;
  bool digit = false;
  for (char c : text) {
    if (c >= '0' && c <= '9') {
      digit = true;
    } else if (c != '+' && c != '-' && c != '.' && c != 'e' && c != 'E') {
      return false;
    }
  }
  if (!digit) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (errno == ERANGE || *end != '\0' || !std::isfinite(v)) return false;
  out = v;
  return true;
}

bool parse_bool(const std::string& text, bool& out) {
  if (text == "true" || text == "True" || text == "TRUE") {
    out = true;
    return true;
  }
  if (text == "false" || text == "False" || text == "FALSE") {
    out = false;
    return true;
  }
  return false;
}

namespace {

void type_error(const Node& n, const std::string& path, const std::string& expected, Diagnostics& diag) {
  diag.error(n.where, path, "expected " + expected + ", found " + describe(n));
}

bool read_value(const Node& n, int64_t& out, const std::string& path, Diagnostics& diag) {
  if (n.kind == Node::Kind::kScalar && parse_int(n.scalar, out)) return true;
  type_error(n, path, "an integer", diag);
  return false;
}

bool read_value(const Node& n, double& out, const std::string& path, Diagnostics& diag) {
  if (n.kind == Node::Kind::kScalar && parse_double(n.scalar, out)) return true;
  type_error(n, path, "a number", diag);
  return false;
}

bool read_value(const Node& n, bool& out, const std::string& path, Diagnostics& diag) {
  if (n.kind == Node::Kind::kScalar && parse_bool(n.scalar, out)) return true;
  type_error(n, path, "true or false", diag);
  return false;
}

bool read_value(const Node& n, std::string& out, const std::string& path, Diagnostics& diag) {
  if (n.kind == Node::Kind::kScalar) {
    out = n.scalar;
    return true;
  }
  type_error(n, path, "a string", diag);
  return false;
}

template <class T>
bool read_value(const Node& n, std::optional<T>& out, const std::string& path, Diagnostics& diag) {
  if (n.kind == Node::Kind::kNull) {
    out.reset();
    return true;
  }
  T value{};
  if (!read_value(n, value, path, diag)) return false;
  out = value;
  return true;
}

template <class E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
bool read_value(const Node& n, E& out, const std::string& path, Diagnostics& diag) {
  std::vector<std::string> names;
  std::string choices;
  for (const auto& s : enum_spellings<E>()) {
    for (const auto& name : s.names) {
      const bool match = name == "null" ? n.kind == Node::Kind::kNull
                                        : (n.kind == Node::Kind::kScalar && n.scalar == name);
      if (match) {
        out = s.value;
        return true;
      }
      if (name != "null") names.push_back(name);
      choices += (choices.empty() ? "" : " | ") + name;
    }
  }
  std::string message = "expected one of " + choices + ", found " + describe(n);
  if (n.kind == Node::Kind::kScalar) {
    const std::string best = closest(n.scalar, names);
    if (!best.empty() && edit_distance(best, n.scalar) <= std::max<size_t>(2, best.size() / 2)) {
      message += " (did you mean '" + best + "'?)";
    }
  }
  diag.error(n.where, path, message);
  return false;
}

bool read_value(const Node& n, std::array<double, 2>& out, const std::string& path, Diagnostics& diag) {
  const std::string expected = "a sequence of 2 numbers [beta1, beta2]";
  if (n.kind != Node::Kind::kSequence || n.items.size() != 2) {
    std::string found = describe(n);
    if (n.kind == Node::Kind::kSequence) {
      found = "a sequence of " + std::to_string(n.items.size()) + (n.items.size() == 1 ? " item" : " items");
    }
    diag.error(n.where, path, "expected " + expected + ", found " + found);
    return false;
  }
  bool ok = true;
  for (size_t i = 0; i < 2; ++i) ok = read_value(n.items[i], out[i], path + "[" + std::to_string(i) + "]", diag) && ok;
  return ok;
}

/// A sequence of strings, integers or enum values (each read as such); null is empty.
template <class T,
          std::enable_if_t<std::is_same_v<T, std::string> || std::is_same_v<T, int64_t> || std::is_enum_v<T>, int> = 0>
bool read_value(const Node& n, std::vector<T>& out, const std::string& path, Diagnostics& diag) {
  out.clear();
  if (n.kind == Node::Kind::kNull) return true;
  if (n.kind != Node::Kind::kSequence) {
    type_error(n, path, std::is_same_v<T, std::string> ? "a sequence of strings" : "a sequence", diag);
    return false;
  }
  bool ok = true;
  for (size_t i = 0; i < n.items.size(); ++i) {
    T value{};
    if (read_value(n.items[i], value, path + "[" + std::to_string(i) + "]", diag)) {
      out.push_back(value);
    } else {
      ok = false;
    }
  }
  return ok;
}

/// One entry of model.task_templates: a mapping of NeMo's template keys. Unknown keys are
/// reported with the closest valid one; missing required keys name the entry.
bool read_value(const Node& n, TaskTemplate& out, const std::string& path, Diagnostics& diag) {
  if (n.kind != Node::Kind::kMap) {
    type_error(n, path, "a mapping of taskname, prompt_template, prompt_template_fields, "
                        "total_virtual_tokens, virtual_token_splits, answer_only_loss, answer_field, "
                        "truncate_field",
               diag);
    return false;
  }
  static const std::vector<std::string> keys = {"taskname", "prompt_template", "prompt_template_fields",
                                                "total_virtual_tokens", "virtual_token_splits",
                                                "answer_only_loss", "answer_field", "truncate_field"};
  bool ok = true;
  for (size_t i = 0; i < n.entries.size(); ++i) {
    const std::string& key = n.entries[i].first;
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
    const std::string best = closest(key, keys);
    diag.error(n.key_locations[i], path + "." + key,
               "unknown key of a task template, found '" + key + "'" +
                   (best.empty() ? "" : " (did you mean '" + best + "'?)"));
    ok = false;
  }
  auto field = [&](const char* key, auto& value, bool required) {
    const Node* v = n.find(key);
    const std::string at = path + "." + key;
    if (!v || (v->kind == Node::Kind::kNull && required)) {
      if (required) {
        diag.error(v ? v->where : n.where, at, "expected a value (required key of a task template), found " +
                                                    std::string(v ? "null" : "none"));
        ok = false;
      }
      return;
    }
    ok = read_value(*v, value, at, diag) && ok;
  };
  field("taskname", out.taskname, true);
  field("prompt_template", out.prompt_template, true);
  field("prompt_template_fields", out.prompt_template_fields, true);
  field("total_virtual_tokens", out.total_virtual_tokens, true);
  field("virtual_token_splits", out.virtual_token_splits, true);
  field("answer_only_loss", out.answer_only_loss, false);
  field("answer_field", out.answer_field, false);
  field("truncate_field", out.truncate_field, false);
  return ok;
}

bool read_value(const Node& n, std::vector<TaskTemplate>& out, const std::string& path, Diagnostics& diag) {
  out.clear();
  if (n.kind != Node::Kind::kSequence) {
    type_error(n, path, "a sequence of task templates", diag);
    return false;
  }
  bool ok = true;
  for (size_t i = 0; i < n.items.size(); ++i) {
    TaskTemplate t;
    ok = read_value(n.items[i], t, path + "[" + std::to_string(i) + "]", diag) && ok;
    out.push_back(t);
  }
  return ok;
}

/// data_prefix: "path", ["path"], or [w1, path1, w2, path2, ...] (Megatron's blend syntax).
bool read_value(const Node& n, std::vector<DataBlendEntry>& out, const std::string& path, Diagnostics& diag) {
  out.clear();
  const std::string expected = "a dataset prefix or a [weight, prefix, weight, prefix, ...] sequence";
  if (n.kind == Node::Kind::kScalar) {
    out.push_back({1.0, n.scalar});
    return true;
  }
  if (n.kind != Node::Kind::kSequence || n.items.empty()) {
    std::string found = n.kind == Node::Kind::kSequence ? "an empty sequence" : describe(n);
    diag.error(n.where, path, "expected " + expected + ", found " + found);
    return false;
  }
  double unused = 0;
  if (n.items.size() == 1 && n.items[0].kind == Node::Kind::kScalar && !parse_double(n.items[0].scalar, unused)) {
    out.push_back({1.0, n.items[0].scalar});
    return true;
  }
  if (n.items.size() % 2 != 0) {
    diag.error(n.where, path,
               "expected " + expected + " with an even number of items, found " + std::to_string(n.items.size()) +
                   " items");
    return false;
  }
  bool ok = true;
  for (size_t i = 0; i < n.items.size(); i += 2) {
    DataBlendEntry entry;
    const Node& w = n.items[i];
    const Node& p = n.items[i + 1];
    if (w.kind != Node::Kind::kScalar || !parse_double(w.scalar, entry.weight)) {
      diag.error(w.where, path + "[" + std::to_string(i) + "]", "expected a weight (a number), found " + describe(w));
      ok = false;
    }
    double number = 0;
    if (p.kind != Node::Kind::kScalar || (!p.quoted && parse_double(p.scalar, number))) {
      diag.error(p.where, path + "[" + std::to_string(i + 1) + "]",
                 "expected a dataset prefix (a string), found " + describe(p));
      ok = false;
    } else {
      entry.path = p.scalar;
    }
    out.push_back(entry);
  }
  if (!ok) diag.bad_paths.insert(path);
  return ok;
}

/// Finds the node at `path`; `parent_where` receives the location of the key of the deepest
/// existing section (e.g. "model:"), unchanged at the top level.
/// Returns nullptr when absent or when an intermediate section is not a mapping.
const Node* lookup(const Node& root, const std::string& path, SourceLocation& parent_where, bool& blocked) {
  const Node* cur = &root;
  blocked = false;
  const auto keys = split_path(path);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (cur->kind != Node::Kind::kMap) {
      blocked = cur->kind != Node::Kind::kNull;
      return nullptr;
    }
    const Node* next = nullptr;
    for (size_t k = 0; k < cur->entries.size() && !next; ++k) {
      if (cur->entries[k].first != keys[i]) continue;
      next = &cur->entries[k].second;
      if (i + 1 < keys.size()) parent_where = cur->key_locations[k];  // the section's key
    }
    if (!next) return nullptr;
    cur = next;
  }
  return cur;
}

struct Reader {
  const Node& root;
  SourceLocation root_where;
  Recipe& recipe;
  Diagnostics& diag;
  std::set<std::string>& derived;

  template <class T>
  void operator()(const std::string& path, T& field, Need need) {
    SourceLocation parent_where = root_where;
    bool blocked = false;
    const Node* n = lookup(root, path, parent_where, blocked);
    if (blocked) {
      diag.bad_paths.insert(path);
      return;
    }
    if (n && n->invalid) {
      diag.bad_paths.insert(path);
      return;
    }
    if (!n || (n->kind == Node::Kind::kNull && need != Need::kDefault)) {
      if (need == Need::kDerived) {
        derived.insert(path);
        if (n) recipe.origin.locations[path] = n->where;
        return;
      }
      if (need == Need::kRequired) {
        if (n) {
          diag.error(n->where, path, "expected a value (required field), found null");
        } else {
          const auto keys = split_path(path);
          const std::string section = join_path(keys, keys.size() - 1);
          diag.error(parent_where, path,
                     "expected a value (required field), found no key '" + keys.back() + "'" +
                         (section.empty() ? std::string(" at the top level") : " in section '" + section + "'"));
        }
        return;
      }
      return;  // kDefault and absent: keep the default
    }
    recipe.origin.locations[path] = n->where;
    if (!read_value(*n, field, path, diag)) diag.bad_paths.insert(path);
  }
};

}  // namespace

std::string other_kind_key(const std::string& full, RecipeKind kind) {
  auto known = [&](RecipeKind k) { return key_index(k).fields.count(full) || key_index(k).sections.count(full); };
  const bool data = full.rfind("model.data.", 0) == 0;
  if (kind == RecipeKind::kPromptLearning && known(RecipeKind::kPretraining))
    return std::string("not a key of a prompt-learning recipe: ") +
           (data ? "its records come from model.data.train_ds / validation_ds / test_ds"
                 : "the model's shape comes from the base checkpoint (model.language_model_path)");
  if (kind == RecipeKind::kPromptLearning && known(RecipeKind::kFinetuning))
    return "a key of fine-tuning recipes (loom finetune), not of a prompt-learning recipe";
  if (kind == RecipeKind::kFinetuning && known(RecipeKind::kPretraining))
    return data ? "not a key of a fine-tuning recipe: its records come from model.data.train_ds.file_names / "
                  "validation_ds.file_names (JSON lines)"
                : "not a key of a fine-tuning recipe: the model's shape comes from the base checkpoint "
                  "(model.restore_from_path)";
  if (kind == RecipeKind::kFinetuning && known(RecipeKind::kPromptLearning))
    return "a key of prompt-learning recipes (loom ptune), not of a fine-tuning recipe";
  if (kind == RecipeKind::kPretraining && known(RecipeKind::kPromptLearning))
    return "a key of prompt-learning recipes (loom ptune), not of a pretraining recipe";
  if (kind == RecipeKind::kPretraining && known(RecipeKind::kFinetuning))
    return "a key of fine-tuning recipes (loom finetune), not of a pretraining recipe";
  return "";
}

namespace {

void check_map_keys(const Node& map, const std::string& path, Diagnostics& diag, RecipeKind kind) {
  const KeyIndex& index = key_index(kind);
  for (size_t i = 0; i < map.entries.size(); ++i) {
    const auto& [key, value] = map.entries[i];
    const std::string full = path.empty() ? key : path + "." + key;
    if (index.fields.count(full)) continue;
    if (index.sections.count(full)) {
      if (value.kind == Node::Kind::kMap) {
        check_map_keys(value, full, diag, kind);
      } else if (value.kind != Node::Kind::kNull) {
        diag.error(value.where, full, "expected a mapping (a section), found " + describe(value));
      }
      continue;
    }
    // A key of another kind of recipe: say so rather than guess a spelling.
    if (const std::string why = other_kind_key(full, kind); !why.empty()) {
      diag.error(map.key_locations[i], full, why);
      continue;
    }
    const std::string where = path.empty() ? "a top-level section" : "a key of section '" + path + "'";
    // Past the error cap the line is only counted: skip the costly suggestion.
    const std::string hint = diag.saturated() ? "" : suggest_key(full, kind);
    diag.error(map.key_locations[i], full, "unknown key: expected " + where + ", found '" + key + "'" + hint);
  }
}

}  // namespace

void apply_key_aliases(Node& root, Diagnostics& diag) {
  for (const auto& [alias, canonical] : key_aliases()) {
    const auto keys = split_path(alias);
    Node* parent = &root;
    for (size_t i = 0; i + 1 < keys.size() && parent; ++i) {
      parent = parent->kind == Node::Kind::kMap ? parent->find(keys[i]) : nullptr;
    }
    if (!parent || parent->kind != Node::Kind::kMap) continue;
    const std::string canonical_key = split_path(canonical).back();
    for (size_t i = 0; i < parent->entries.size(); ++i) {
      if (parent->entries[i].first != keys.back()) continue;
      if (parent->find(canonical_key)) {
        diag.error(parent->key_locations[i], alias,
                   "expected only one of '" + keys.back() + "' and its alias target '" + canonical_key +
                       "', found both");
        parent->entries.erase(parent->entries.begin() + static_cast<long>(i));
        parent->key_locations.erase(parent->key_locations.begin() + static_cast<long>(i));
      } else {
        parent->entries[i].first = canonical_key;
      }
      break;
    }
  }
}

void check_keys(const Node& root, const SourceLocation& root_where, Diagnostics& diag, RecipeKind kind) {
  if (root.kind == Node::Kind::kNull) return;  // empty document: required fields report
  if (root.kind != Node::Kind::kMap) {
    diag.error(root.where.line ? root.where : root_where, "",
               "expected a mapping with sections run, trainer, exp_manager, model, cluster; found " +
                   describe(root));
    return;
  }
  check_map_keys(root, "", diag, kind);
}

void read_fields(const Node& root, const SourceLocation& root_where, Recipe& r, Diagnostics& diag,
                 std::set<std::string>& derived) {
  if (root.kind != Node::Kind::kMap && root.kind != Node::Kind::kNull) return;
  Reader reader{root, root_where, r, diag, derived};
  visit_recipe(r, reader);
}

}  // namespace loom::config::detail
