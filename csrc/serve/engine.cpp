#include "serve/engine.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>

#include "generate/request_checks.h"
#include "generate/token_generator.h"
#include "serve/control_messages.h"

namespace loom::serve {

namespace {

// Rows of full-vocabulary logits gathered at once for a prompt's log-probabilities.
constexpr int64_t kPromptLogitChunk = 64;

// log-softmax of z[0..n) at `token`, and the `top` most probable tokens, in double.
TokenLogprob token_logprob(const float* z, int64_t n, int64_t token, int64_t top) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(z[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(z[i]) - mx);
  const double lse = mx + std::log(sum);
  TokenLogprob out;
  out.token = token;
  out.logprob = static_cast<double>(z[token]) - lse;
  if (top > 0) {
    std::vector<int64_t> ids(static_cast<size_t>(n));
    std::iota(ids.begin(), ids.end(), int64_t{0});
    const int64_t k = std::min(top, n);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [z](int64_t a, int64_t b) {
      return z[a] > z[b] || (z[a] == z[b] && a < b);
    });
    for (int64_t i = 0; i < k; ++i) out.top.emplace_back(ids[i], static_cast<double>(z[ids[i]]) - lse);
  }
  return out;
}

nlohmann::json logprob_json(const TokenLogprob& t) {
  nlohmann::json top = nlohmann::json::array();
  for (const auto& [id, lp] : t.top) top.push_back({id, lp});
  return {t.token, std::isnan(t.logprob) ? nlohmann::json() : nlohmann::json(t.logprob), top};
}

TokenLogprob logprob_from_json(const nlohmann::json& j) {
  TokenLogprob t;
  t.token = j.at(0).get<int64_t>();
  t.logprob = j.at(1).is_null() ? std::nan("") : j.at(1).get<double>();
  for (const auto& e : j.at(2)) t.top.emplace_back(e.at(0).get<int64_t>(), e.at(1).get<double>());
  return t;
}

}  // namespace

// A request holding a cache row, identical on every rank.
struct GenerationEngine::Running {
  uint64_t id = 0;
  RequestSpec spec;
  int64_t row = -1;
  generate::TokenSampler sampler;
  std::vector<int64_t> context;  // prompt, then every generated token
  int64_t generated = 0;
  bool prefilled = false;
  Running(uint64_t id_, RequestSpec spec_, int64_t row_)
      : id(id_), spec(std::move(spec_)), row(row_), sampler(spec.sampling), context(spec.prompt) {}
};

// A token chosen on the last stage for one request (and its prompt's log-probabilities), or
// why none could be chosen.
struct GenerationEngine::Choice {
  TokenLogprob token;
  std::vector<TokenLogprob> prompt;
  std::string error;
};

GenerationEngine::GenerationEngine(const model::GptStage& stage, EngineGroups groups,
                                   EngineOptions options)
    : stage_(stage),
      groups_(std::move(groups)),
      options_(std::move(options)),
      cache_(stage.make_kv_cache(std::max<int64_t>(options_.max_batch, 1),
                                 stage.config().max_position_embeddings)) {
  if (options_.max_batch < 1)
    throw std::invalid_argument("--max-batch: expected an integer >= 1, found " + std::to_string(options_.max_batch));
  if (options_.max_kv_tokens < 0)
    throw std::invalid_argument("--max-kv-tokens: expected an integer >= 0, found " +
                                std::to_string(options_.max_kv_tokens));
  if (options_.max_kv_tokens == 0) options_.max_kv_tokens = options_.max_batch * context();
  for (int64_t r = options_.max_batch - 1; r >= 0; --r) free_rows_.push_back(r);
}

GenerationEngine::~GenerationEngine() = default;

bool GenerationEngine::first_stage() const { return stage_.layout().pre_process; }
bool GenerationEngine::last_stage() const { return stage_.layout().post_process; }

