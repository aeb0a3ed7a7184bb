// Internal: a small YAML document tree that remembers where every value came from
// (file:line:column, or the override that set it). Overrides and interpolation edit this tree
// before it is converted into a typed Recipe; to_yaml builds one and emits it.
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "config/recipe.h"

namespace YAML {
class Node;
}

namespace loom::config::detail {

struct Node {
  enum class Kind { kNull, kScalar, kSequence, kMap };
  Kind kind = Kind::kNull;
  std::string scalar;   ///< text of a scalar
  bool quoted = false;  ///< scalar was quoted in the source, so it is a string
  bool invalid = false; ///< an error was already reported for this value (skip it)
  std::vector<Node> items;                            ///< sequence items
  std::vector<std::pair<std::string, Node>> entries;  ///< map entries, in source order
  std::vector<SourceLocation> key_locations;          ///< where each map key was written
  SourceLocation where;                               ///< where the value was written

  static Node scalar_of(std::string text, bool quoted = false);
  static Node map();
  Node* find(const std::string& key);
  const Node* find(const std::string& key) const;
  /// Sets (replacing or appending) entry `key`; returns the stored node.
  Node& set(const std::string& key, Node value, SourceLocation key_where = {});
  /// Removes entry `key` if present; returns whether it was present.
  bool erase(const std::string& key);
};

/// Collects formatted error lines and the field paths that had errors. At most kMaxErrors lines
/// are kept (a hostile file can hold millions of bad keys); the rest are only counted, so that
/// loading stays linear and the report readable.
struct Diagnostics {
  static constexpr size_t kMaxErrors = 100;
  std::vector<std::string> errors;
  std::vector<std::string> warnings;
  std::set<std::string> bad_paths;
  size_t suppressed = 0;  ///< errors beyond kMaxErrors, counted but not formatted
  void error(const SourceLocation& where, const std::string& path, const std::string& message);
  void warning(const SourceLocation& where, const std::string& path, const std::string& message);
  /// True once kMaxErrors errors are kept: callers may skip costly message parts (suggestions).
  bool saturated() const { return errors.size() >= kMaxErrors; }
  /// The kept errors plus, when some were suppressed, a last line saying how many.
  std::vector<std::string> report() const;
};

/// "<where>: <path>: <message>" (path omitted when empty).
std::string format_issue(const SourceLocation& where, const std::string& path, const std::string& message);

/// Limits on what one YAML text may expand to (docs/design/hardening.md): mappings and
/// sequences nested deeper than kMaxDepth (a self-referencing alias is infinitely deep), or
/// aliases that expand the tree beyond kExpansionFactor values and text bytes per byte of the
/// text (plus a fixed allowance) are refused, naming the key where the limit was reached.
inline constexpr int kMaxDepth = 64;
inline constexpr size_t kExpansionFactor = 2;
inline constexpr size_t kExpansionNodes = 100000;
inline constexpr size_t kExpansionBytes = size_t{1} << 20;

/// Parses YAML text into a tree (origin names it in locations). A syntax error, a duplicate
/// key, a second document, or a tree beyond the limits above is reported to `diag`; a syntax
/// error, a second document or a limit yields a null tree.
Node parse_yaml(const std::string& text, const std::string& origin, Diagnostics& diag);

/// Short description of a value for "found ..." messages: the scalar text (quoted strings in
/// double quotes), "null", "a sequence" or "a mapping".
std::string describe(const Node& node);

/// "a.b.c" -> {"a", "b", "c"}.
std::vector<std::string> split_path(const std::string& path);
std::string join_path(const std::vector<std::string>& keys, size_t count);

/// The recipe as a tree of every schema field of its kind, in dump order (what to_yaml emits).
Node recipe_tree(const Recipe& recipe);

/// Emits the tree as block-style YAML (2-space indent; sequences of scalars in flow style).
std::string emit_yaml(const Node& root);

/// Shortest text that reads back as the same double, always with a '.' or exponent so it reads
/// as a float in YAML 1.1 and 1.2 (e.g. 0.1, 1.0, 1.0e-05, 6.0e-05).
std::string format_double(double value);

/// A string scalar node that is quoted when it would otherwise read as another type or break
/// the YAML syntax.
Node string_node(const std::string& text);

}  // namespace loom::config::detail
