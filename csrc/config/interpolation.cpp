#include "config/interpolation.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

#include "config/schema.h"
#include "config/schema_read.h"

namespace loom::config::detail {

namespace {

/// Thrown inside one value's resolution; caught per value and reported at its location.
struct InterpolationError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A limit of interpolation.h was reached: unwinds to the value whose resolution started the
/// chain, marking every value on the way invalid, and is reported once, there.
struct InterpolationLimit : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

/// Index of the '}' closing the "${" whose body starts at `pos`; npos if unbalanced.
size_t matching_brace(const std::string& s, size_t pos) {
  int depth = 1;
  for (size_t i = pos; i < s.size(); ++i) {
    if (s[i] == '$' && i + 1 < s.size() && s[i + 1] == '{') {
      ++depth;
      ++i;
    } else if (s[i] == '}') {
      if (--depth == 0) return i;
    }
  }
  return std::string::npos;
}

bool has_interpolation(const std::string& s) { return s.find("${") != std::string::npos; }

class Resolver {
 public:
  Resolver(Node& root, Diagnostics& diag, RecipeKind kind) : root_(root), diag_(diag), kind_(kind) {}

  void resolve_tree(Node& n, std::vector<std::string>& path) {
    if (n.kind == Node::Kind::kScalar) {
      if (has_interpolation(n.scalar)) resolve_scalar(n, path);
    } else if (n.kind == Node::Kind::kMap) {
      for (auto& [key, value] : n.entries) {
        path.push_back(key);
        resolve_tree(value, path);
        path.pop_back();
      }
    } else if (n.kind == Node::Kind::kSequence) {
      for (size_t i = 0; i < n.items.size(); ++i) {
        path.push_back(std::to_string(i));
        resolve_tree(n.items[i], path);
        path.pop_back();
      }
    }
  }

 private:
  void resolve_scalar(Node& n, const std::vector<std::string>& path) {
    const std::string key = join_path(path, path.size());
    if (n.invalid) return;
    if (std::find(in_progress_.begin(), in_progress_.end(), key) != in_progress_.end()) {
      std::string chain;
      for (auto it = std::find(in_progress_.begin(), in_progress_.end(), key); it != in_progress_.end(); ++it)
        chain += *it + " -> ";
      throw InterpolationError("interpolation cycle: " + chain + key);
    }
    if (in_progress_.size() >= kMaxInterpolationChain) {
      throw InterpolationLimit(
          "expected chains of at most " + std::to_string(kMaxInterpolationChain) +
          " interpolations (a value referring to a value referring to ...), found a longer one: " +
          in_progress_.front() + " -> " + in_progress_[1] + " -> ... -> " + in_progress_.back() + " -> " + key);
    }
    in_progress_.push_back(key);
    try {
      Node result = evaluate_text(n.scalar, path);
      result.where = n.where;
      n = std::move(result);
    } catch (const InterpolationLimit& e) {
      in_progress_.pop_back();
      n.invalid = true;
      if (!in_progress_.empty()) throw;
      diag_.error(n.where, key, e.what());
      return;
    } catch (const InterpolationError& e) {
      // Reported here; a value referring to this one then reports "which has an error".
      in_progress_.pop_back();
      diag_.error(n.where, key, e.what());
      n.invalid = true;
      return;
    }
    in_progress_.pop_back();
  }

  /// A whole value: one "${...}" spanning the text keeps the referenced node's type; anything
  /// else becomes a string with each reference replaced by its scalar text.
  Node evaluate_text(const std::string& text, const std::vector<std::string>& path) {
    const NestingGuard guard(*this, path);
    const std::string t = trim(text);
    if (t.size() > 3 && t.compare(0, 2, "${") == 0 && matching_brace(t, 2) == t.size() - 1) {
      return evaluate_expression(t.substr(2, t.size() - 3), path);
    }
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\\' && text.compare(i + 1, 2, "${") == 0) {
        out += "${";
        ++i;
        ++i;
        continue;
      }
      if (text.compare(i, 2, "${") == 0) {
        const size_t close = matching_brace(text, i + 2);
        if (close == std::string::npos) throw InterpolationError("unterminated interpolation in '" + text + "'");
        const Node part = evaluate_expression(text.substr(i + 2, close - i - 2), path);
        if (part.kind != Node::Kind::kScalar) {
          throw InterpolationError("interpolation ${" + text.substr(i + 2, close - i - 2) +
                                   "} inside a string must refer to a scalar, found " + describe(part));
        }
        out += part.scalar;
        if (out.size() > kMaxInterpolatedBytes) too_large(path, out.size());
        i = close;
        continue;
      }
      out += text[i];
      if (out.size() > kMaxInterpolatedBytes) too_large(path, out.size());
    }
    spend(out.size(), path);
    return Node::scalar_of(out, true);
  }

