#include "config/tree.h"

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <sstream>
#include <unordered_map>

namespace loom::config {

std::string SourceLocation::str() const {
  if (line <= 0) return origin;
  return origin + ":" + std::to_string(line) + ":" + std::to_string(column);
}

RecipeError::RecipeError(std::vector<std::string> errs)
    : std::runtime_error([&] {
        std::string text;
        for (size_t i = 0; i < errs.size(); ++i) text += (i ? "\n" : "") + errs[i];
        return text;
      }()),
      errors(std::move(errs)) {}

}  // namespace loom::config

namespace loom::config::detail {

Node Node::scalar_of(std::string text, bool quoted) {
  Node n;
  n.kind = Kind::kScalar;
  n.scalar = std::move(text);
  n.quoted = quoted;
  return n;
}

Node Node::map() {
  Node n;
  n.kind = Kind::kMap;
  return n;
}

Node* Node::find(const std::string& key) {
  for (auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

const Node* Node::find(const std::string& key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

Node& Node::set(const std::string& key, Node value, SourceLocation key_where) {
  kind = Kind::kMap;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].first == key) {
      entries[i].second = std::move(value);
      key_locations[i] = std::move(key_where);
      return entries[i].second;
    }
  }
  entries.emplace_back(key, std::move(value));
  key_locations.push_back(std::move(key_where));
  return entries.back().second;
}

bool Node::erase(const std::string& key) {
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].first == key) {
      entries.erase(entries.begin() + static_cast<long>(i));
      key_locations.erase(key_locations.begin() + static_cast<long>(i));
      return true;
    }
  }
  return false;
}

std::string format_issue(const SourceLocation& where, const std::string& path, const std::string& message) {
  std::string out = where.str();
  if (!path.empty()) out += ": " + path;
  return out + ": " + message;
}

void Diagnostics::error(const SourceLocation& where, const std::string& path, const std::string& message) {
  if (saturated()) {
    ++suppressed;
  } else {
    errors.push_back(format_issue(where, path, message));
  }
  if (!path.empty()) bad_paths.insert(path);
}

void Diagnostics::warning(const SourceLocation& where, const std::string& path, const std::string& message) {
  warnings.push_back(format_issue(where, path, message));
}

namespace {

SourceLocation location_of(const YAML::Mark& mark, const std::string& origin) {
  SourceLocation loc{origin, 0, 0};
  if (mark.line >= 0 && mark.column >= 0) {
    loc.line = mark.line + 1;
    loc.column = mark.column + 1;
  }
  return loc;
}

/// Thrown when the document exceeds a limit of tree.h; caught by parse_yaml.
struct LimitError {
  SourceLocation where;
  std::string path, message;
};

/// Converts yaml-cpp's tree into ours, counting what it builds: an alias shares one yaml-cpp
/// node however often it is used, but each use becomes a copy here, so the count bounds the
/// expansion of alias bombs ("billion laughs") before they exhaust memory.
class Converter {
 public:
  // Without aliases every value and every key's text comes from at least one byte of the file,
  // so the budgets below are never reached by a document that does not reuse anchors.
  Converter(const std::string& origin, size_t text_size, Diagnostics& diag)
      : origin_(origin),
        nodes_left_(kExpansionFactor * text_size + kExpansionNodes),
        bytes_left_(kExpansionFactor * text_size + kExpansionBytes),
        diag_(diag) {}

