// The batched generation engine behind `loom serve` (docs/serving.md): many requests of
// different lengths decode together with one paged KV cache (model/kv_cache.h, KvCache::paged)
// whose blocks a pool hands out (serve/kv_block_pool.h), under tensor parallelism (each
// stage's TP group) and pipeline parallelism (stages kept apart, hidden states over
// runtime/pipeline_links.h). Continuous batching: between steps finished requests leave and
// waiting ones join; at most max_batch requests run. Each step is ONE forward over a flat batch
// of tokens (chunked prefill, docs/serving.md "Continuous batching with chunked prefill"): the next token of every
// decoding request first, then chunks of the prompts being prefilled, at most
// max_num_batched_tokens in all, each sequence at its own positions (no padding: the paged
// attention reads each one's keys and values through its block table). A long prompt is split
// over steps, so the requests decoding beside it get a token in every step. With speculative
// decoding (docs/serving.md "Speculative decoding"; prompt-lookup drafts or a draft model,
// serve/draft_model.h) a decoding request adds its drafted tokens after its next token and keeps the accepted ones (their keys and values; the rest are rolled
// back: its length and block table cut to them). A request takes blocks as it grows and frees them the moment it
// ends. With prefix caching (on by default) a joining request reuses the cached full blocks of
// a prefix it shares with earlier requests and prefills only the rest. When the pool has no
// block for a running request's next token, the newest running request is preempted: its
// blocks are freed and it waits at the head of the queue, to be recomputed (prompt and the
// tokens it generated) when it fits again. Joining is in order: a request that does not fit
// waits, and so do the ones behind it; one that could never fit (prompt + max_tokens past
// max_kv_tokens) is refused at submit(). A joining request takes the blocks of its whole
// context at once, its prefill then runs over as many steps as the budget needs.
// With served LoRA adapters (EngineOptions::lora, `loom serve --lora`) each request runs with
// its own adapter or none, and requests of different adapters share the step's one forward
// (model/lora_serving.h); the prefix cache keys blocks by adapter. A step in which every
// request decodes one token runs at a fixed batch-size bucket with padding rows, replayed as a
// captured CUDA graph on CUDA (serve/decode_graphs.h, EngineOptions::decode_graphs).
//
// Every rank runs step() in lockstep. World rank 0 (first stage, TP rank 0: the serving rank)
// owns the intake and sends each step's plan (new requests, cancellations, stop) to every rank
// over the control group; every rank then runs the same deterministic scheduler on the same
// request table and block pool. The
// last stage's TP ranks gather the logits on their device and choose every request's token in
// one batched call there, with one device-to-host copy of the chosen tokens and
// log-probabilities per step (generate/sampling_batch.h; per-request seeds: same request and
// seed, same tokens whatever else is in the batch); with p > 1 its TP rank 0 broadcasts the
// choices. Greedy results equal generate::generate_tokens one at a time.
#pragma once
#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "generate/sampling.h"
#include "generate/sampling_batch.h"
#include "generate/stop_reason.h"
#include "model/gpt_stage.h"
#include "model/kv_cache.h"
#include "runtime/communicator.h"
#include "runtime/pipeline_links.h"
#include "serve/decode_graphs.h"
#include "serve/kv_block_pool.h"
#include "serve/draft_model.h"
#include "serve/request.h"
#include "serve/speculative.h"

