#include "serve/engine.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>

#include "generate/request_checks.h"
#include "generate/sampling_batch.h"
#include "model/mappings.h"
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

EngineOptions resolve_engine_options(EngineOptions o, int64_t context) {
  if (o.speculative.method != SpeculativeMethod::kNone) validate(o.speculative);
  if (o.max_batch < 1)
    throw std::invalid_argument("--max-batch: expected an integer >= 1, found " + std::to_string(o.max_batch));
  if (o.max_kv_tokens < 0)
    throw std::invalid_argument("--max-kv-tokens: expected an integer >= 0, found " + std::to_string(o.max_kv_tokens));
  if (o.block_size < 1)
    throw std::invalid_argument("block_size: expected an integer >= 1, found " + std::to_string(o.block_size));
  if (o.max_kv_tokens == 0) o.max_kv_tokens = o.max_batch * context;
  if (o.max_num_batched_tokens == 0) o.max_num_batched_tokens = std::max(kDefaultMaxNumBatchedTokens, o.max_batch);
  // Every running request decodes in every step: the budget holds one token of each.
  if (o.max_num_batched_tokens < o.max_batch)
    throw std::invalid_argument(fmt::format(
        "--max-num-batched-tokens: expected an integer >= --max-batch ({}) so that every running request decodes "
        "in every step (0: the default, max({}, --max-batch)), found {}",
        o.max_batch, kDefaultMaxNumBatchedTokens, o.max_num_batched_tokens));
  return o;
}

namespace {

// The paged cache of this rank's layers and heads, in the parameters' dtype and device; with
// `scratch`, one block more than the pool hands out.
model::KvCache paged_cache(const model::GptStage& stage, int tp, const EngineOptions& o, const KvBlockPool& pool,
                           bool scratch) {
  const model::ParamList params = stage.parameters();
  if (params.empty()) throw std::invalid_argument("GenerationEngine: the stage is empty");
  const at::Tensor& any = params.front().tensor;
  const auto& c = stage.config();
  return model::KvCache::paged(stage.layout().first_layer, stage.num_local_layers(), o.max_batch,
                               pool.num_blocks() + (scratch ? 1 : 0), pool.block_size(), c.query_groups() / tp,
                               c.head_dim(),
                               at::TensorOptions().dtype(any.scalar_type()).device(any.device()));
}

// Whether fixed-shape decode steps are captured as CUDA graphs on this rank: on CUDA at t = 1
// (collectives inside a graph are not verified yet, docs/serving.md "Decode graphs").
bool captures_decode_graphs(const model::GptStage& stage, int tp) {
  return tp == 1 && stage.parameters().front().tensor.is_cuda();
}

// Whether this rank runs fixed-shape decode steps (EngineOptions::decode_graphs). `on` needs
// the whole model on the rank.
bool decode_graphs_enabled(const EngineOptions& o, const model::GptStage& stage, int tp) {
  const bool whole = stage.layout().pre_process && stage.layout().post_process;
  switch (o.decode_graphs) {
    case DecodeGraphMode::kOff: return false;
    case DecodeGraphMode::kAuto: return whole && captures_decode_graphs(stage, tp);
    case DecodeGraphMode::kOn:
      if (!whole)
        throw std::invalid_argument("--cuda-graphs on: the fixed-shape decode steps need --pipeline-parallel 1 "
                                    "(use auto or off with pipeline stages)");
      return true;
  }
  return false;
}

}  // namespace

// A request, identical on every rank: waiting (row -1, no blocks) or running (a cache row,
// the blocks holding its first `computed` positions).
struct GenerationEngine::Running {
  uint64_t id = 0;
  RequestSpec spec;
  int64_t row = -1;
  std::vector<int64_t> context;  // prompt, then every generated token
  int64_t generated = 0;
  bool prefilled = false;        // its whole context is computed, in this admission
  std::vector<TokenLogprob> prompt_scores;  // last stage, echo: the prompt's so far (chunked prefill)
  bool prompt_reported = false;  // its prompt's log-probabilities went out (echo)
  RequestBlocks blocks;
  int64_t computed = 0;          // positions whose keys and values the cache holds
  std::vector<int64_t> draft;    // speculation: the tokens drafted this step, after its last one
  std::vector<at::Tensor> draft_probs;  // a draft model's q of each, [V] float64
  Running(uint64_t id_, RequestSpec spec_)
      : id(id_),
        spec(std::move(spec_)),
        context(spec.prompt),
        streams{Stream{generate::TokenSampler(spec.sampling), {}},
                Stream{generate::TokenSampler(derived(spec.sampling, 1)), {}},
                Stream{generate::TokenSampler(derived(spec.sampling, 2)), {}}} {}
  // The uniform of the i-th generated token (0-based) in stream s (0: the token's own draw,
  // the one without speculation; 1: a draft model's draw of it; 2: its acceptance test):
  // drawn in order and kept until used, so a request's randomness is a function of the
  // position, whatever speculation drafts.
  double uniform_at(int64_t i, int s = 0) {
    Stream& st = streams[s];
    while (static_cast<int64_t>(st.drawn.size()) <= i) st.drawn.push_back(st.sampler.draw_uniform());
    return st.drawn[static_cast<size_t>(i)];
  }

