#include "serve/http_api.h"

#include <algorithm>

#include <fmt/format.h>

#include <cmath>
#include <random>
#include <set>

#include "generate/generate_run.h"
#include "generate/request_checks.h"
#include "serve/api_fields.h"
#include "serve/limits.h"
#include "serve/prompt_requests.h"

namespace loom::serve {

using nlohmann::json;

namespace {

using limits::kMaxPrompts;
using limits::kMaxTopLogprobs;
constexpr const char* kEndOfText = "<|endoftext|>";
using fields::bad;
using fields::check_fields;
using fields::field_name;
using fields::get_bool;
using fields::get_int;
using fields::get_number;
using fields::get_strings;
using fields::get_temperature;
using fields::present;

uint64_t fresh_seed() {
  static std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

// A prompt text's bytes are bounded before it is tokenized (limits.h).
void check_prompt_bytes(const std::string& text, const ApiContext& api, const char* field) {
  if (api.max_prompt_bytes > 0 && text.size() > api.max_prompt_bytes)
    throw bad(field, fmt::format("a text of {} bytes, more than this server accepts: {} bytes (the model's context "
                                 "of {} tokens × the bytes of the tokenizer's longest token)",
                                 text.size(), api.max_prompt_bytes, api.context));
}

std::vector<int64_t> encode(const std::string& text, const ApiContext& api, bool add_bos, const char* field) {
  check_prompt_bytes(text, api, field);
  std::vector<int64_t> ids;
  if (add_bos && api.tokenizer->bos_id() >= 0) ids.push_back(api.tokenizer->bos_id());
  for (int32_t id : api.tokenizer->encode(text)) ids.push_back(id);
  // An empty prompt starts a new document, as `loom generate` does.
  const int32_t document_start = data::document_start_id(*api.tokenizer);
  if (ids.empty() && document_start >= 0) ids.push_back(document_start);
  return ids;
}

// The model as the request check sees it (generate/request_checks.h).
generate::ModelBounds bounds(const ApiContext& api) {
  return {static_cast<int64_t>(api.tokenizer->vocab_size()), api.context};
}

// The shared request check's refusal as this API's (400 naming the field).
ApiError bad(const generate::RequestError& e) { return bad(e.field(), e.message()); }

std::vector<int64_t> token_list(const json& v, const ApiContext& api) {
  std::vector<int64_t> ids;
  try {
    generate::check_prompt_length(static_cast<int64_t>(v.size()), bounds(api), "prompt");
  } catch (const generate::RequestError& e) {
    throw bad(e);
  }
  const int64_t vocab = static_cast<int64_t>(api.tokenizer->vocab_size());
  for (const auto& t : v) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
      throw bad("prompt", fmt::format("token ids must be integers in [0, {}), found {}", vocab, excerpt(t)));
    ids.push_back(t.get<int64_t>());
  }
  if (ids.empty()) throw bad("prompt", "a list of token ids must not be empty");
  return ids;
}

// OpenAI's prompt: "text", ["text", ...], [id, ...] or [[id, ...], ...].
std::vector<std::vector<int64_t>> prompts(const json& body, const ApiContext& api) {
  if (!present(body, "prompt")) throw bad("prompt", "is required");
  const json& p = body["prompt"];
  std::vector<std::vector<int64_t>> out;
  if (p.is_string()) {
    out.push_back(encode(p.get<std::string>(), api, false, "prompt"));
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    out.push_back(token_list(p, api));
  } else if (p.is_array() && !p.empty()) {
    if (p.size() > kMaxPrompts)
      throw bad("prompt", fmt::format("at most {} prompts per request, found {}", kMaxPrompts, p.size()));
    for (const auto& e : p) {
      if (e.is_string()) out.push_back(encode(e.get<std::string>(), api, false, "prompt"));
      else if (e.is_array()) out.push_back(token_list(e, api));
      else throw bad("prompt", "expected texts or lists of token ids, found an element " + excerpt(e));
    }
  } else {
    throw bad("prompt", "expected a text, a list of texts, a list of token ids or a list of those, found " + excerpt(p));
  }
  return out;
}

void check_lengths(const std::vector<int64_t>& prompt, int64_t max_new, const ApiContext& api, const char* length_field,
                   const char* prompt_field) {
  generate::RequestFieldNames names;
  names.prompt = prompt_field;
  names.max_new_tokens = length_field;
  const int64_t n = static_cast<int64_t>(prompt.size());
  try {
    generate::check_prompt_length(n, bounds(api), names.prompt);
    generate::check_token_budget(n, max_new, bounds(api), names);
  } catch (const generate::RequestError& e) {
    throw bad(e);
  }
}

// OpenAI's body with `taskname`: `prompt` is one record or a list of records of that task.
std::vector<RequestSpec> task_requests(const json& body, const RequestSpec& base, const ApiContext& api) {
  const int64_t task = prompt_task_index(api.prompts, body["taskname"], "taskname");
  if (get_bool(body, "echo", false)) throw bad("echo", "is not supported with taskname (the prompt holds virtual tokens)");
  if (!present(body, "prompt")) throw bad("prompt", "is required");
  const json& p = body["prompt"];
  const json records = p.is_array() ? p : json::array({p});
  if (records.empty() || records.size() > kMaxPrompts)
    throw bad("prompt", fmt::format("expected 1..{} records of the task's fields", kMaxPrompts));
  std::vector<RequestSpec> specs;
  for (const auto& record : records) {
    RequestSpec spec = base;
    lay_out_record(*api.prompts, task, record, *api.tokenizer, "prompt", spec);
    check_lengths(spec.prompt, spec.max_new_tokens, api, "max_tokens", "prompt");
    specs.push_back(std::move(spec));
  }
  return specs;
}

std::string token_string(int64_t id, const data::Tokenizer& tokenizer) {
  return tokenizer.decode({static_cast<int32_t>(id)});
}

std::string decode(const std::vector<int64_t>& ids, const data::Tokenizer& tokenizer) {
  return tokenizer.decode(std::vector<int32_t>(ids.begin(), ids.end()));
}

json top_object(const std::vector<std::pair<int64_t, double>>& top, const data::Tokenizer& tokenizer) {
  json o = json::object();
  for (const auto& [id, lp] : top) {
    const std::string key = token_string(id, tokenizer);
    if (!o.contains(key)) o[key] = lp;  // two ids may decode alike: keep the more probable
  }
  return o;
}

json number_or_null(double x) { return std::isnan(x) ? json() : json(x); }

}  // namespace

json error_body(int status, const std::string& message, const std::string& field) {
  const char* type = status == 401 ? "authentication_error" : status >= 500 ? "server_error" : "invalid_request_error";
  return {{"error", {{"message", message}, {"type", type}, {"param", field.empty() ? json() : json(field)}, {"code", status}}}};
}

std::string dump_json(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string excerpt(const json& value) {
  constexpr size_t kMax = 80;
  std::string text = dump_json(value);
  if (text.size() <= kMax) return text;
  text.resize(kMax);
  return text + "...";
}

size_t max_prompt_bytes(const data::Tokenizer& tokenizer, int64_t context) {
  size_t longest = 1;
  const auto vocab = static_cast<int32_t>(tokenizer.vocab_size());
  for (int32_t id = 0; id < vocab; ++id) longest = std::max(longest, tokenizer.decode({id}).size());
  return static_cast<size_t>(std::max<int64_t>(context, 1)) * longest;
}

json parse_request_body(const std::string& body) {
  // The keys from the body object down to where the parser is (a nested object's key after
  // its parent's), for naming the field of an error.
  std::vector<std::string> path;
  auto where = [&path] {
    std::string out;
    for (const auto& key : path)  // an array's level holds no key
      if (!key.empty()) out += (out.empty() ? "" : ".") + field_name(key);
    return out.empty() ? std::string("body") : out;
  };
  // nlohmann's depth: containers open around a key; the new container's parent count at a start.
  const json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    using E = json::parse_event_t;
    if (event == E::key) {
      path.resize(static_cast<size_t>(depth));
      if (depth > 0) path.back() = parsed.get<std::string>();
    } else if (event == E::object_start || event == E::array_start) {
      if (depth + 1 > limits::kMaxJsonDepth)  // named by the body's field that holds it
        throw bad(path.empty() || path[0].empty() ? "body" : field_name(path[0]),
                  fmt::format("arrays and objects nested deeper than {} levels", limits::kMaxJsonDepth));
    } else if (event == E::object_end || event == E::array_end) {
      if (path.size() > static_cast<size_t>(depth)) path.resize(static_cast<size_t>(depth));
    }
    return true;
  };
  try {
    return json::parse(body, callback);
  } catch (const json::out_of_range&) {  // 406: a number past a double's range
    throw bad(where(), "a number too large for a double (finite numbers up to about 1.8e308 are accepted)");
  } catch (const json::parse_error& e) {
    std::string message = e.what();
    if (message.size() > 200) message = message.substr(0, 200) + "...";
    throw bad("body", "malformed JSON: " + message);
  }
}

std::string generated_text(const RequestSpec& spec, const RequestResult& result, const data::Tokenizer& tokenizer) {
  return generate::continuation_text(result.tokens, spec.stop_strings, tokenizer);
}

size_t streamable_prefix(const std::string& text, const std::vector<std::string>& stop_strings) {
  size_t keep = text.size();
  // A tail that begins a stop string waits until it is known not to be one.
  for (const auto& stop : stop_strings)
    for (size_t len = std::min(stop.size() - 1, text.size()); len > 0; --len)
      if (text.compare(text.size() - len, len, stop, 0, len) == 0) {
        keep = std::min(keep, text.size() - len);
        break;
      }
  // An incomplete UTF-8 character at the end waits for its remaining bytes.
  size_t i = keep, back = 0;
  while (i > 0 && back < 4 && (static_cast<unsigned char>(text[i - 1]) & 0xC0) == 0x80) --i, ++back;
  if (i > 0) {
    const unsigned char lead = static_cast<unsigned char>(text[i - 1]);
    const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (need > 1 && back + 1 < need) keep = i - 1;
  }
  return keep;
}

OpenAiCommon parse_openai_common(const json& body, const ApiContext& api, const char* max_tokens_field) {
  if (present(body, "model") && !body["model"].is_string()) throw bad("model", "expected a string");
  OpenAiCommon common;
  common.model = present(body, "model") ? body["model"].get<std::string>() : api.model_name;
  if (common.model != api.model_name) {
    const auto adapter = std::find(api.adapters.begin(), api.adapters.end(), common.model);
    if (adapter == api.adapters.end()) {
      std::string served = "'" + api.model_name + "'";
      for (const auto& a : api.adapters) served += ", '" + a + "'";
      throw ApiError(404, "model", fmt::format("this server serves {}, not {}", served, excerpt(body["model"])));
    }
    common.base.adapter = adapter - api.adapters.begin();
  }
  if (present(body, "user") && !body["user"].is_string()) throw bad("user", "expected a string");
  get_int(body, "n", 1, 1, 1);
  get_int(body, "best_of", 1, 1, 1);
  get_number(body, "presence_penalty", 0, 0, 0);
  get_number(body, "frequency_penalty", 0, 0, 0);
  if (present(body, "logit_bias") && !(body["logit_bias"].is_object() && body["logit_bias"].empty()))
    throw bad("logit_bias", "is not supported");
  common.stream = get_bool(body, "stream", false);
  if (present(body, "stream_options")) {
    const json& o = body["stream_options"];
    if (!o.is_object()) throw bad("stream_options", "expected an object");
    for (const auto& [k, v] : o.items())
      if (k != "include_usage") throw bad("stream_options." + k, "unknown field");
    common.include_usage = get_bool(o, "include_usage", false);
  }
  RequestSpec& base = common.base;
  base.max_new_tokens = get_int(body, max_tokens_field, 16, 0, api.context);
  const double temperature = get_temperature(body, "temperature", 1.0, /*zero_is_greedy=*/true);
  base.sampling.greedy = temperature == 0.0;
  base.sampling.temperature = temperature == 0.0 ? 1.0 : temperature;
  base.sampling.top_p = get_number(body, "top_p", 1.0, 0.0, 1.0, /*open_lo=*/true);
  base.sampling.top_k = get_int(body, "top_k", 0, 0, INT64_MAX);
  base.sampling.repetition_penalty = get_number(body, "repetition_penalty", 1.0, limits::kMinRepetitionPenalty,
                                                limits::kMaxRepetitionPenalty);
  base.sampling.seed = present(body, "seed") ? static_cast<uint64_t>(get_int(body, "seed", 0, INT64_MIN, INT64_MAX))
                                             : fresh_seed();
  base.min_new_tokens = get_int(body, "min_tokens", 0, 0, api.context);
  base.stop_strings = get_strings(body, "stop", {}, limits::kMaxStopStrings);
  return common;
}

std::vector<int64_t> encode_prompt_text(const std::string& text, const ApiContext& api, const char* field) {
  return encode(text, api, false, field);
}

void check_prompt_fits(const std::vector<int64_t>& prompt, int64_t max_tokens, const ApiContext& api,
                       const char* length_field, const char* prompt_field) {
  check_lengths(prompt, max_tokens, api, length_field, prompt_field);
}

std::string token_text(int64_t id, const data::Tokenizer& tokenizer) { return token_string(id, tokenizer); }

CompletionJob parse_completion(const json& body, const ApiContext& api) {
  check_fields(body, {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "best_of", "stream",
                      "stream_options", "logprobs", "echo", "stop", "seed", "presence_penalty", "frequency_penalty",
                      "repetition_penalty", "min_tokens", "logit_bias", "user", "suffix", "taskname"});
  if (present(body, "suffix")) throw bad("suffix", "is not supported");
  OpenAiCommon common = parse_openai_common(body, api, "max_tokens");
  const int64_t max_tokens = common.base.max_new_tokens;
  CompletionJob job;
  job.stream = common.stream;
  job.include_usage = common.include_usage;
  job.model = common.model;
  job.echo = get_bool(body, "echo", false);
  job.logprobs = get_int(body, "logprobs", -1, 0, kMaxTopLogprobs);
  RequestSpec& base = common.base;
  base.logprobs = job.logprobs >= 0;
  base.top_logprobs = std::max<int64_t>(job.logprobs, 0);
  base.prompt_logprobs = job.echo && job.logprobs >= 0;
  if (present(body, "taskname")) {
    job.specs = task_requests(body, base, api);
    return job;
  }
  for (auto& prompt : prompts(body, api)) {
    check_lengths(prompt, max_tokens, api, "max_tokens", "prompt");
    RequestSpec spec = base;
    spec.prompt = std::move(prompt);
    job.specs.push_back(std::move(spec));
  }
  return job;
}

json completion_logprobs(const CompletionJob& job, size_t index, const RequestResult& r, const ApiContext& api) {
  const auto& tok = *api.tokenizer;
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  int64_t offset = 0;
  auto add = [&](int64_t id, double lp, const std::vector<std::pair<int64_t, double>>* top) {
    const std::string s = token_string(id, tok);
    tokens.push_back(s);
    token_logprobs.push_back(number_or_null(lp));
    top_logprobs.push_back(top && !std::isnan(lp) ? top_object(*top, tok) : json());
    offsets.push_back(offset);
    offset += static_cast<int64_t>(s.size());
  };
  if (job.echo)
    for (size_t i = 0; i < r.prompt.size(); ++i)
      add(r.prompt[i], i < r.prompt_logprobs.size() ? r.prompt_logprobs[i] : std::nan(""),
          i < r.prompt_top.size() ? &r.prompt_top[i] : nullptr);
  // Generated tokens up to the stop string's cut (the text's end).
  int64_t budget = static_cast<int64_t>(generated_text(job.specs[index], r, tok).size());
  for (size_t i = 0; i < r.tokens.size() && budget > 0; ++i) {
    budget -= static_cast<int64_t>(token_string(r.tokens[i], tok).size());
    add(r.tokens[i], r.logprobs[i], &r.top[i]);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs},
          {"text_offset", offsets}};
}