namespace loom::serve {

/// A token with its log-probability under the model (log-softmax of the raw logits, before
/// temperature, penalties and filters) and, when asked, the most probable alternatives
/// (decreasing, lower id first among equals).
struct TokenLogprob {
  int64_t token = 0;
  double logprob = 0;  ///< NaN for a prompt's first token (nothing precedes it)
  std::vector<std::pair<int64_t, double>> top;
};

/// Why a request ended, generate's one vocabulary (generate/stop_reason.h): the engine reports
/// kNone while a request runs, then kMaxNewTokens (alias kLength), kStop (<|endoftext|> or a
/// stop string), kCancelled, or kError (choosing the request's next token failed: a logit became inf
/// or NaN under its sampling options, or the model gave one; that request ends, the rest of the
/// batch goes on).
using FinishReason = generate::StopReason;

/// What one step did for one request (reported on the serving rank).
struct RequestProgress {
  uint64_t id = 0;
  std::vector<TokenLogprob> prompt;      ///< in the step that prefilled it, when asked (echo)
  std::vector<TokenLogprob> new_tokens;  ///< tokens generated in this step (0, 1, or more when speculating)
  FinishReason finished = FinishReason::kNone;
  std::string error;                     ///< with kError: what failed
};

/// The groups a rank's engine uses.
struct EngineGroups {
  runtime::CommunicatorPtr tp;       ///< this stage's tensor-parallel group
  runtime::PipelineLinks* links;     ///< this rank's pipeline neighbours (single(): p = 1)
  runtime::Communicator* control;    ///< every rank, host tensors (ProcessGroups::host_world)
  int last_stage_root = 0;           ///< control rank of the last stage's TP rank 0
};

/// The default token budget of one step (--max-num-batched-tokens 0), raised to max_batch.
inline constexpr int64_t kDefaultMaxNumBatchedTokens = 512;

struct EngineOptions {
  int64_t max_batch = 16;      ///< requests decoding together (cache rows)
  /// Tokens one step's forward holds at most (vLLM's max_num_batched_tokens): a token of each
  /// decoding request, the rest prompt chunks. 0: max(kDefaultMaxNumBatchedTokens, max_batch);
  /// must be >= max_batch.
  int64_t max_num_batched_tokens = 0;
  /// KV-cache positions of the block pool, rounded up to whole blocks (0: max_batch · context);
  /// a request's prompt + max_tokens must fit in it.
  int64_t max_kv_tokens = 0;
  int64_t block_size = 16;     ///< positions per KV block
  bool prefix_caching = true;  ///< reuse cached full blocks of shared prefixes (--no-prefix-caching)
  int64_t eod_id = -1;         ///< <|endoftext|> (-1: none)
  /// The text of token ids (stop strings are looked for in it); null: no stop strings.
  std::function<std::string(const std::vector<int64_t>&)> decode;
  /// Learned prompts' inference tables (ptune/prompt_tables.h), [virtual tokens, hidden] on the
  /// stage's device, by task index; a request with prompt_task k has row j of table k spliced
  /// into the embedding at its j-th virtual position in its prefill (model/prompt_splice.h).
  std::vector<at::Tensor> prompt_tables;
  /// Speculative decoding (--speculative-method ngram|draft): each decoding request drafts up
  /// to num_tokens tokens by prompt lookup (speculative.h) or with draft_model, and the step's
  /// forward verifies them.
  SpeculativeOptions speculative;
  /// With SpeculativeMethod::kDraft: the draft model, whole on this rank at t = 1 with the
  /// served model's vocabulary (serve/draft_model.h), kept by reference.
  const model::GptStage* draft_model = nullptr;
  /// Served LoRA adapters (`loom serve --lora`, model/lora_serving.h): this rank's shards, kept
  /// by reference; a request with adapter i has adapter i's updates added to its tokens in
  /// every step's one forward, beside the requests of other adapters and of the base. Null:
  /// none. The draft model runs without adapters (its drafts are verified by the adapted model).
  const model::LoraBank* lora = nullptr;
  /// Fixed-shape decode steps (--cuda-graphs, serve/decode_graphs.h, docs/serving.md "Decode
  /// graphs"): a step whose every request decodes one token (no prefill chunk, no drafts, no
  /// LoRA adapter) runs at a batch-size bucket, captured as a CUDA graph on CUDA at t = 1.
  /// auto: on CUDA at t = 1 and p = 1 only; on: on any device (p = 1); off: never.
  DecodeGraphMode decode_graphs = DecodeGraphMode::kAuto;
};

/// `o` with its defaults filled in for a model of `context` positions (max_kv_tokens 0:
/// max_batch · context; max_num_batched_tokens 0: max(kDefaultMaxNumBatchedTokens,
/// max_batch)). Throws std::invalid_argument naming the flag: max_batch < 1, max_kv_tokens < 0,
/// block_size < 1, max_num_batched_tokens below max_batch.
EngineOptions resolve_engine_options(EngineOptions o, int64_t context);

class GenerationEngine {
 public:
  /// `stage` is this rank's pipeline stage of the model (built without sequence parallelism),
  /// kept by reference. Allocates the paged KV cache: ceil(max_kv_tokens / block_size) blocks
  /// per layer. Throws std::invalid_argument for max_batch < 1, max_kv_tokens < 0,
  /// block_size < 1 or max_num_batched_tokens below max_batch (or negative).
  GenerationEngine(const model::GptStage& stage, EngineGroups groups, EngineOptions options);
  ~GenerationEngine();

