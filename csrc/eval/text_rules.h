// The string rules lm-evaluation-harness applies in Python, written out so that Loom builds
// the same requests and counts (docs/design/evaluation.md, "Text rules"): Python's notion of
// whitespace (str.isspace, which `re`'s \s also uses on str patterns), str.rstrip/strip,
// str.split(' '), the word count of re.split(r"\s+", s), and the harness's WikiText
// detokenizer (tasks/wikitext/preprocess_wikitext.py). Strings are UTF-8; lengths in Python
// count code points.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::eval {

/// Python's str.isspace() for one code point (Unicode White_Space plus U+001C..U+001F).
bool is_python_space(char32_t c);

/// Python's len(s): the number of code points of UTF-8 `s` (invalid bytes count one each).
int64_t python_length(std::string_view s);

/// s.rstrip() / s.strip() with Python's whitespace.
std::string_view rstrip(std::string_view s);
std::string_view strip(std::string_view s);

/// s.split(' '): pieces between single spaces (empty pieces kept).
std::vector<std::string> split_on_space(std::string_view s);

/// len(re.split(r"\s+", s)): one more than the number of maximal whitespace runs.
int64_t count_words(std::string_view s);

/// str.replace(from, to): every non-overlapping occurrence, left to right.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to);

/// Python's str.capitalize() on ASCII letters (first upper, the rest lower); other code points
/// are kept as they are.
std::string capitalize_ascii(std::string_view s);

/// The harness's wikitext_detokenizer (undoes WikiText's " @-@ ", " , " ... spacing).
std::string wikitext_detokenize(std::string_view page);

/// The harness's HellaSwag text cleanup (tasks/hellaswag/utils.py, preprocess): strip,
/// " [title]" -> ". ", drop "[...]" (shortest), "  " -> " ".
std::string hellaswag_preprocess(std::string_view text);

}  // namespace loom::eval