 private:
  static generate::SamplingOptions derived(generate::SamplingOptions o, uint64_t stream) {
    o.seed = o.seed * 0x9e3779b97f4a7c15ULL + stream;
    return o;
  }
  struct Stream {
    generate::TokenSampler sampler;
    std::vector<double> drawn;
  };
  Stream streams[3];
};

// A token chosen on the last stage for one request (and its prompt's log-probabilities), or
// why none could be chosen.
struct GenerationEngine::Choice {
  std::vector<TokenLogprob> tokens;  // the accepted drafts, then the chosen token; empty: none
  std::vector<TokenLogprob> prompt;
  std::string error;
};

GenerationEngine::GenerationEngine(const model::GptStage& stage, EngineGroups groups,
                                   EngineOptions options)
    : stage_(stage),
      groups_(std::move(groups)),
      options_(resolve_engine_options(std::move(options), stage.config().max_position_embeddings)),
      pool_((options_.max_kv_tokens + options_.block_size - 1) / options_.block_size, options_.block_size,
            options_.prefix_caching),
      decode_graphs_on_(!stage.parameters().empty() && decode_graphs_enabled(options_, stage, groups_.tp->size())),
      cache_(paged_cache(stage, groups_.tp->size(), options_, pool_, decode_graphs_on_)) {
  for (int64_t r = options_.max_batch - 1; r >= 0; --r) free_rows_.push_back(r);
  if ((options_.speculative.method == SpeculativeMethod::kDraft) != (options_.draft_model != nullptr))
    throw std::invalid_argument("--draft-checkpoint: a draft model goes with --speculative-method draft, and only there");
  if (options_.draft_model != nullptr)
    draft_ = std::make_unique<DraftModel>(*options_.draft_model, options_.max_batch, context(), stage.config().vocab_size);
  if (decode_graphs_on_)
    graphs_ = std::make_unique<DecodeGraphs>(stage, cache_, options_.max_batch, /*scratch_block=*/pool_.num_blocks(),
                                             captures_decode_graphs(stage, groups_.tp->size()));
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
  const int64_t adapters = options_.lora ? options_.lora->size() : 0;
  if (spec.adapter < -1 || spec.adapter >= adapters)
    throw std::invalid_argument(fmt::format("model: LoRA adapter index {} is not served (the server holds {})",
                                            spec.adapter, adapters));
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
  return !queue_.empty() || active_ > 0;
}

int64_t GenerationEngine::extra_key(const RequestSpec& spec) {
  if (spec.prompt_task < 0 && spec.adapter < 0) return -1;
  // The task's table and where its rows go, and the adapter, all shape the keys and values.
  uint64_t h = kRootHash;
  if (spec.prompt_task >= 0)
    h = block_hash(static_cast<uint64_t>(spec.prompt_task), spec.virtual_positions.data(),
                   static_cast<int64_t>(spec.virtual_positions.size()), spec.prompt_task);
  if (spec.adapter >= 0) h = block_hash(h, nullptr, 0, spec.adapter);
  return static_cast<int64_t>(h >> 1);  // >= 0: never the -1 of a plain request
}