  /// Serving rank, any thread: checks `spec` (std::invalid_argument naming the field: empty
  /// or out-of-vocabulary prompt, prompt + max_new_tokens past the context or past
  /// max_kv_tokens, bad sampling options, a prompt_task without its table or with virtual
  /// positions that do not match it) and queues it; returns its id.
  uint64_t submit(RequestSpec spec);
  /// Serving rank, any thread: drops a queued request, or ends a running one at the next step
  /// (reported with kCancelled). Unknown ids are ignored.
  void cancel(uint64_t id);
  /// Serving rank, any thread: waits up to `ms` for a request (or a stop) to arrive.
  void wait_for_work(int ms);
  /// Serving rank: requests queued or running.
  bool busy() const;

  /// Collective over every rank: one step (join, then one forward: a token of every decoding
  /// request and prompt chunks, within the token budget). `stop` (serving rank's word) ends every rank's loop: returns false then.
  /// Progress of the serving rank's requests goes to `report` (serving rank only).
  bool step(bool stop, const std::function<void(const RequestProgress&)>& report = {});

  int64_t context() const { return stage_.config().max_position_embeddings; }
  const EngineOptions& options() const { return options_; }
  /// Step thread: prefix-cache lookups and hits (tokens) so far, blocks held by running
  /// requests, and preemptions so far.
  const PrefixCacheStats& prefix_cache_stats() const { return pool_.stats(); }
  int64_t kv_blocks_used() const { return pool_.num_blocks() - pool_.num_free(); }
  int64_t kv_blocks() const { return pool_.num_blocks(); }
  int64_t preemptions() const { return preemptions_; }
  /// Step thread: tokens in the last step's forward (0: none ran).
  int64_t last_step_tokens() const { return last_step_tokens_; }
  /// Step thread: speculative decoding so far: tokens drafted and drafted tokens accepted.
  int64_t drafted_tokens() const { return drafted_tokens_; }
  int64_t accepted_tokens() const { return accepted_tokens_; }
  /// Step thread: steps whose one forward held the tokens of two or more served models (the
  /// base and LoRA adapters, counted apart) so far.
  int64_t mixed_adapter_steps() const { return mixed_adapter_steps_; }
  /// Step thread: the fixed-shape decode steps (EngineOptions::decode_graphs), null when off.
  const DecodeGraphs* decode_graphs() const { return graphs_.get(); }