  /// Each nested "${" and each link of a chain is one level of recursion: bounded so that a
  /// hostile recipe cannot exhaust the stack.
  struct NestingGuard {
    NestingGuard(Resolver& r, const std::vector<std::string>& path) : r_(r) {
      if (++r_.nesting_ > kMaxInterpolationNesting) {
        --r_.nesting_;
        throw InterpolationLimit("expected interpolations nested at most " +
                                 std::to_string(kMaxInterpolationNesting) + " levels deep, found deeper at " +
                                 join_path(path, path.size()));
      }
    }
    ~NestingGuard() { --r_.nesting_; }
    Resolver& r_;
  };

  [[noreturn]] void too_large(const std::vector<std::string>& path, size_t bytes) const {
    throw InterpolationLimit("expected an interpolated value of at most " +
                             std::to_string(kMaxInterpolatedBytes >> 10) + " KiB, found " +
                             join_path(path, path.size()) + " growing to " + std::to_string(bytes) +
                             " bytes (references repeated inside references: an interpolation bomb?)");
  }

  /// Counts what resolution produces (text bytes, and kNodeBytes per copied value) against one
  /// budget per recipe. Once spent, every later interpolation fails at once.
  void spend(size_t bytes, const std::vector<std::string>& path) {
    if (bytes <= budget_left_) {
      budget_left_ -= bytes;
      return;
    }
    budget_left_ = 0;
    throw InterpolationLimit("expected interpolations to produce at most " +
                             std::to_string(kInterpolationBudget >> 20) + " MiB in all, found more by " +
                             join_path(path, path.size()) + " (an interpolation bomb?)");
  }

  static constexpr size_t kNodeBytes = 128;  // about what one copied value occupies

  /// Bytes a copy of `n` occupies, counted only up to `limit` (so that measuring a huge
  /// subtree against an exhausted budget costs nothing).
  static size_t footprint(const Node& n, size_t limit) {
    size_t bytes = kNodeBytes + n.scalar.size();
    for (const auto& item : n.items) {
      if (bytes > limit) return bytes;
      bytes += footprint(item, limit - bytes);
    }
    for (const auto& [key, value] : n.entries) {
      if (bytes > limit) return bytes;
      bytes += key.size() + footprint(value, limit - bytes);
    }
    return bytes;
  }

  Node evaluate_expression(const std::string& body, const std::vector<std::string>& path) {
    // A resolver call "name:args" has a ':' before any nested "${".
    const size_t colon = body.find(':');
    const size_t nested = body.find("${");
    if (colon != std::string::npos && (nested == std::string::npos || colon < nested)) {
      return call_resolver(trim(body.substr(0, colon)), body.substr(colon + 1), path);
    }
    return reference(trim(body), path);
  }