void GenerationEngine::validate(const RequestSpec& spec) const {
  generate::check_request(spec.prompt, spec.max_new_tokens, spec.min_new_tokens, spec.stop_strings,
                          spec.top_logprobs, spec.sampling, {stage_.config().vocab_size, context()}, {});
  const int64_t n = static_cast<int64_t>(spec.prompt.size());
  if (kv_tokens(spec) > options_.max_kv_tokens)
    throw std::invalid_argument(fmt::format(
        "max_tokens: {} prompt tokens + {} new tokens exceed the server's --max-kv-tokens {}", n,
        spec.max_new_tokens, options_.max_kv_tokens));
  if (spec.prompt_task < 0) {
    if (!spec.virtual_positions.empty()) throw std::invalid_argument("prompt: virtual positions without a task");
    return;
  }
  if (spec.prompt_task >= static_cast<int64_t>(options_.prompt_tables.size()))
    throw std::invalid_argument(fmt::format("taskname: task index {} has no prompt table (the server holds {})",
                                            spec.prompt_task, options_.prompt_tables.size()));
  const int64_t rows = options_.prompt_tables[static_cast<size_t>(spec.prompt_task)].size(0);
  if (static_cast<int64_t>(spec.virtual_positions.size()) != rows)
    throw std::invalid_argument(fmt::format("prompt: {} virtual positions for a task of {} virtual tokens",
                                            spec.virtual_positions.size(), rows));
  for (size_t i = 0; i < spec.virtual_positions.size(); ++i) {
    const int64_t at = spec.virtual_positions[i];
    if (at < 0 || at >= n || (i > 0 && at <= spec.virtual_positions[i - 1]))
      throw std::invalid_argument("prompt: virtual positions must increase within the prompt");
  }
}

uint64_t GenerationEngine::submit(RequestSpec spec) {
  validate(spec);
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = next_id_++;
  queue_.emplace_back(id, std::move(spec));
  work_.notify_all();
  return id;
}

void GenerationEngine::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  cancelled_.insert(id);
  work_.notify_all();
}

void GenerationEngine::wait_for_work(int ms) {
  std::unique_lock<std::mutex> lock(mutex_);
  work_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return !queue_.empty() || !cancelled_.empty(); });
}

bool GenerationEngine::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !queue_.empty() || !running_.empty();
}

nlohmann::json GenerationEngine::plan_step(bool stop) {
  nlohmann::json plan = {{"stop", stop}, {"cancel", nlohmann::json::array()}, {"join", nlohmann::json::array()}};
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint64_t> kept;
  for (uint64_t id : cancelled_) {
    if (running_.count(id)) {
      plan["cancel"].push_back(id);
    } else {
      auto it = std::find_if(queue_.begin(), queue_.end(), [id](const auto& q) { return q.first == id; });
      if (it != queue_.end()) queue_.erase(it);  // still waiting: dropped here
      else if (id >= next_id_) kept.push_back(id);
    }
  }
  cancelled_.clear();
  cancelled_.insert(kept.begin(), kept.end());
  int64_t reserved = 0;
  for (const auto& [id, r] : running_) reserved += kv_tokens(r->spec);
  for (const auto& id : plan["cancel"]) reserved -= kv_tokens(running_.at(id.get<uint64_t>())->spec);
  int64_t rows = static_cast<int64_t>(free_rows_.size()) + static_cast<int64_t>(plan["cancel"].size());
  // In order: a request that does not fit waits, and so do the ones behind it.
  while (!queue_.empty() && rows > 0 && reserved + kv_tokens(queue_.front().second) <= options_.max_kv_tokens) {
    auto& [id, spec] = queue_.front();
    plan["join"].push_back({{"id", id}, {"spec", to_json(spec)}});
    reserved += kv_tokens(spec);
    --rows;
    queue_.pop_front();
  }
  reserved_ = reserved;
  return plan;
}

model::PromptSplice GenerationEngine::prompt_splice(const RequestSpec& spec) const {
  model::PromptSplice splice;
  if (spec.prompt_task < 0 || !first_stage()) return splice;
  const auto on_device = at::TensorOptions().dtype(at::kLong).device(groups_.tp->device());
  splice.seq_index = at::tensor(spec.virtual_positions, on_device);
  splice.batch_index = at::zeros({static_cast<int64_t>(spec.virtual_positions.size())}, on_device);
  splice.vectors = options_.prompt_tables[static_cast<size_t>(spec.prompt_task)];
  return splice;
}

at::Tensor GenerationEngine::forward(const std::vector<std::vector<int64_t>>& tokens, int64_t n,
                                     const model::PromptSplice& splice) {
  const int64_t b = static_cast<int64_t>(tokens.size());
  at::Tensor input;
  const auto device = groups_.tp->device();
  if (first_stage()) {
    std::vector<int64_t> flat;
    for (const auto& row : tokens) flat.insert(flat.end(), row.begin(), row.end());
    input = at::tensor(flat, at::TensorOptions().dtype(at::kLong).device(device)).view({b, n});
  } else {
    const auto dtype = model::scalar_type(stage_.config().params_dtype);
    input = at::empty({n, b, stage_.config().hidden_size}, at::TensorOptions().dtype(dtype).device(device));
    groups_.links->recv(input, groups_.links->rank() - 1);
  }
  at::Tensor out = stage_.forward_cached(input, cache_, splice);
  if (last_stage()) return out;
  out = out.contiguous();
  groups_.links->isend(out, groups_.links->rank() + 1)->wait();
  return {};
}

