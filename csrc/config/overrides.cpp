#include "config/overrides.h"

#include "config/schema.h"

namespace loom::config::detail {

namespace {

void relocate(Node& n, const SourceLocation& where) {
  n.where = where;
  for (auto& item : n.items) relocate(item, where);
  for (auto& [key, value] : n.entries) relocate(value, where);
  for (auto& loc : n.key_locations) loc = where;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

}  // namespace

void apply_overrides(Node& root, const std::vector<std::string>& overrides, Diagnostics& diag,
                     RecipeKind kind) {
  const KeyIndex& index = key_index(kind);
  for (const std::string& text : overrides) {
    const SourceLocation where{"override '" + text + "'", 0, 0};
    const size_t eq = text.find('=');
    const std::string key = eq == std::string::npos ? "" : trim(text.substr(0, eq));
    if (eq == std::string::npos || key.empty()) {
      diag.error(where, "", "expected section.key=value, found no '=' or an empty key");
      continue;
    }
    std::string path = key;
    for (const auto& [alias, canonical] : key_aliases())
      if (path == alias) path = canonical;
    if (!index.fields.count(path) && !index.sections.count(path)) {
      // Name the first component that is not a known section.
      const auto keys = split_path(key);
      size_t depth = 0;
      while (depth + 1 < keys.size() && index.sections.count(join_path(keys, depth + 1))) ++depth;
      const std::string parent = join_path(keys, depth);
      const std::string in = parent.empty() ? "a top-level section" : "a key of section '" + parent + "'";
      diag.error(where, key, "unknown key: expected " + in + ", found '" + keys[depth] + "'" + suggest_key(key, kind));
      continue;
    }
    Diagnostics value_diag;
    Node value = parse_yaml(text.substr(eq + 1), where.origin, value_diag);
    if (!value_diag.errors.empty()) {
      diag.error(where, path, "cannot parse the value as YAML (" + value_diag.errors.front() + ")");
      continue;
    }
    relocate(value, where);
    if (root.kind != Node::Kind::kMap) {
      root = Node::map();
    }
    const auto keys = split_path(path);
    Node* cur = &root;
    for (size_t i = 0; i + 1 < keys.size(); ++i) {
      Node* next = cur->find(keys[i]);
      if (!next) next = &cur->set(keys[i], Node::map(), where);
      if (next->kind != Node::Kind::kMap) {
        *next = Node::map();  // the override replaces a malformed or null section
        next->where = where;
      }
      cur = next;
    }
    cur->set(keys.back(), std::move(value), where);
  }
}

}  // namespace loom::config::detail
