#include "serve/chat_api.h"

#include <fmt/format.h>

#include <cmath>

#include "serve/api_fields.h"
#include "serve/chat_template.h"
#include "serve/limits.h"

namespace loom::serve {

using nlohmann::json;
using fields::bad;
using fields::present;

namespace {

// One message of `messages`: an object with a non-empty `role`, a `content` (a text, or a list
// of text parts joined by newlines, as vLLM joins them for text templates) and optionally a
// `name`; returned as the template sees it.
json message(const json& m, size_t i) {
  const std::string at = fmt::format("messages[{}]", i);
  if (!m.is_object()) throw bad(at, "expected an object {\"role\": ..., \"content\": ...}, found " + excerpt(m));
  for (const auto& [key, value] : m.items())
    if (key != "role" && key != "content" && key != "name")
      throw bad(at + "." + fields::field_name(key), "unknown field (a message has role, content and name)");
  if (!present(m, "role") || !m["role"].is_string() || m["role"].get_ref<const std::string&>().empty())
    throw bad(at + ".role", "expected a non-empty string such as \"system\", \"user\" or \"assistant\"");
  if (!present(m, "content")) throw bad(at + ".content", "is required");
  json out = {{"role", m["role"]}};
  const json& content = m["content"];
  if (content.is_string()) {
    out["content"] = content;
  } else if (content.is_array()) {
    std::string text;
    for (size_t k = 0; k < content.size(); ++k) {
      const json& part = content[k];
      if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
          !part["text"].is_string())
        throw bad(fmt::format("{}.content[{}]", at, k),
                  "expected a text part {\"type\": \"text\", \"text\": ...} (other parts are not supported), found " +
                      excerpt(part));
      text += (k ? "\n" : "") + part["text"].get<std::string>();
    }
    out["content"] = text;
  } else {
    throw bad(at + ".content", "expected a string or a list of text parts, found " + excerpt(content));
  }
  if (present(m, "name")) {
    if (!m["name"].is_string()) throw bad(at + ".name", "expected a string, found " + excerpt(m["name"]));
    out["name"] = m["name"];
  }
  return out;
}

// The rendered prompt's ids: the template's bos and eos texts are their special ids, the text
// between them is tokenized as text.
std::vector<int64_t> encode_rendered(const std::string& text, const ApiContext& api) {
  const data::Tokenizer& tok = *api.tokenizer;
  std::vector<std::pair<std::string, int64_t>> specials;
  if (!api.chat_template->eos_token().empty() && tok.eod_id() >= 0)
    specials.push_back({api.chat_template->eos_token(), tok.eod_id()});
  if (!api.chat_template->bos_token().empty() && tok.bos_id() >= 0)
    specials.push_back({api.chat_template->bos_token(), tok.bos_id()});
  std::vector<int64_t> ids;
  std::vector<int32_t> piece;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t next = std::string::npos;
    const std::pair<std::string, int64_t>* found = nullptr;
    for (const auto& s : specials) {
      const size_t at = text.find(s.first, pos);
      if (at < next) next = at, found = &s;
    }
    piece.clear();
    tok.encode(std::string_view(text).substr(pos, next == std::string::npos ? std::string::npos : next - pos), piece);
    ids.insert(ids.end(), piece.begin(), piece.end());
    if (!found) break;
    ids.push_back(found->second);
    pos = next + found->first.size();
  }
  return ids;
}

}  // namespace