at::Tensor GenerationEngine::full_logits(const at::Tensor& logits, int64_t row, int64_t first, int64_t count) {
  return generate::gather_vocab_logits(logits.narrow(0, first, count).select(1, row), groups_.tp,
                                       stage_.config().vocab_size);
}

GenerationEngine::Choice GenerationEngine::choose(Running& r, const float* z) {
  const int64_t vocab = stage_.config().vocab_size;
  std::vector<float> processed(z, z + vocab);  // z stays raw: the log-probabilities are the model's
  Choice c;
  try {
    const int64_t token =
        r.sampler.next_token(processed.data(), vocab, r.context, r.generated, options_.eod_id, r.spec.min_new_tokens);
    c.token = token_logprob(z, vocab, token, r.spec.logprobs ? r.spec.top_logprobs : 0);
  } catch (const std::invalid_argument& e) {  // a non-finite logit: this request fails alone
    c.token.token = -1;
    c.error = fmt::format("generation failed after {} tokens: {} (the request's sampling options or the model "
                          "gave a non-finite logit)", r.generated, e.what());
  }
  return c;
}

void GenerationEngine::finish(Running& r, FinishReason reason, RequestProgress& progress) {
  progress.finished = reason;
  cache_.clear_row(r.row);
  free_rows_.push_back(r.row);
}

// Ends the running requests the plan cancels (reported with kCancelled).
void GenerationEngine::apply_cancellations(const nlohmann::json& plan, std::map<uint64_t, RequestProgress>& progress) {
  for (const auto& cancelled : plan.at("cancel")) {
    const uint64_t id = cancelled.get<uint64_t>();
    auto it = running_.find(id);
    if (it == running_.end()) continue;
    progress[id].id = id;
    finish(*it->second, FinishReason::kCancelled, progress[id]);
    running_.erase(it);
  }
}

// Gives each joining request of the plan a free cache row; returns them in plan order.
std::vector<GenerationEngine::Running*> GenerationEngine::admit(const nlohmann::json& plan) {
  std::vector<Running*> joined;
  for (const auto& j : plan.at("join")) {
    const uint64_t id = j.at("id").get<uint64_t>();
    if (free_rows_.empty()) throw std::logic_error("serve: a request joined with no free cache row");
    const int64_t row = free_rows_.back();
    free_rows_.pop_back();
    auto r = std::make_unique<Running>(id, request_from_json(j.at("spec")), row);
    cache_.clear_row(row);
    joined.push_back(r.get());
    running_.emplace(id, std::move(r));
  }
  return joined;
}

// One batched forward of the last token of every request in `decoding`; the last stage
// chooses each one's next token.
void GenerationEngine::decode(const std::vector<Running*>& decoding, Choices& choices) {
  if (decoding.empty()) return;
  std::vector<int64_t> rows;
  std::vector<std::vector<int64_t>> tokens;
  for (Running* r : decoding) {
    rows.push_back(r->row);
    tokens.push_back({r->context.back()});
  }
  cache_.select_rows(rows);
  const at::Tensor logits = forward(tokens, 1);
  if (!last_stage()) return;
  const int64_t b = static_cast<int64_t>(decoding.size());
  const at::Tensor full = generate::gather_vocab_logits(logits.select(0, 0), groups_.tp, stage_.config().vocab_size);
  for (int64_t i = 0; i < b; ++i) choices[decoding[i]->id] = choose(*decoding[i], full[i].data_ptr<float>());
}

// Last stage: the log-probability of every prompt token after the first (the first has none),
// from the prefill's logits [n, 1, V/t], gathered a chunk of positions at a time.
std::vector<TokenLogprob> GenerationEngine::prompt_logprobs(const Running& r, const at::Tensor& logits) {
  const int64_t n = static_cast<int64_t>(r.spec.prompt.size());
  std::vector<TokenLogprob> out;
  TokenLogprob first;
  first.token = r.spec.prompt[0];
  first.logprob = std::nan("");
  out.push_back(first);
  for (int64_t at = 0; at + 1 < n; at += kPromptLogitChunk) {
    const int64_t count = std::min(kPromptLogitChunk, n - 1 - at);
    const at::Tensor full = full_logits(logits, 0, at, count);
    for (int64_t i = 0; i < count; ++i)
      out.push_back(token_logprob(full[i].data_ptr<float>(), full.size(1), r.spec.prompt[at + i + 1],
                                  r.spec.top_logprobs));
  }
  return out;
}