nlohmann::json GenerationEngine::plan_step(bool stop) {
  nlohmann::json plan = {{"stop", stop}, {"cancel", nlohmann::json::array()}, {"arrive", nlohmann::json::array()}};
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint64_t> kept;
  for (uint64_t id : cancelled_) {
    const bool waiting = std::any_of(waiting_.begin(), waiting_.end(), [id](const auto& w) { return w->id == id; });
    if (running_.count(id) || waiting) {
      plan["cancel"].push_back(id);
    } else {
      auto it = std::find_if(queue_.begin(), queue_.end(), [id](const auto& q) { return q.first == id; });
      if (it != queue_.end()) queue_.erase(it);  // not sent to the ranks yet: dropped here
      else if (id >= next_id_) kept.push_back(id);
    }
  }
  cancelled_.clear();
  cancelled_.insert(kept.begin(), kept.end());
  // Every new request goes to every rank now; the ranks' one scheduler decides when it joins.
  for (; !queue_.empty(); queue_.pop_front()) {
    plan["arrive"].push_back({{"id", queue_.front().first}, {"spec", to_json(queue_.front().second)}});
    ++active_;
  }
  return plan;
}

model::LoraBatch GenerationEngine::lora_batch(const std::vector<Segment>& batch) {
  model::LoraBatch out;
  if (options_.lora == nullptr) return out;
  std::map<int64_t, std::vector<int64_t>> positions;  // adapter (-1: the base) -> flat positions
  int64_t at = 0;
  for (const Segment& s : batch) {
    auto& p = positions[s.request->spec.adapter];
    for (int64_t k = 0; k < s.count; ++k) p.push_back(at + k);
    at += s.count;
  }
  if (positions.size() > 1) ++mixed_adapter_steps_;
  out.bank = options_.lora;
  const auto on_device = at::TensorOptions().dtype(at::kLong).device(groups_.tp->device());
  for (auto& [adapter, p] : positions) {
    if (adapter < 0) continue;
    out.adapter.push_back(static_cast<int>(adapter));
    out.tokens.push_back(at::tensor(p, on_device));
  }
  return out;
}

at::Tensor GenerationEngine::forward(const std::vector<int64_t>& tokens, const model::PromptSplice& splice,
                                     const std::vector<int64_t>& output_rows, const model::LoraBatch& lora) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  at::Tensor input;
  const auto device = groups_.tp->device();
  if (first_stage()) {
    input = at::tensor(tokens, at::TensorOptions().dtype(at::kLong).device(device)).view({1, n});
  } else {
    const auto dtype = model::scalar_type(stage_.config().params_dtype);
    input = at::empty({n, 1, stage_.config().hidden_size}, at::TensorOptions().dtype(dtype).device(device));
    groups_.links->recv(input, groups_.links->rank() - 1);
  }
  // No position wanted (every chunk has more to come): one row anyway, no empty tensors in the head.
  const at::Tensor rows = last_stage() ? at::tensor(output_rows.empty() ? std::vector<int64_t>{0} : output_rows,
                                                    at::TensorOptions().dtype(at::kLong).device(device))
                                       : at::Tensor();
  at::Tensor out = stage_.forward_cached(input, cache_, splice, rows, lora);
  if (last_stage()) return out;
  out = out.contiguous();
  groups_.links->isend(out, groups_.links->rank() + 1)->wait();
  return {};
}

at::Tensor GenerationEngine::full_logits(const at::Tensor& logits, int64_t row, int64_t first, int64_t count) {
  return generate::gather_vocab_logits(logits.narrow(0, first, count).select(1, row), groups_.tp,
                                       stage_.config().vocab_size);
}