  Node convert(const YAML::Node& y, const std::string& path, int depth) {
    Node n;
    n.where = location_of(y.Mark(), origin_);
    if (depth > kMaxDepth) {
      throw LimitError{n.where, path,
                       "expected mappings and sequences nested at most " + std::to_string(kMaxDepth) +
                           " levels deep, found deeper nesting (or an alias that contains itself)"};
    }
    spend(nodes_left_, 1, n.where, path);
    switch (y.Type()) {
      case YAML::NodeType::Undefined:
      case YAML::NodeType::Null:
        n.kind = Node::Kind::kNull;
        break;
      case YAML::NodeType::Scalar:
        n.kind = Node::Kind::kScalar;
        n.scalar = y.Scalar();
        spend(bytes_left_, n.scalar.size(), n.where, path);
        n.quoted = y.Tag() == "!";  // yaml-cpp tags non-plain (quoted, block) scalars "!"
        break;
      case YAML::NodeType::Sequence: {
        n.kind = Node::Kind::kSequence;
        size_t i = 0;
        for (const auto& item : y) {
          n.items.push_back(convert(item, path + "[" + std::to_string(i) + "]", depth + 1));
          ++i;
        }
        break;
      }
      case YAML::NodeType::Map: {
        n.kind = Node::Kind::kMap;
        // First position of each key: one hash lookup per key keeps a map of a million keys
        // linear (a scan of the earlier keys made it quadratic).
        std::unordered_map<std::string, size_t> first_at;
        for (auto it = y.begin(); it != y.end(); ++it) {
          const SourceLocation key_where = location_of(it->first.Mark(), origin_);
          if (!it->first.IsScalar()) {
            diag_.error(key_where, path, "expected a plain key, found a " +
                                             std::string(it->first.IsMap() ? "mapping" : "sequence") + " as key");
            continue;
          }
          const std::string key = it->first.Scalar();
          const std::string child_path = path.empty() ? key : path + "." + key;
          spend(bytes_left_, key.size(), key_where, child_path);
          const auto [seen, inserted] = first_at.emplace(key, n.entries.size());
          if (!inserted) {
            diag_.error(key_where, child_path,
                        "expected each key once per section, found '" + key + "' again (first at line " +
                            std::to_string(n.key_locations[seen->second].line) + ")");
            continue;
          }
          Node value = convert(it->second, child_path, depth + 1);
          // An empty value ("key:" then newline) has its mark on the next line: point at the key.
          if (value.kind == Node::Kind::kNull && value.where.line != key_where.line) value.where = key_where;
          n.entries.emplace_back(key, std::move(value));
          n.key_locations.push_back(key_where);
        }
        break;
      }
    }
    return n;
  }

 private:
  void spend(size_t& left, size_t amount, const SourceLocation& where, const std::string& path) {
    if (amount <= left) {
      left -= amount;
      return;
    }
    throw LimitError{where, path,
                     "expected aliases to expand the document to at most " + std::to_string(kExpansionFactor) +
                         "x its size plus " + std::to_string(kExpansionNodes) + " values and " +
                         std::to_string(kExpansionBytes >> 20) +
                         " MiB of text, found more by here (anchors reused too often: a YAML alias bomb?)"};
  }

  const std::string& origin_;
  size_t nodes_left_, bytes_left_;
  Diagnostics& diag_;
};

}  // namespace

std::vector<std::string> Diagnostics::report() const {
  std::vector<std::string> out = errors;
  if (suppressed > 0) out.push_back("... and " + std::to_string(suppressed) + " more errors not shown");
  return out;
}

namespace {

/// Records where the parser's documents start and nothing else.
struct DocumentStarts : YAML::EventHandler {
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

/// Byte offset of the first line at or after `from` that starts with a document marker ("---"
/// or "..." then a space or the end of the line), or npos.
size_t marker_line(const std::string& text, size_t from) {
  for (size_t at = from; at < text.size();) {
    if ((text.compare(at, 3, "---") == 0 || text.compare(at, 3, "...") == 0) &&
        (at + 3 == text.size() || std::isspace(static_cast<unsigned char>(text[at + 3]))))
      return at;
    const size_t nl = text.find('\n', at);
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  return std::string::npos;
}

/// 1-based line and column of byte `at`.
SourceLocation location_at(const std::string& text, size_t at, const std::string& origin) {
  const size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
  const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<long>(at), '\n'));
  const size_t column = line_start == std::string::npos || at == 0 ? at : at - line_start - 1;
  return SourceLocation{origin, line, static_cast<int>(column) + 1};
}

/// Where a second document starts, if the text has one. Another document needs a document
/// marker line, so texts without one are not parsed again. The parser is asked for two
/// documents, never more: yaml-cpp 0.7's LoadAll loops forever on some malformed texts (a
/// stray ',' yields null documents without end).
std::optional<SourceLocation> second_document(const std::string& text, const std::string& origin) {
  if (marker_line(text, 0) == std::string::npos) return std::nullopt;
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts starts;
  if (!parser.HandleNextDocument(starts) || !parser.HandleNextDocument(starts) || starts.starts.size() < 2)
    return std::nullopt;
  // yaml-cpp marks the end of the previous document: point at the marker line after it.
  const size_t from = starts.starts[1].pos > 0 ? static_cast<size_t>(starts.starts[1].pos) : 0;
  const size_t marker = marker_line(text, std::min(from, text.size()));
  if (marker != std::string::npos) return location_at(text, marker, origin);
  return location_of(starts.starts[1], origin);
}

}  // namespace

