#include "eval/text_rules.h"

#include <pcre2.h>

#include <memory>
#include <stdexcept>

namespace loom::eval {

namespace {

// Decodes the code point starting at s[i] and advances i past it; a byte that does not start
// a whole UTF-8 sequence counts as one code point.
char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const int extra = b < 0x80 ? 0 : (b & 0xE0) == 0xC0 ? 1 : (b & 0xF0) == 0xE0 ? 2 : (b & 0xF8) == 0xF0 ? 3 : -1;
  if (extra <= 0 || i + extra >= s.size()) {
    ++i;
    return b;
  }
  char32_t c = b & (0x3F >> extra);
  for (int k = 1; k <= extra; ++k) {
    const auto cont = static_cast<unsigned char>(s[i + k]);
    if ((cont & 0xC0) != 0x80) {
      ++i;
      return b;
    }
    c = (c << 6) | (cont & 0x3F);
  }
  i += extra + 1;
  return c;
}

// Byte offset where the trailing whitespace of `s` starts.
size_t trailing_space_start(std::string_view s) {
  size_t end = 0, i = 0;
  while (i < s.size()) {
    const char32_t c = next_code_point(s, i);
    if (!is_python_space(c)) end = i;
  }
  return end;
}

// Python's \s as a PCRE2 class (str.isspace's code points), for patterns written with \s.
constexpr const char* kSpace =
    "[\\t\\n\\x0b\\x0c\\r\\x1c-\\x1f \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"
    "\\x{202f}\\x{205f}\\x{3000}]";

std::string with_space_class(std::string_view pattern) {
  return replace_all(pattern, "\\s", kSpace);
}

// re.sub(pattern, replacement, text) for one compiled pattern (replacement uses $1).
class Substitution {
 public:
  Substitution(std::string_view pattern, std::string replacement) : replacement_(std::move(replacement)) {
    const std::string p = with_space_class(pattern);
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF, &error, &offset, nullptr);
    if (!code_) throw std::logic_error("text_rules: cannot compile the pattern " + p);
  }
  ~Substitution() { pcre2_code_free(code_); }
  Substitution(const Substitution&) = delete;
  Substitution& operator=(const Substitution&) = delete;

  std::string apply(const std::string& text) const {
    std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> match(
        pcre2_match_data_create_from_pattern(code_, nullptr), pcre2_match_data_free);
    PCRE2_SIZE size = text.size() + text.size() / 2 + 64;
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::string out(size, '\0');
      PCRE2_SIZE out_size = out.size();
      const int rc = pcre2_substitute(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                                      PCRE2_SUBSTITUTE_GLOBAL | PCRE2_SUBSTITUTE_OVERFLOW_LENGTH, match.get(),
                                      nullptr, reinterpret_cast<PCRE2_SPTR>(replacement_.data()),
                                      replacement_.size(), reinterpret_cast<PCRE2_UCHAR*>(out.data()), &out_size);
      if (rc >= 0) {
        out.resize(out_size);
        return out;
      }
      if (rc != PCRE2_ERROR_NOMEMORY) throw std::runtime_error("text_rules: a regular expression failed on the text");
      size = out_size + 1;
    }
    throw std::runtime_error("text_rules: substitution output did not fit");
  }

 private:
  pcre2_code* code_ = nullptr;
  std::string replacement_;
};

}  // namespace

bool is_python_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  switch (c) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

int64_t python_length(std::string_view s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) next_code_point(s, i);
  return n;
}

std::string_view rstrip(std::string_view s) { return s.substr(0, trailing_space_start(s)); }

std::string_view strip(std::string_view s) {
  s = rstrip(s);
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!is_python_space(next_code_point(s, j))) break;
    i = j;
  }
  return s.substr(i);
}

std::vector<std::string> split_on_space(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t pos; (pos = s.find(' ', start)) != std::string_view::npos; start = pos + 1)
    out.emplace_back(s.substr(start, pos - start));
  out.emplace_back(s.substr(start));
  return out;
}

int64_t count_words(std::string_view s) {
  int64_t runs = 0;
  bool in_space = false;
  for (size_t i = 0; i < s.size();) {
    const bool space = is_python_space(next_code_point(s, i));
    if (space && !in_space) ++runs;
    in_space = space;
  }
  return runs + 1;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(s);
  std::string out;
  size_t start = 0;
  for (size_t pos; (pos = s.find(from, start)) != std::string_view::npos; start = pos + from.size()) {
    out.append(s.substr(start, pos - start));
    out.append(to);
  }
  out.append(s.substr(start));
  return out;
}

std::string capitalize_ascii(std::string_view s) {
  std::string out(s);
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i];
    if (i == 0 && c >= 'a' && c <= 'z') out[i] = static_cast<char>(c - 'a' + 'A');
    if (i > 0 && c >= 'A' && c <= 'Z') out[i] = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string wikitext_detokenize(std::string_view page) {
  static const Substitution contraction_digit("/' [0-9]/", "/'[0-9]/");
  static const Substitution round("\\(\\s*([^\\)]*?)\\s*\\)", "($1)");
  static const Substitution square("\\[\\s*([^\\]]*?)\\s*\\]", "[$1]");
  static const Substitution curly("\\{\\s*([^}]*?)\\s*\\}", "{$1}");
  static const Substitution dquote("\"\\s*([^\"]*?)\\s*\"", "\"$1\"");
  static const Substitution squote("'\\s*([^']*?)\\s*'", "'$1'");
  std::string s = replace_all(page, "s '", "s'");
  s = contraction_digit.apply(s);
  for (auto [from, to] : {std::pair{" @-@ ", "-"}, {" @,@ ", ","}, {" @.@ ", "."}, {" : ", ": "}, {" ; ", "; "},
                          {" . ", ". "}, {" ! ", "! "}, {" ? ", "? "}, {" , ", ", "}})
    s = replace_all(s, from, to);
  for (const Substitution* sub : {&round, &square, &curly, &dquote, &squote}) s = sub->apply(s);
  for (auto [from, to] : {std::pair{"= = = =", "===="}, {"= = =", "==="}, {"= =", "=="},
                          {" \xC2\xB0 ", "\xC2\xB0"}, {" \n", "\n"}, {"\n ", "\n"}, {" N ", " 1 "}, {" 's", "'s"}})
    s = replace_all(s, from, to);
  return s;
}

std::string hellaswag_preprocess(std::string_view text) {
  static const Substitution bracketed("\\[.*?\\]", "");
  std::string s = replace_all(strip(text), " [title]", ". ");
  s = bracketed.apply(s);
  return replace_all(s, "  ", " ");
}

}  // namespace loom::eval
