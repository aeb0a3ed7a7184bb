#include "config/overrides.h"

#include "config/schema_read.h"

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

// "0", "1", ...: no sign, no leading zero (so that one item has one name).
bool is_index(const std::string& key) {
  return !key.empty() && key.size() <= 9 && key.find_first_not_of("0123456789") == std::string::npos &&
         (key.size() == 1 || key[0] != '0');
}

// Something meant as an index that is not one: "-1", "01", "+2".
bool looks_like_index(const std::string& key) {
  const size_t digits = key.find_first_of("0123456789");
  return digits != std::string::npos && key.find_first_not_of("+-0123456789") == std::string::npos;
}

// "field.I[.key...]" where `field` is a known field: item I of the sequence the recipe (or an
// earlier override) gave it, then keys inside that item. Returns the number of components of
// `field`, or 0 when the path has no such form.
size_t indexed_field_length(const std::vector<std::string>& keys, const KeyIndex& index) {
  for (size_t k = 1; k < keys.size(); ++k)
    if (index.fields.count(join_path(keys, k))) return is_index(keys[k]) ? k : 0;
  return 0;
}

// The node an indexed override replaces, creating the keys below the item as needed; null
// (with the error reported) when the field is not a sequence or the index is beyond it.
Node* indexed_target(Node& root, const std::vector<std::string>& keys, size_t field_length,
                     const SourceLocation& where, const std::string& key, Diagnostics& diag) {
  const std::string field = join_path(keys, field_length);
  Node* cur = &root;
  for (size_t i = 0; i < field_length && cur; ++i) cur = cur->kind == Node::Kind::kMap ? cur->find(keys[i]) : nullptr;
  if (!cur || cur->kind != Node::Kind::kSequence) {
    diag.error(where, key,
               "an index addresses an item of a list, but '" + field + "' is " +
                   (cur ? describe(*cur) : std::string("not set")) + "; set the whole list ('" + field + "=[...]')");
    return nullptr;
  }
  const size_t item = std::stoul(keys[field_length]);
  if (item >= cur->items.size()) {
    diag.error(where, key,
               "'" + field + "' has " + std::to_string(cur->items.size()) + " item(s), numbered from 0; found index " +
                   keys[field_length]);
    return nullptr;
  }
  cur = &cur->items[item];
  for (size_t i = field_length + 1; i < keys.size(); ++i) {
    if (cur->kind != Node::Kind::kMap) {
      *cur = Node::map();  // the override replaces a malformed or null item
      cur->where = where;
    }
    Node* next = cur->find(keys[i]);
    cur = next ? next : &cur->set(keys[i], Node{}, where);
  }
  return cur;
}

// Replaces the value at `keys`, creating sections as needed.
void set_at_path(Node& root, const std::vector<std::string>& keys, Node value, const SourceLocation& where) {
  if (root.kind != Node::Kind::kMap) root = Node::map();
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

// The error for a key that is neither a field, a section nor an indexed item.
void report_unknown_key(const std::string& key, const KeyIndex& index, RecipeKind kind, const SourceLocation& where,
                        Diagnostics& diag) {
  const auto keys = split_path(key);
  size_t depth = 0;
  while (depth + 1 < keys.size() && index.sections.count(join_path(keys, depth + 1))) ++depth;
  const std::string parent = join_path(keys, depth);
  const std::string known_field = join_path(keys, depth + 1);
  if (depth + 1 < keys.size() && index.fields.count(known_field) && looks_like_index(keys[depth + 1])) {
    diag.error(where, key,
               "'" + keys[depth + 1] + "' is not an index: the items of a list are numbered 0, 1, 2, ... (no sign, "
               "no leading zero), as in '" + known_field + ".0=VALUE'");
    return;
  }
  if (depth + 1 < keys.size() && index.fields.count(known_field)) {
    // A field followed by more keys: it is a value, not a section (suggesting it back would
    // name the key that was given).
    diag.error(where, key,
               "'" + known_field + "' is a value, not a section, so it has no key '" + keys[depth + 1] +
                   "' (the items of a list are addressed by index from 0, as in '" + known_field + ".0=VALUE')");
    return;
  }
  if (const std::string why = other_kind_key(key, kind); !why.empty()) {
    diag.error(where, key, why);
    return;
  }
  const std::string in = parent.empty() ? "a top-level section" : "a key of section '" + parent + "'";
  diag.error(where, key, "unknown key: expected " + in + ", found '" + keys[depth] + "'" + suggest_key(key, kind));
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
    const auto keys = split_path(path);
    const size_t field_length =
        index.fields.count(path) || index.sections.count(path) ? 0 : indexed_field_length(keys, index);
    if (!index.fields.count(path) && !index.sections.count(path) && field_length == 0) {
      report_unknown_key(key, index, kind, where, diag);
      continue;
    }
    Diagnostics value_diag;
    Node value = parse_yaml(text.substr(eq + 1), where.origin, value_diag);
    if (!value_diag.errors.empty()) {
      diag.error(where, path, "cannot parse the value as YAML (" + value_diag.errors.front() + ")");
      continue;
    }
    relocate(value, where);
    if (field_length == 0) {
      set_at_path(root, keys, std::move(value), where);
    } else if (Node* target = indexed_target(root, keys, field_length, where, path, diag)) {
      *target = std::move(value);
    }
  }
}

}  // namespace loom::config::detail