// One forward per joining request over its whole prompt; the last stage chooses its first
// token (none when max_new_tokens is 0) and, when asked, the prompt's log-probabilities.
void GenerationEngine::prefill(const std::vector<Running*>& joined, Choices& choices) {
  for (Running* r : joined) {
    const int64_t n = static_cast<int64_t>(r->spec.prompt.size());
    r->prefilled = true;
    if (r->spec.max_new_tokens == 0 && !r->spec.prompt_logprobs) continue;
    cache_.select_rows({r->row});
    const at::Tensor logits = forward({r->spec.prompt}, n, prompt_splice(r->spec));
    if (!last_stage()) continue;
    Choice c;
    if (r->spec.prompt_logprobs) c.prompt = prompt_logprobs(*r, logits);
    if (r->spec.max_new_tokens > 0) {
      const at::Tensor last = full_logits(logits, 0, n - 1, 1);
      Choice chosen = choose(*r, last[0].data_ptr<float>());
      c.token = chosen.token;
      c.error = std::move(chosen.error);
    } else {
      c.token.token = -1;
    }
    choices[r->id] = std::move(c);
  }
}

// With p > 1 only the last stage chose: its TP rank 0 tells every rank.
void GenerationEngine::share_choices(Choices& choices) {
  if (groups_.links->size() <= 1) return;
  nlohmann::json message = nlohmann::json::object();
  if (groups_.control->rank() == groups_.last_stage_root) {
    for (const auto& [id, c] : choices) {
      nlohmann::json prompt = nlohmann::json::array();
      for (const auto& t : c.prompt) prompt.push_back(logprob_json(t));
      message[std::to_string(id)] = {logprob_json(c.token), prompt, c.error};
    }
  }
  broadcast_json(*groups_.control, message, groups_.last_stage_root);
  choices.clear();
  for (const auto& [key, value] : message.items()) {
    Choice c;
    c.token = logprob_from_json(value.at(0));
    for (const auto& t : value.at(1)) c.prompt.push_back(logprob_from_json(t));
    c.error = value.at(2).get<std::string>();
    choices[std::stoull(key)] = std::move(c);
  }
}

// Appends a chosen token to `r` (unless it is the stop token) and says whether it ends `r`:
// kStop for <|endoftext|> or a stop string in the generated text, else kNone.
FinishReason GenerationEngine::take_token(Running& r, const TokenLogprob& t, RequestProgress& p) {
  if (t.token < 0) return FinishReason::kNone;  // echo with max_tokens 0: nothing generated
  if (r.spec.stop_at_eod && t.token == options_.eod_id) return FinishReason::kStop;
  r.context.push_back(t.token);
  ++r.generated;
  p.new_tokens.push_back(t);
  if (r.spec.stop_strings.empty() || !options_.decode) return FinishReason::kNone;
  const std::string text = options_.decode(std::vector<int64_t>(r.context.end() - r.generated, r.context.end()));
  for (const auto& s : r.spec.stop_strings)
    if (text.find(s) != std::string::npos) return FinishReason::kStop;
  return FinishReason::kNone;
}

// Every rank applies the same choices to the same table; finished requests leave.
void GenerationEngine::apply_choices(Choices& choices, std::map<uint64_t, RequestProgress>& progress) {
  for (auto it = running_.begin(); it != running_.end();) {
    Running& r = *it->second;
    RequestProgress& p = progress[r.id];
    p.id = r.id;
    FinishReason done = FinishReason::kNone;
    if (auto chosen = choices.find(r.id); chosen != choices.end()) {
      p.prompt = std::move(chosen->second.prompt);
      if (chosen->second.error.empty()) {
        done = take_token(r, chosen->second.token, p);
      } else {
        done = FinishReason::kError;
        p.error = std::move(chosen->second.error);
      }
    }
    if (done == FinishReason::kNone && r.prefilled && r.generated >= r.spec.max_new_tokens)
      done = FinishReason::kMaxNewTokens;
    if (done != FinishReason::kNone) {
      finish(r, done, p);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
}

bool GenerationEngine::step(bool stop, const std::function<void(const RequestProgress&)>& report) {
  const bool serving = groups_.control->rank() == 0;
  nlohmann::json plan = serving ? plan_step(stop) : nlohmann::json();
  broadcast_json(*groups_.control, plan, 0);
  if (plan.at("stop").get<bool>()) return false;

  std::map<uint64_t, RequestProgress> progress;
  apply_cancellations(plan, progress);
  // Decode first (the requests already running), then prefill the ones joining.
  std::vector<Running*> decoding;
  for (auto& [id, r] : running_) decoding.push_back(r.get());
  const std::vector<Running*> joined = admit(plan);
  Choices choices;
  decode(decoding, choices);
  prefill(joined, choices);
  cache_.select_rows({});
  share_choices(choices);
  apply_choices(choices, progress);
  if (serving && report)
    for (const auto& [id, p] : progress) report(p);
  return true;
}

}  // namespace loom::serve