 private:
  struct Running;
  struct Choice;
  void validate(const RequestSpec& spec) const;
  nlohmann::json plan_step(bool stop);
  // Runs the flat batch `tokens` (the cache's select_flat rows) through this stage and the
  // pipeline; returns the logits [output_rows, 1, V/t] of those flat positions on the last
  // stage, undefined elsewhere.
  at::Tensor forward(const std::vector<int64_t>& tokens, const model::PromptSplice& splice,
                     const std::vector<int64_t>& output_rows, const model::LoraBatch& lora);
  // First stage, learned-prompt request: the virtual positions among [from, from + count) (its
  // chunk, at flat offset `offset`) and their vectors, appended to at / vectors.
  void add_prompt_splice(const RequestSpec& spec, int64_t from, int64_t count, int64_t offset,
                         std::vector<int64_t>& at, std::vector<at::Tensor>& vectors) const;
  // The prefix-cache key besides the tokens: -1, or a hash of the learned-prompt task and its
  // positions and of the LoRA adapter (each changes the keys and values).
  static int64_t extra_key(const RequestSpec& spec);
  // Last stage: the full-vocabulary logits [count, V] of positions [first, first + count) of
  // batch row `row` of `logits`.
  at::Tensor full_logits(const at::Tensor& logits, int64_t row, int64_t first, int64_t count);
  // A request's next positions in this step's flat batch.
  struct Segment {
    Running* request;
    int64_t count;
  };
  // The served adapters' tokens of the flat batch: each segment's `count` positions, in order,
  // belong to its request's adapter (none: the base). Counts a step mixing models.
  model::LoraBatch lora_batch(const std::vector<Segment>& batch);
  generate::SampledRows choose_tokens(const std::vector<Segment>& batch, const std::vector<int64_t>& choosing,
                                      const std::vector<int64_t>& first_logit, const at::Tensor& logits);
  void finish(Running& r, FinishReason reason, RequestProgress& progress);
  // The parts of step(), in order.
  using Choices = std::map<uint64_t, Choice>;
  void apply_cancellations(const nlohmann::json& plan, std::map<uint64_t, RequestProgress>& progress);
  // Gives every running request a slot for its next token, preempting the newest when the
  // pool is full; returns the requests that decode this step.
  std::vector<Running*> make_room(bool& preempted);
  void preempt(std::map<uint64_t, std::unique_ptr<Running>>::iterator it);
  Running* admit_next();
  // Its prompt's log-probabilities are asked for and not reported yet.
  static bool echo_pending(const Running& r);
  std::vector<Segment> schedule(const std::vector<Running*>& decoding, bool preempted);
  // Speculation: the tokens `r` (decoding) drafts this step, at most `limit` (a draft model's:
  // placeholders, drafted by run_draft_model once the budget is known).
  std::vector<int64_t> propose_draft(const Running& r, int64_t limit) const;
  void run_draft_model(std::vector<Segment>& batch);
  // Points the cache row of `r` at its blocks and computed length.
  void bind_row(const Running& r);
  void run_batch(const std::vector<Segment>& batch, Choices& choices);
  // The step may run at a decode bucket: every segment one decoded token (no draft, no
  // prefill), no served adapter in it, every row's table within the buckets' tables.
  bool fixed_shape_decode(const std::vector<Segment>& batch, const model::LoraBatch& lora) const;
  void score_prompt(Running& r, const at::Tensor& logits, int64_t start, int64_t from, int64_t count);
  void share_choices(Choices& choices);
  FinishReason take_token(Running& r, const TokenLogprob& t, RequestProgress& p);
  void apply_choices(Choices& choices, std::map<uint64_t, RequestProgress>& progress);
  bool first_stage() const;
  bool last_stage() const;

  const model::GptStage& stage_;
  EngineGroups groups_;
  EngineOptions options_;
  KvBlockPool pool_;
  bool decode_graphs_on_;  // options_.decode_graphs resolved for this rank's device and layout
  model::KvCache cache_;   // with decode graphs, one block past the pool's: the padding rows' scratch
  std::map<uint64_t, std::unique_ptr<Running>> running_;  // by id: same order on every rank
  std::deque<std::unique_ptr<Running>> waiting_;         // in order to join (preempted ones first)
  std::vector<int64_t> free_rows_;
  std::unique_ptr<DraftModel> draft_;  // SpeculativeMethod::kDraft
  std::unique_ptr<DecodeGraphs> graphs_;  // decode_graphs_on_
  int64_t preemptions_ = 0;
  int64_t last_step_tokens_ = 0;
  int64_t drafted_tokens_ = 0, accepted_tokens_ = 0;
  int64_t mixed_adapter_steps_ = 0;

  // Serving rank only.
  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::deque<std::pair<uint64_t, RequestSpec>> queue_;
  std::set<uint64_t> cancelled_;
  uint64_t next_id_ = 1;
  size_t active_ = 0;  // requests sent to the step thread and not finished
};

}  // namespace loom::serve