Node parse_yaml(const std::string& text, const std::string& origin, Diagnostics& diag) {
  YAML::Node document;
  std::optional<SourceLocation> second;
  try {
    document = YAML::Load(text);
    second = second_document(text, origin);
  } catch (const YAML::Exception& e) {
    diag.error(location_of(e.mark, origin), "", "YAML syntax error: " + e.msg);
    return Node{};
  }
  if (second) {
    // yaml-cpp's Load reads the first document only; the rest of the file would be ignored.
    diag.error(*second, "",
               "expected one YAML document, found another (a line '---' starts a new document; a recipe is a "
               "single document)");
    return Node{};
  }
  try {
    return Converter(origin, text.size(), diag).convert(document, "", 0);
  } catch (const LimitError& e) {
    diag.error(e.where, e.path, e.message);
    return Node{};
  }
}

std::string describe(const Node& node) {
  switch (node.kind) {
    case Node::Kind::kNull: return "null";
    case Node::Kind::kSequence: return "a sequence";
    case Node::Kind::kMap: return "a mapping";
    case Node::Kind::kScalar: break;
  }
  if (node.quoted) return "\"" + node.scalar + "\"";
  if (node.scalar.empty()) return "an empty string";
  return node.scalar;
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> keys;
  std::string cur;
  for (char c : path) {
    if (c == '.') {
      keys.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  keys.push_back(cur);
  return keys;
}

std::string join_path(const std::vector<std::string>& keys, size_t count) {
  std::string out;
  for (size_t i = 0; i < count && i < keys.size(); ++i) out += (i ? "." : "") + keys[i];
  return out;
}

namespace {

bool is_plain_safe(const std::string& s) {
  if (s.empty()) return false;
  const unsigned char first = static_cast<unsigned char>(s[0]);
  if (!(std::isalpha(first) || s[0] == '_' || s[0] == '/' || s[0] == '.')) return false;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (!(std::isalnum(u) || c == '_' || c == '.' || c == '/' || c == '-')) return false;
  }
  std::string lower;
  for (char c : s) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const char* kReserved[] = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", ".inf", ".nan"};
  for (const char* r : kReserved)
    if (lower == r) return false;
  // A leading '.' followed by a digit could read as a float (".5").
  if (s[0] == '.' && s.size() > 1 && std::isdigit(static_cast<unsigned char>(s[1]))) return false;
  return true;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default: out += c;
    }
  }
  return out + "\"";
}

std::string scalar_text(const Node& n) {
  if (n.kind == Node::Kind::kNull) return "null";
  if (n.quoted) return quote(n.scalar);
  return n.scalar;
}

bool is_flow_sequence(const Node& n) {
  for (const auto& item : n.items)
    if (item.kind == Node::Kind::kMap || item.kind == Node::Kind::kSequence) return false;
  return true;
}

void emit(const Node& n, int indent, std::ostringstream& out) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  for (const auto& [key, value] : n.entries) {
    out << pad << key << ":";
    if (value.kind == Node::Kind::kMap) {
      if (value.entries.empty()) {
        out << " {}\n";
      } else {
        out << "\n";
        emit(value, indent + 2, out);
      }
    } else if (value.kind == Node::Kind::kSequence) {
      if (is_flow_sequence(value)) {
        out << " [";
        for (size_t i = 0; i < value.items.size(); ++i) out << (i ? ", " : "") << scalar_text(value.items[i]);
        out << "]\n";
      } else {
        out << "\n";
        for (const auto& item : value.items) {
          out << pad << "  -\n";
          emit(item, indent + 4, out);
        }
      }
    } else {
      out << " " << scalar_text(value) << "\n";
    }
  }
}

}  // namespace

std::string format_double(double value) {
  std::string text = fmt::format("{}", value);
  const size_t e = text.find_first_of("eE");
  const std::string mantissa = text.substr(0, e);
  if (mantissa.find('.') == std::string::npos && mantissa.find_first_of("0123456789") != std::string::npos) {
    text.insert(e == std::string::npos ? text.size() : e, ".0");
  }
  return text;
}

Node string_node(const std::string& text) { return Node::scalar_of(text, !is_plain_safe(text)); }

std::string emit_yaml(const Node& root) {
  std::ostringstream out;
  emit(root, 0, out);
  return out.str();
}

}  // namespace loom::config::detail