// Last stage: the next token of every choosing request in one batched call on the logits'
// device (generate/sampling_batch.h): their last positions' logits gathered over the
// vocabulary there, each request's uniform drawn by its own sampler on the host, one copy of
// the choices back.
generate::SampledRows GenerationEngine::choose_tokens(const std::vector<Segment>& batch,
                                                      const std::vector<int64_t>& choosing,
                                                      const std::vector<int64_t>& first_logit,
                                                      const at::Tensor& logits) {
  if (choosing.empty()) return {};
  std::vector<int64_t> last;
  std::vector<generate::SampleRow> rows;
  // A speculating request's row d verifies its draft d after the context and drafts [0, d):
  // the penalty, the banned stop token and the uniform are those of that position.
  std::vector<std::vector<int64_t>> drafted_contexts;
  std::vector<at::Tensor> draft_probs;  // a draft model's q per row (undefined: none)
  for (int64_t i : choosing) drafted_contexts.resize(drafted_contexts.size() + batch[static_cast<size_t>(i)].request->draft.size());
  size_t next_context = 0;
  for (int64_t i : choosing) {
    const Segment& s = batch[static_cast<size_t>(i)];
    Running& r = *s.request;
    const int64_t drafted = static_cast<int64_t>(r.draft.size());
    for (int64_t d = 0; d <= drafted; ++d) {
      last.push_back(first_logit[static_cast<size_t>(i)] + s.count - 1 - drafted + d);
      generate::SampleRow row;
      row.options = r.spec.sampling;
      if (d == 0) {
        row.penalized = &r.context;
      } else {
        std::vector<int64_t>& c = drafted_contexts[next_context++];
        c = r.context;
        c.insert(c.end(), r.draft.begin(), r.draft.begin() + d);
        row.penalized = &c;
      }
      row.banned_token = r.generated + d < r.spec.min_new_tokens ? options_.eod_id : -1;
      row.uniform = r.spec.sampling.greedy ? 0.0 : r.uniform_at(r.generated + d);
      row.logprob = r.spec.logprobs;
      row.top_logprobs = r.spec.logprobs ? r.spec.top_logprobs : 0;
      row.draft_token = d < drafted ? r.draft[static_cast<size_t>(d)] : -1;
      if (draft_) {
        row.accept_uniform = r.uniform_at(r.generated + d, 2);
        draft_probs.push_back(d < drafted ? r.draft_probs[static_cast<size_t>(d)] : at::Tensor());
      }
      rows.push_back(row);
    }
  }
  const at::Tensor picked =
      logits.select(1, 0).index_select(0, at::tensor(last, at::TensorOptions().dtype(at::kLong).device(logits.device())));
  const at::Tensor full = model::gather_from_tensor_model_parallel_region(picked.contiguous(), groups_.tp)
                              .narrow(-1, 0, stage_.config().vocab_size);  // [m, V] on the device
  at::Tensor q;  // [rows, V] float64, zero where a row verifies no draft
  if (draft_) {
    const at::Tensor none = at::zeros({stage_.config().vocab_size}, full.options().dtype(at::kDouble));
    for (auto& p : draft_probs) p = p.defined() ? p.to(full.device()) : none;
    q = at::stack(draft_probs);
  }
  return generate::sample_rows(full, rows, q);
}

void GenerationEngine::finish(Running& r, FinishReason reason, RequestProgress& progress) {
  progress.finished = reason;
  pool_.release(r.blocks);  // the moment it ends
  if (r.row >= 0) {
    if (draft_) draft_->reset(r.row);
    cache_.clear_row(r.row);
    free_rows_.push_back(r.row);
    r.row = -1;
  }
}

void GenerationEngine::bind_row(const Running& r) { cache_.set_row(r.row, r.blocks.blocks, r.computed); }

// Ends the running requests the plan cancels (reported with kCancelled).
void GenerationEngine::apply_cancellations(const nlohmann::json& plan, std::map<uint64_t, RequestProgress>& progress) {
  for (const auto& cancelled : plan.at("cancel")) {
    const uint64_t id = cancelled.get<uint64_t>();
    auto it = running_.find(id);
    if (it != running_.end()) {
      progress[id].id = id;
      finish(*it->second, FinishReason::kCancelled, progress[id]);
      running_.erase(it);
      continue;
    }
    auto w = std::find_if(waiting_.begin(), waiting_.end(), [id](const auto& q) { return q->id == id; });
    if (w == waiting_.end()) continue;
    if ((*w)->generated > 0 || (*w)->prompt_reported) {  // preempted after it began reporting
      progress[id].id = id;
      progress[id].finished = FinishReason::kCancelled;
    }
    waiting_.erase(w);
  }
}

void GenerationEngine::preempt(std::map<uint64_t, std::unique_ptr<Running>>::iterator it) {
  Running& r = *it->second;
  pool_.release(r.blocks);  // its full blocks stay cached (free, hashed) until reused
  r.computed = 0;
  r.prefilled = false;
  r.prompt_scores.clear();  // a prefill cut short: echo starts over
  r.draft.clear();
  if (draft_) draft_->reset(r.row);
  cache_.clear_row(r.row);
  free_rows_.push_back(r.row);
  r.row = -1;
  ++preemptions_;
  waiting_.push_front(std::move(it->second));
  running_.erase(it);
}

