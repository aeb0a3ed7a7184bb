// A checkpoint's chat template (docs/serving.md, "Chat completions"): the Jinja template of a
// Hugging Face tokenizer (tokenizer_config.json's `chat_template`, or `chat_template.jinja`),
// which `loom convert --from hf` copies to RUN/tokenizer/chat_template.jinja, rendered with
// minja (Google's header-only Jinja subset for chat templates, MIT; fetched by tools/setup.sh)
// as transformers' `apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`
// renders it: Jinja with trim_blocks and lstrip_blocks, the messages as given (no rewriting
// of roles), `bos_token`, `eos_token`, `add_generation_prompt`, `raise_exception(message)` and
// `strftime_now(format)`. Torch-free.
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <stdexcept>
#include <string>

namespace loom::serve {

/// The template refused the messages (its `raise_exception`) or failed while rendering them.
class ChatTemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ChatTemplate {
 public:
  /// Parses `source`; `origin` names it in errors (a file path). Throws std::invalid_argument
  /// naming `origin` when the template does not parse.
  ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token, std::string origin);
  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  /// The prompt text of `messages` (a JSON array of message objects, passed to the template
  /// as they are). Thread-safe. Throws ChatTemplateError with the template's message.
  std::string render(const nlohmann::json& messages, bool add_generation_prompt) const;

  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }
  const std::string& origin() const { return origin_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string bos_, eos_, origin_;
};

/// The chat template in `path` (a Jinja file), std::invalid_argument naming it when it cannot
/// be read or parsed.
std::unique_ptr<ChatTemplate> read_chat_template(const std::string& path, std::string bos_token,
                                                 std::string eos_token);

}  // namespace loom::serve