ChatJob parse_chat(const json& body, const ApiContext& api) {
  fields::check_fields(body, {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                              "top_k", "n", "stream", "stream_options", "stop", "seed", "presence_penalty",
                              "frequency_penalty", "repetition_penalty", "min_tokens", "logit_bias", "user",
                              "logprobs", "top_logprobs", "add_generation_prompt"});
  if (present(body, "max_tokens") && present(body, "max_completion_tokens"))
    throw bad("max_completion_tokens", "give one of max_tokens and max_completion_tokens");
  const char* budget_field = present(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  OpenAiCommon common = parse_openai_common(body, api, budget_field);
  ChatJob job;
  job.stream = common.stream;
  job.include_usage = common.include_usage;
  job.model = common.model;
  job.logprobs = fields::get_bool(body, "logprobs", false);
  const int64_t top = fields::get_int(body, "top_logprobs", 0, 0, limits::kMaxTopLogprobs);
  if (top > 0 && !job.logprobs) throw bad("top_logprobs", "needs \"logprobs\": true");
  const bool add_generation_prompt = fields::get_bool(body, "add_generation_prompt", true);

  if (!present(body, "messages")) throw bad("messages", "is required");
  const json& given = body["messages"];
  if (!given.is_array() || given.empty())
    throw bad("messages", "expected a non-empty list of messages {\"role\": ..., \"content\": ...}, found " +
                              excerpt(given));
  if (given.size() > limits::kMaxChatMessages)
    throw bad("messages", fmt::format("at most {} messages, found {}", limits::kMaxChatMessages, given.size()));
  json messages = json::array();
  for (size_t i = 0; i < given.size(); ++i) messages.push_back(message(given[i], i));
  if (!api.chat_template)
    throw bad("messages", "this server has no chat template: the checkpoint has none (loom convert --from hf copies a "
                          "model's to RUN/tokenizer/chat_template.jinja) and loom serve was started without "
                          "--chat-template FILE; use /v1/completions");
  try {
    job.prompt_text = api.chat_template->render(messages, add_generation_prompt);
  } catch (const ChatTemplateError& e) {
    throw bad("messages", std::string("the chat template refused the conversation: ") + e.what());
  }
  if (api.max_prompt_bytes > 0 && job.prompt_text.size() > api.max_prompt_bytes)
    throw bad("messages", fmt::format("the rendered prompt has {} bytes, more than this server accepts: {} bytes "
                                      "(the model's context of {} tokens × the bytes of the tokenizer's longest token)",
                                      job.prompt_text.size(), api.max_prompt_bytes, api.context));
  RequestSpec& spec = common.base;
  spec.prompt = encode_rendered(job.prompt_text, api);
  if (spec.prompt.empty()) throw bad("messages", "the chat template rendered an empty prompt");
  if (!present(body, "max_tokens") && !present(body, "max_completion_tokens"))  // the rest of the context
    spec.max_new_tokens = std::max<int64_t>(api.context - static_cast<int64_t>(spec.prompt.size()), 0);
  check_prompt_fits(spec.prompt, spec.max_new_tokens, api, budget_field, "messages");
  spec.logprobs = job.logprobs;
  spec.top_logprobs = top;
  job.spec = std::move(spec);
  return job;
}

namespace {

json byte_list(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

json entry(int64_t id, double logprob, const data::Tokenizer& tok) {
  const std::string text = token_text(id, tok);
  return {{"token", text}, {"logprob", std::isnan(logprob) ? json() : json(logprob)}, {"bytes", byte_list(text)}};
}

}  // namespace

json chat_logprobs(const ChatJob& job, const RequestResult& r, const ApiContext& api) {
  const auto& tok = *api.tokenizer;
  json content = json::array();
  // Generated tokens up to the stop string's cut (the text's end).
  int64_t budget = static_cast<int64_t>(generated_text(job.spec, r, tok).size());
  for (size_t i = 0; i < r.tokens.size() && budget > 0; ++i) {
    json e = entry(r.tokens[i], r.logprobs[i], tok);
    budget -= static_cast<int64_t>(e["bytes"].size());
    json top = json::array();
    for (const auto& [id, lp] : r.top[i]) top.push_back(entry(id, lp, tok));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return content;
}

size_t chat_logprob_entries_within(const json& content, size_t bytes) {
  size_t n = 0, end = 0;
  while (n < content.size() && (end += content[n]["bytes"].size()) <= bytes) ++n;
  return n;
}

json chat_response(const ChatJob& job, const RequestResult& r, const ApiContext& api, const std::string& id,
                   int64_t created) {
  const json logprobs = job.logprobs ? json{{"content", chat_logprobs(job, r, api)}} : json();
  json choice = {{"index", 0},
                 {"message", {{"role", "assistant"}, {"content", generated_text(job.spec, r, *api.tokenizer)}}},
                 {"logprobs", logprobs},
                 {"finish_reason", r.finish_reason.empty() ? json() : json(r.finish_reason)}};
  return {{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", job.model},
          {"choices", json::array({choice})}, {"usage", usage({r})}};
}

}  // namespace loom::serve