std::vector<GenerationEngine::Running*> GenerationEngine::make_room(bool& preempted) {
  preempted = false;
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : running_) ids.push_back(id);
  std::vector<Running*> decoding;
  for (uint64_t id : ids) {
    auto it = running_.find(id);
    if (it == running_.end()) continue;
    Running& r = *it->second;
    if (!r.prefilled) continue;  // a prefill in progress holds the blocks of its whole context
    // Its last token goes to position `computed`. Only requests after this one can be the
    // newest, so the ones already in `decoding` stay.
    r.draft.clear();
    bool here = true;
    while (here && !pool_.grow(r.blocks, r.computed + 1)) {
      preempt(std::prev(running_.end()));
      preempted = true;
      here = running_.count(id) > 0;
    }
    if (here) decoding.push_back(&r);
  }
  // Drafts only from the blocks every decode's next token left free: speculation never costs
  // another request its place.
  for (Running* r : decoding) {
    r->draft = propose_draft(*r, options_.speculative.num_tokens);
    if (!r->draft.empty() && !pool_.grow(r->blocks, r->computed + 1 + static_cast<int64_t>(r->draft.size())))
      r->draft.clear();
  }
  return decoding;
}

// The next waiting request joins when a row and the blocks for its whole context (less its
// cached prefix) are free: it gets its cached prefix and blocks. Null when it does not fit
// (joining is in order: the ones behind it wait too).
GenerationEngine::Running* GenerationEngine::admit_next() {
  if (waiting_.empty() || free_rows_.empty()) return nullptr;
  const int64_t bs = pool_.block_size();
  Running& r = *waiting_.front();
  const int64_t n = static_cast<int64_t>(r.context.size());
  const int64_t extra = extra_key(r.spec);
  // The last position is always computed (its logits choose the next token); echo needs
  // every prompt position's logits once.
  const int64_t max_hits = echo_pending(r) ? 0 : (n - 1) / bs;
  if (pool_.blocks_needed(r.context, extra, max_hits, n) > pool_.num_free()) return nullptr;
  r.computed = pool_.attach_prefix(r.blocks, r.context, extra, max_hits);
  if (!pool_.grow(r.blocks, n)) throw std::logic_error("serve: a joining request's blocks were counted free");
  r.row = free_rows_.back();
  free_rows_.pop_back();
  r.prefilled = false;
  r.prompt_scores.clear();
  running_.emplace(r.id, std::move(waiting_.front()));
  waiting_.pop_front();
  return &r;
}

bool GenerationEngine::echo_pending(const Running& r) { return r.spec.prompt_logprobs && !r.prompt_reported; }

std::vector<int64_t> GenerationEngine::propose_draft(const Running& r, int64_t limit) const {
  const SpeculativeOptions& o = options_.speculative;
  if (o.method == SpeculativeMethod::kNone) return {};
  // Every drafted token, if accepted, leaves room for one more chosen token within max_tokens
  // and the context (positions computed .. computed + k are run).
  const int64_t k = std::min({limit, r.spec.max_new_tokens - r.generated - 1, context() - 1 - r.computed});
  if (k < 1) return {};
  if (o.method == SpeculativeMethod::kDraft) return std::vector<int64_t>(static_cast<size_t>(k), -1);
  return propose_ngram_draft(r.context, o.prompt_lookup_min, o.prompt_lookup_max, k);
}

// Every rank: the draft model drafts the placeholders make_room and schedule left (each
// request's count of drafts may only shrink: its blocks are taken).
void GenerationEngine::run_draft_model(std::vector<Segment>& batch) {
  if (!draft_) return;
  std::vector<DraftJob> jobs;
  std::vector<Segment*> segments;
  for (Segment& s : batch) {
    Running& r = *s.request;
    if (r.draft.empty()) continue;
    DraftJob j;
    j.row = r.row;
    j.context = &r.context;
    j.k = static_cast<int64_t>(r.draft.size());
    j.options = r.spec.sampling;
    j.banned_until = r.spec.min_new_tokens - r.generated;
    j.banned_token = options_.eod_id;
    Running* owner = &r;
    j.uniform = [owner](int64_t d) { return owner->uniform_at(owner->generated + d, 1); };
    jobs.push_back(std::move(j));
    segments.push_back(&s);
  }
  if (jobs.empty()) return;
  draft_->draft(jobs);
  for (size_t i = 0; i < jobs.size(); ++i) {
    Running& r = *segments[i]->request;
    r.draft = jobs[i].tokens;
    r.draft_probs = jobs[i].probs;
    segments[i]->count = 1 + static_cast<int64_t>(r.draft.size());
  }
}