  Node call_resolver(const std::string& name, const std::string& args_text, const std::vector<std::string>& path) {
    if (name != "multiply") {
      throw InterpolationError("unsupported resolver '" + name +
                               "' (supported: ${path}, ${.sibling}, ${multiply:a,b})");
    }
    std::vector<std::string> args;
    int depth = 0;
    std::string cur;
    for (size_t i = 0; i < args_text.size(); ++i) {
      const char c = args_text[i];
      if (c == '$' && i + 1 < args_text.size() && args_text[i + 1] == '{') ++depth;
      if (c == '}') --depth;
      if (c == ',' && depth == 0) {
        args.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    args.push_back(cur);
    if (args.size() < 2) throw InterpolationError("multiply expects at least 2 arguments, found " + std::to_string(args.size()));
    bool all_int = true;
    int64_t iproduct = 1;
    double dproduct = 1.0;
    for (const auto& raw : args) {
      const Node value = has_interpolation(raw) ? evaluate_text(trim(raw), path) : Node::scalar_of(trim(raw));
      int64_t i = 0;
      double d = 0;
      if (value.kind == Node::Kind::kScalar && parse_int(value.scalar, i)) {
        if (all_int && __builtin_mul_overflow(iproduct, i, &iproduct)) {
          throw InterpolationError("multiply overflows a 64-bit integer (the product of " + trim(args_text) +
                                   " is beyond +-9223372036854775807)");
        }
        dproduct *= static_cast<double>(i);
      } else if (value.kind == Node::Kind::kScalar && parse_double(value.scalar, d)) {
        all_int = false;
        dproduct *= d;
      } else {
        throw InterpolationError("multiply expects numbers, found " + describe(value));
      }
    }
    if (!all_int && !std::isfinite(dproduct)) {
      throw InterpolationError("multiply overflows a double (the product of " + trim(args_text) + " is not finite)");
    }
    return Node::scalar_of(all_int ? std::to_string(iproduct) : format_double(dproduct));
  }

  Node reference(const std::string& ref, const std::vector<std::string>& path) {
    if (ref.empty()) throw InterpolationError("empty interpolation ${}");
    // Leading dots: one = the mapping holding this value, each further dot = one level up.
    std::vector<std::string> target;
    std::string rest = ref;
    if (ref[0] == '.') {
      size_t dots = 0;
      while (dots < ref.size() && ref[dots] == '.') ++dots;
      if (dots > path.size()) throw InterpolationError("relative interpolation ${" + ref + "} goes above the document root");
      target.assign(path.begin(), path.end() - static_cast<long>(dots));
      rest = ref.substr(dots);
    }
    if (!rest.empty()) {
      for (const auto& k : split_path(rest)) target.push_back(k);
    }
    const std::string target_path = join_path(target, target.size());
    Node* cur = &root_;
    for (size_t i = 0; i < target.size(); ++i) {
      Node* next = nullptr;
      int64_t index = -1;
      if (cur->kind == Node::Kind::kMap) {
        next = cur->find(target[i]);
      } else if (cur->kind == Node::Kind::kSequence && parse_int(target[i], index) && index >= 0 &&
                 static_cast<size_t>(index) < cur->items.size()) {
        next = &cur->items[static_cast<size_t>(index)];
      }
      if (!next) {
        std::string hint;
        if (key_index(kind_).fields.count(target_path) || key_index(kind_).sections.count(target_path)) {
          hint = " (references see only keys written in the recipe or set by overrides, not defaults)";
        } else {
          hint = suggest_key(target_path, kind_);
        }
        throw InterpolationError("interpolation ${" + ref + "} refers to '" + target_path +
                                 "', which is not set" + hint);
      }
      cur = next;
    }
    if (cur->invalid) throw InterpolationError("interpolation ${" + ref + "} refers to '" + target_path + "', which has an error");
    std::vector<std::string> target_copy = target;
    resolve_tree(*cur, target_copy);
    if (cur->invalid) throw InterpolationError("interpolation ${" + ref + "} refers to '" + target_path + "', which has an error");
    if (cur->kind != Node::Kind::kScalar) spend(footprint(*cur, budget_left_), path);
    return *cur;
  }

  Node& root_;
  Diagnostics& diag_;
  RecipeKind kind_;  // whose keys the hints name
  std::vector<std::string> in_progress_;
  int nesting_ = 0;
  size_t budget_left_ = kInterpolationBudget;
};

}  // namespace

void resolve_interpolations(Node& root, Diagnostics& diag, RecipeKind kind) {
  Resolver resolver(root, diag, kind);
  std::vector<std::string> path;
  resolver.resolve_tree(root, path);
}

}  // namespace loom::config::detail
