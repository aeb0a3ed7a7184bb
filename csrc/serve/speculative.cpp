#include "serve/speculative.h"

#include <algorithm>
#include <stdexcept>

namespace loom::serve {

SpeculativeMethod parse_speculative_method(const std::string& name) {
  if (name == "none" || name.empty()) return SpeculativeMethod::kNone;
  if (name == "ngram") return SpeculativeMethod::kNgram;
  if (name == "draft" || name == "draft_model") return SpeculativeMethod::kDraft;
  throw std::invalid_argument("--speculative-method: expected none, ngram or draft, found '" + name + "'");
}

void validate(const SpeculativeOptions& o) {
  if (o.num_tokens < 1)
    throw std::invalid_argument("--num-speculative-tokens: expected an integer >= 1, found " +
                                std::to_string(o.num_tokens));
  if (o.prompt_lookup_min < 1)
    throw std::invalid_argument("--prompt-lookup-min: expected an integer >= 1, found " +
                                std::to_string(o.prompt_lookup_min));
  if (o.prompt_lookup_max < o.prompt_lookup_min)
    throw std::invalid_argument("--prompt-lookup-max: expected an integer >= --prompt-lookup-min (" +
                                std::to_string(o.prompt_lookup_min) + "), found " +
                                std::to_string(o.prompt_lookup_max));
}

std::vector<int64_t> propose_ngram_draft(const std::vector<int64_t>& context, int64_t min_n, int64_t max_n,
                                         int64_t k) {
  const int64_t len = static_cast<int64_t>(context.size());
  if (k < 1) return {};
  for (int64_t n = std::min(max_n, len - 1); n >= std::max<int64_t>(min_n, 1); --n) {
    const auto suffix = context.end() - n;
    // An earlier occurrence starting at s ends at s + n <= len - 1: a token follows it.
    for (int64_t s = len - n - 1; s >= 0; --s) {
      if (!std::equal(suffix, context.end(), context.begin() + s)) continue;
      // Past the context's end the draft continues from itself: a run that repeats with period
      // len - s - n goes on repeating.
      std::vector<int64_t> draft;
      for (int64_t i = s + n; static_cast<int64_t>(draft.size()) < k; ++i)
        draft.push_back(i < len ? context[static_cast<size_t>(i)] : draft[static_cast<size_t>(i - len)]);
      return draft;
    }
  }
  return {};
}

}  // namespace loom::serve