// This step's flat batch, within the token budget: every decoding request's next token first,
// then the next chunk of each prefill begun in an earlier step (oldest request first), then
// the first chunk of each request that joins now (none join in a step that had to preempt).
std::vector<GenerationEngine::Segment> GenerationEngine::schedule(const std::vector<Running*>& decoding,
                                                                  bool preempted) {
  std::vector<Segment> batch;
  int64_t budget = options_.max_num_batched_tokens;
  auto add_chunk = [&](Running* r) {
    const int64_t count = std::min(budget, static_cast<int64_t>(r->context.size()) - r->computed);
    batch.push_back({r, count});
    budget -= count;
  };
  // Drafts take what the decodes leave of the budget, in order.
  int64_t spare = budget - static_cast<int64_t>(decoding.size());
  for (Running* r : decoding) {
    if (static_cast<int64_t>(r->draft.size()) > spare) r->draft.resize(static_cast<size_t>(std::max<int64_t>(spare, 0)));
    spare -= static_cast<int64_t>(r->draft.size());
    const int64_t count = 1 + static_cast<int64_t>(r->draft.size());
    batch.push_back({r, count});
    budget -= count;
  }
  for (auto& [id, r] : running_)
    if (!r->prefilled && budget > 0) add_chunk(r.get());
  if (preempted) return batch;
  while (budget > 0) {
    Running* r = admit_next();
    if (r == nullptr) break;
    if (r->spec.max_new_tokens == 0 && !echo_pending(*r)) {
      r->prefilled = true;  // nothing to compute or choose: it ends with kLength this step
      continue;
    }
    add_chunk(r);
  }
  return batch;
}

void GenerationEngine::add_prompt_splice(const RequestSpec& spec, int64_t from, int64_t count, int64_t offset,
                                         std::vector<int64_t>& at, std::vector<at::Tensor>& vectors) const {
  if (spec.prompt_task < 0 || !first_stage()) return;
  // Virtual positions before `from` are in the cache already (cached blocks keyed by the task,
  // or earlier chunks); those past the chunk come in later chunks.
  std::vector<int64_t> rows;
  for (size_t i = 0; i < spec.virtual_positions.size(); ++i) {
    const int64_t v = spec.virtual_positions[i];
    if (v >= from && v < from + count) {
      at.push_back(offset + v - from);
      rows.push_back(static_cast<int64_t>(i));
    }
  }
  if (rows.empty()) return;
  const at::Tensor& table = options_.prompt_tables[static_cast<size_t>(spec.prompt_task)];
  vectors.push_back(rows.size() == spec.virtual_positions.size()
                        ? table
                        : table.index_select(0, at::tensor(rows, table.options().dtype(at::kLong))));
}

// Last stage: appends to r's prompt scores the log-probabilities of the prompt tokens that
// positions [from, from + count) predict (rows [start, start + count) of `logits`), led by
// the first token's NaN when the chunk starts the prompt; a chunk of positions at a time.
void GenerationEngine::score_prompt(Running& r, const at::Tensor& logits, int64_t start, int64_t from,
                                    int64_t count) {
  const auto& prompt = r.spec.prompt;
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (from == 0) {
    TokenLogprob first;
    first.token = prompt[0];
    first.logprob = std::nan("");
    r.prompt_scores.push_back(first);
  }
  const int64_t scored = std::min(count, n - 1 - from);  // position n - 1 predicts no prompt token
  for (int64_t at = 0; at < scored; at += kPromptLogitChunk) {
    const int64_t rows = std::min(kPromptLogitChunk, scored - at);
    const at::Tensor full = full_logits(logits, 0, start + at, rows);
    for (int64_t i = 0; i < rows; ++i)
      r.prompt_scores.push_back(token_logprob(full[i].data_ptr<float>(), full.size(1), prompt[from + at + i + 1],
                                              r.spec.top_logprobs));
  }
}