size_t logprob_entries_within(const json& logprobs, size_t bytes) {
  const json& tokens = logprobs.at("tokens");
  const json& offsets = logprobs.at("text_offset");
  size_t n = 0;
  while (n < tokens.size() && offsets[n].get<size_t>() + tokens[n].get_ref<const std::string&>().size() <= bytes) ++n;
  return n;
}

json logprob_entries(const json& logprobs, size_t first, size_t last) {
  json out = json::object();
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    const json& all = logprobs.at(key);
    json part = json::array();
    for (size_t i = first; i < last && i < all.size(); ++i) part.push_back(all[i]);
    out[key] = std::move(part);
  }
  return out;
}

json completion_choice(const CompletionJob& job, size_t index, const RequestResult& r, const ApiContext& api) {
  const auto& tok = *api.tokenizer;
  const std::string generated = generated_text(job.specs[index], r, tok);
  std::string text = job.echo ? decode(r.prompt, tok) + generated : generated;
  const json logprobs = job.logprobs >= 0 ? completion_logprobs(job, index, r, api) : json();
  return {{"text", text}, {"index", index}, {"logprobs", logprobs},
          {"finish_reason", r.finish_reason.empty() ? json() : json(r.finish_reason)}};
}

json usage(const std::vector<RequestResult>& results) {
  int64_t prompt = 0, completion = 0;
  for (const auto& r : results) {
    prompt += static_cast<int64_t>(r.prompt.size());
    completion += static_cast<int64_t>(r.tokens.size());
  }
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

json completion_response(const CompletionJob& job, const std::vector<RequestResult>& results, const ApiContext& api,
                         const std::string& id, int64_t created) {
  json choices = json::array();
  for (size_t i = 0; i < results.size(); ++i) choices.push_back(completion_choice(job, i, results[i], api));
  return {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", job.model},
          {"choices", choices}, {"usage", usage(results)}};
}

NemoJob parse_nemo(const json& body, const ApiContext& api) {
  check_fields(body, {"sentences", "tokens_to_generate", "temperature", "add_BOS", "top_k", "top_p", "greedy",
                      "all_probs", "repetition_penalty", "min_tokens_to_generate", "end_strings", "compute_logprob",
                      "random_seed", "task_ids"});
  if (!present(body, "sentences")) throw bad("sentences", "is required");
  const json& sentences = body["sentences"];
  if (!sentences.is_array() || sentences.empty()) throw bad("sentences", "expected a non-empty list of strings");
  if (sentences.size() > kMaxPrompts)
    throw bad("sentences", fmt::format("at most {} sentences per request, found {}", kMaxPrompts, sentences.size()));
  NemoJob job;
  job.all_probs = get_bool(body, "all_probs", false);
  job.compute_logprob = get_bool(body, "compute_logprob", false);
  RequestSpec base;
  base.max_new_tokens = get_int(body, "tokens_to_generate", 64, 0, api.context);
  base.sampling.greedy = get_bool(body, "greedy", false);
  base.sampling.temperature = get_temperature(body, "temperature", 1.0, /*zero_is_greedy=*/false);
  base.sampling.top_k = get_int(body, "top_k", 0, 0, INT64_MAX);
  base.sampling.top_p = get_number(body, "top_p", 0.9, 0.0, 1.0);
  if (base.sampling.top_p == 0.0) base.sampling.top_p = 1.0;  // NeMo: 0 switches the nucleus filter off
  base.sampling.repetition_penalty = get_number(body, "repetition_penalty", 1.0, 1.0, limits::kMaxRepetitionPenalty);
  base.sampling.seed = present(body, "random_seed")
                           ? static_cast<uint64_t>(get_int(body, "random_seed", 0, 0, INT64_MAX))
                           : fresh_seed();
  base.min_new_tokens = get_int(body, "min_tokens_to_generate", 0, 0, api.context);
  std::vector<std::string> ends = get_strings(body, "end_strings", {kEndOfText}, limits::kMaxEndStrings);
  base.stop_at_eod = false;
  for (const auto& s : ends) {
    if (s == kEndOfText) base.stop_at_eod = true;
    else base.stop_strings.push_back(s);
  }
  base.logprobs = job.compute_logprob || job.all_probs;
  base.prompt_logprobs = base.logprobs;
  base.top_logprobs = job.all_probs ? kMaxTopLogprobs : 0;
  const bool add_bos = get_bool(body, "add_BOS", false);
  const json task_ids = present(body, "task_ids") ? body["task_ids"] : json();
  if (!task_ids.is_null() && !(task_ids.is_array() && task_ids.size() == sentences.size()))
    throw bad("task_ids", fmt::format("expected a list of {} task names or indices (null: a plain sentence)",
                                      sentences.size()));
  for (size_t i = 0; i < sentences.size(); ++i) {
    const json& s = sentences[i];
    RequestSpec spec = base;
    if (!task_ids.is_null() && !task_ids[i].is_null()) {  // a record of a learned prompt's task
      const int64_t task = prompt_task_index(api.prompts, task_ids[i], fmt::format("task_ids[{}]", i));
      lay_out_record(*api.prompts, task, s, *api.tokenizer, fmt::format("sentences[{}]", i), spec);
    } else {
      if (!s.is_string()) throw bad("sentences", "expected strings, found an element " + excerpt(s));
      spec.prompt = encode(s.get<std::string>(), api, add_bos, "sentences");
    }
    check_lengths(spec.prompt, spec.max_new_tokens, api, "tokens_to_generate", "sentences");
    job.specs.push_back(std::move(spec));
  }
  return job;
}

json nemo_response(const NemoJob& job, const std::vector<RequestResult>& results, const ApiContext& api) {
  const auto& tok = *api.tokenizer;
  json sentences = json::array(), tokens = json::array(), logprob = json::array(), full = json::array(),
       ids = json::array(), offsets = json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    const std::string generated = generated_text(job.specs[i], r, tok);
    // The prompt's shown tokens (not the virtual positions of a learned prompt); the first has
    // no log-probability.
    const std::vector<size_t> shown = text_positions(job.specs[i]);
    std::vector<int64_t> all;
    std::vector<double> lps;
    std::vector<std::vector<std::pair<int64_t, double>>> tops;
    for (size_t k = 0; k < shown.size(); ++k) {
      all.push_back(r.prompt[shown[k]]);
      if (k > 0 && shown[k] < r.prompt_logprobs.size()) lps.push_back(r.prompt_logprobs[shown[k]]);
      if (k > 0 && shown[k] < r.prompt_top.size()) tops.push_back(r.prompt_top[shown[k]]);
    }
    sentences.push_back(decode(all, tok) + generated);
    int64_t budget = static_cast<int64_t>(generated.size());
    for (size_t k = 0; k < r.tokens.size() && budget > 0; ++k) {
      budget -= static_cast<int64_t>(token_string(r.tokens[k], tok).size());
      all.push_back(r.tokens[k]);
      lps.push_back(r.logprobs[k]);
      tops.push_back(r.top[k]);
    }
    json strings = json::array(), starts = json::array();
    int64_t offset = 0;
    for (int64_t id : all) {
      const std::string s = token_string(id, tok);
      strings.push_back(s);
      starts.push_back(offset);
      offset += static_cast<int64_t>(s.size());
    }
    tokens.push_back(strings);
    ids.push_back(all);
    offsets.push_back(starts);
    logprob.push_back(lps);
    json alternatives = json::array();
    for (const auto& t : tops) alternatives.push_back(top_object(t, tok));
    full.push_back(alternatives);
  }
  json out = {{"sentences", sentences}, {"tokens", tokens}, {"token_ids", ids}, {"offsets", offsets},
              {"logprob", job.compute_logprob ? logprob : json()}};
  if (job.all_probs) out["full_logprob"] = full;
  return out;
}

}  // namespace loom::serve