// One forward over the flat batch (docs/serving.md, "Continuous batching with chunked prefill"): each segment's next
// positions, every request's from its own length. A request whose context is then computed
// (a decode, or a prefill's last chunk) gets its next token chosen on the last stage (none once
// max_tokens is reached) and, at the end of a first prefill that asked, its prompt's
// log-probabilities.
void GenerationEngine::run_batch(const std::vector<Segment>& batch, Choices& choices) {
  last_step_tokens_ = 0;
  if (batch.empty()) return;
  std::vector<int64_t> rows, counts, starts, flat, splice_at;
  std::vector<at::Tensor> splice_vectors;
  for (const Segment& s : batch) {
    Running& r = *s.request;
    drafted_tokens_ += static_cast<int64_t>(r.draft.size());
    bind_row(r);
    rows.push_back(r.row);
    counts.push_back(s.count);
    starts.push_back(static_cast<int64_t>(flat.size()));
    add_prompt_splice(r.spec, r.computed, s.count, static_cast<int64_t>(flat.size()), splice_at, splice_vectors);
    const int64_t own = s.count - static_cast<int64_t>(r.draft.size());  // the context's positions
    flat.insert(flat.end(), r.context.begin() + r.computed, r.context.begin() + r.computed + own);
    flat.insert(flat.end(), r.draft.begin(), r.draft.end());
  }
  model::PromptSplice splice;
  if (!splice_at.empty()) {
    const auto on_device = at::TensorOptions().dtype(at::kLong).device(groups_.tp->device());
    splice.seq_index = at::tensor(splice_at, on_device);
    splice.batch_index = at::zeros({static_cast<int64_t>(splice_at.size())}, on_device);
    splice.vectors = splice_vectors.size() == 1 ? splice_vectors.front() : at::cat(splice_vectors);
  }
  // Which requests this forward completes (a decode, or a prefill's last chunk), which of
  // them choose a token, and which chunks are scored (echo): only those positions' logits are
  // made. Segment i's flat position starts[i] + k has logits row first_logit[i] + k.
  std::vector<int64_t> choosing, output_rows;  // batch indices; flat positions
  std::vector<int64_t> first_logit(batch.size(), 0);
  std::vector<bool> echo(batch.size(), false), completes(batch.size(), false);
  for (size_t i = 0; i < batch.size(); ++i) {
    const Running& r = *batch[i].request;
    echo[i] = echo_pending(r);
    const int64_t drafted = static_cast<int64_t>(r.draft.size());
    const bool computed_all = r.computed + batch[i].count - drafted == static_cast<int64_t>(r.context.size());
    completes[i] = computed_all && !r.prefilled;
    const bool chooses = computed_all && r.spec.max_new_tokens > r.generated;
    if (chooses) choosing.push_back(static_cast<int64_t>(i));
    // Logits of the chunk from `first`: its last position, and every drafted one after it.
    const int64_t first = echo[i] ? 0 : chooses ? batch[i].count - 1 - drafted : batch[i].count;
    first_logit[i] = static_cast<int64_t>(output_rows.size()) - first;
    for (int64_t k = first; k < batch[i].count; ++k) output_rows.push_back(starts[i] + k);
  }
  cache_.select_flat(rows, counts);
  const model::LoraBatch lora = lora_batch(batch);
  // Last stage: [output rows, 1, V/t]. A decode-only step at its bucket has output row i = request i.
  const at::Tensor logits = graphs_ && splice_at.empty() && fixed_shape_decode(batch, lora)
                                ? graphs_->run(flat, rows)
                                : forward(flat, splice, output_rows, lora);
  last_step_tokens_ = static_cast<int64_t>(flat.size());
  for (size_t i = 0; i < batch.size(); ++i) {  // every rank: the new positions are computed
    Running& r = *batch[i].request;
    r.computed += batch[i].count - static_cast<int64_t>(r.draft.size());  // accepted drafts count in apply_choices
    pool_.commit(r.blocks, r.context, r.computed, extra_key(r.spec));
    if (r.computed < static_cast<int64_t>(r.context.size())) continue;  // more chunks to come
    r.prefilled = true;
    if (echo[i]) r.prompt_reported = true;
  }
  if (!last_stage()) return;
  for (size_t i = 0; i < batch.size(); ++i)
    if (echo[i]) score_prompt(*batch[i].request, logits, first_logit[i], batch[i].request->computed - batch[i].count,
                              batch[i].count);
  const generate::SampledRows sampled = choose_tokens(batch, choosing, first_logit, logits);
  // choose_tokens' rows: per choosing request, one per drafted token and one more.
  for (size_t i = 0, k = 0, j = 0; i < batch.size(); ++i) {
    Running& r = *batch[i].request;
    const bool chooses = k < choosing.size() && choosing[k] == static_cast<int64_t>(i);
    if (!chooses && !completes[i]) continue;
    Choice c;
    if (completes[i] && echo[i]) c.prompt = std::move(r.prompt_scores);
    r.prompt_scores.clear();
    if (chooses) {  // the accepted drafts, then the first rejection's token or the bonus one
      ++k;
      const size_t end = j + r.draft.size() + 1;
      for (; j < end; ++j) {
        if (!sampled.errors[j].empty()) {  // a non-finite logit: this request fails alone
          c.tokens.clear();
          c.error = fmt::format("generation failed after {} tokens: {} (the request's sampling options or the "
                                "model gave a non-finite logit)", r.generated, sampled.errors[j]);
          break;
        }
        c.tokens.push_back({sampled.tokens[j], sampled.logprobs[j], sampled.top[j]});
        if (!sampled.accepted[j]) break;
      }
      j = end;
    }  // else echo with max_tokens 0: nothing generated
    choices[r.id] = std::move(c);
  }
}

bool GenerationEngine::fixed_shape_decode(const std::vector<Segment>& batch, const model::LoraBatch& lora) const {
  if (lora.active()) return false;
  for (const Segment& s : batch) {
    const Running& r = *s.request;
    // A decode: its context computed but the last token (prefilled), which it now computes
    // and chooses the next after; nothing to echo.
    const bool decode = r.prefilled && s.count == 1 && r.draft.empty() && !echo_pending(r) &&
                        r.computed + 1 == static_cast<int64_t>(r.context.size()) &&
                        r.spec.max_new_tokens > r.generated;
    if (!decode || !graphs_->fits(r.row)) return false;
  }
  return true;
}

// With p > 1 only the last stage chose: its TP rank 0 tells every rank.
void GenerationEngine::share_choices(Choices& choices) {
  if (groups_.links->size() <= 1) return;
  nlohmann::json message = nlohmann::json::object();
  if (groups_.control->rank() == groups_.last_stage_root) {
    for (const auto& [id, c] : choices) {
      nlohmann::json prompt = nlohmann::json::array();
      for (const auto& t : c.prompt) prompt.push_back(logprob_json(t));
      nlohmann::json tokens = nlohmann::json::array();
      for (const auto& t : c.tokens) tokens.push_back(logprob_json(t));
      message[std::to_string(id)] = {tokens, prompt, c.error};
    }
  }
  broadcast_json(*groups_.control, message, groups_.last_stage_root);
  choices.clear();
  for (const auto& [key, value] : message.items()) {
    Choice c;
    for (const auto& t : value.at(0)) c.tokens.push_back(logprob_from_json(t));
    for (const auto& t : value.at(1)) c.prompt.push_back(logprob_from_json(t));
    c.error = value.at(2).get<std::string>();
    choices[std::stoull(key)] = std::move(c);
  }
}

// Appends a chosen token to `r` (unless it is the stop token) and says whether it ends `r`:
// kStop for <|endoftext|> or a stop string in the generated text, else kNone.
FinishReason GenerationEngine::take_token(Running& r, const TokenLogprob& t, RequestProgress& p) {
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
        const auto& tokens = chosen->second.tokens;
        for (size_t t = 0; t < tokens.size() && done == FinishReason::kNone; ++t) done = take_token(r, tokens[t], p);
        if (!r.draft.empty() && !tokens.empty()) {
          // The accepted drafts' keys and values stay; the rest are rolled back.
          const int64_t accepted = static_cast<int64_t>(tokens.size()) - 1;
          accepted_tokens_ += accepted;
          if (done == FinishReason::kNone) {
            r.computed += accepted;
            pool_.commit(r.blocks, r.context, r.computed, extra_key(r.spec));
            pool_.truncate(r.blocks, r.computed + 1);
            if (draft_) draft_->keep(r.row, r.computed);
          }
        }
      } else {
        done = FinishReason::kError;
        p.error = std::move(chosen->second.error);
      }
    }
    r.draft.clear();
    r.draft_probs.clear();
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
  for (const auto& a : plan.at("arrive"))
    waiting_.push_back(std::make_unique<Running>(a.at("id").get<uint64_t>(), request_from_json(a.at("spec"))));
  // One forward: the decoding requests (each with a slot for its next token), then prefill
  // chunks, within the token budget; none join in a step that had to preempt.
  bool preempted = false;
  const std::vector<Running*> decoding = make_room(preempted);
  Choices choices;
  std::vector<Segment> batch = schedule(decoding, preempted);
  run_draft_model(batch);
  run_batch(batch, choices);
  cache_.select_rows({});
  share_choices(choices);
  apply_choices(choices, progress);
  if (serving) {
    std::lock_guard<std::mutex> lock(mutex_);
    active_ = running_.size() + waiting_.size();
  }
  if (serving && report)
    for (const auto& [id, p] : progress) report(p);
  return true;
}

}  // namespace loom::serve
