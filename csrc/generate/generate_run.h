// `loom generate` end to end, minus the command line and process spawning: find the
// checkpoint and tokenizer (plan_generation, run once before any rank starts), then on every
// tensor-parallel rank load the model resharded for t, tokenise the prompt, generate with the
// KV cache and decode (run_generation); generate_on_rank is one rank of `loom generate`,
// started by runtime::start_rank_session (docs/architecture.md, "One rank session").
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "generate/checkpoint_reader.h"
#include "generate/model_loader.h"
#include "generate/sampling.h"
#include "generate/token_generator.h"
#include "launch/env_rendezvous.h"
#include "runtime/communicator.h"
#include "runtime/rank_session.h"

namespace loom::generate {

/// Bad input found while planning (a flag, a missing tokenizer file, a model that does not
/// fit t): commands exit with status 2. The message names the flag or file.
class GenerateInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct GenerateRequest {
  std::string checkpoint;             ///< --checkpoint: run directory or checkpoints directory
  std::optional<int64_t> iteration;   ///< --iteration (default: the latest)
  std::string prompt;                 ///< --prompt (UTF-8); empty: start from <|endoftext|>
  int64_t max_new_tokens = 32;        ///< --max-new-tokens
  SamplingOptions sampling;           ///< --greedy --temperature --top-k --top-p --seed
  int tensor_parallel = 0;            ///< --tensor-parallel (0: the checkpoint's t)
  /// --vocab-file/--merge-file: a GPT-2 tokenizer instead of the run's recipe's (one of them
  /// alone replaces that file of a GPT-2 recipe tokenizer).
  std::string vocab_file, merge_file;
  std::string accelerator;            ///< --accelerator cpu|gpu (empty: the run's recipe, else cpu)
  int64_t min_new_tokens = 0;         ///< --min-new-tokens: no <|endoftext|> before this many
  std::vector<std::string> stop_strings;  ///< --stop: end (and cut) the text at the first one
};

/// Generation options of `request` for `tokenizer`: max/min new tokens, sampling, the
/// <|endoftext|> stop token, and a stop check that decodes the new tokens and looks for any of
/// the stop strings.
GenerationOptions generation_options(const GenerateRequest& request, const data::Tokenizer& tokenizer);

/// The text of `tokens`, cut before the first stop string it contains (if any).
std::string continuation_text(const std::vector<int64_t>& tokens, const std::vector<std::string>& stop_strings,
                              const data::Tokenizer& tokenizer);

struct GeneratePlan {
  CheckpointLocation location;
  CheckpointInfo info;
  int tensor_parallel = 1;
  /// The run's tokenizer (model.tokenizer of its config.yaml, or the flags), its files resolved.
  data::TokenizerSpec tokenizer;
  InferenceModelOptions model_options;
  bool accelerator = false;  ///< run on the accelerator (GPU or a device plugin), else CPU ranks
};

/// Resolves and checks everything the ranks will need. The tokenizer is model.tokenizer of the
/// run directory's config.yaml (any library, docs/design/tokenizers.md; a relative path is
/// tried against the working directory, then the run directory), unless --vocab-file /
/// --merge-file name GPT-2 files. Throws GenerateInputError (or train::CheckpointError for the
/// checkpoint itself) naming the file or flag.
GeneratePlan plan_generation(const GenerateRequest& request);

/// Loads the plan's tokenizer and checks it against the checkpoint's model: its vocab_size()
/// must be the model's unpadded vocabulary. Throws GenerateInputError naming the tokenizer
/// (a file that does not load, or the two sizes).
std::unique_ptr<data::Tokenizer> load_tokenizer(const GeneratePlan& plan);

struct GenerateOutput {
  std::vector<int64_t> prompt_ids;  ///< the context fed to the model
  GenerationResult result;
  std::string text;                 ///< the prompt followed by the decoded continuation
};

/// Collective over `tp` (size plan.tensor_parallel, every rank with the same request): reads
/// the checkpoint, builds the model for this rank on tp's device, generates. Every rank returns the same
/// output. Throws train::CheckpointError for a missing/corrupt shard, GenerateInputError for a
/// prompt that does not fit the model.
GenerateOutput run_generation(const GeneratePlan& plan, const GenerateRequest& request,
                              const runtime::CommunicatorPtr& tp);

/// The rank start of a model served by `plan`: plan.tensor_parallel ranks (named
/// "--tensor-parallel" in the error for another world size), tensor-parallel over all of them,
/// on the plan's device kind. Commands that need more ranks (eval's p and d, serve's p) change
/// layout and world_size_source.
runtime::RankSessionRequest rank_session_request(const GeneratePlan& plan);

/// One rank of `loom generate` (collective over the job's ranks, every one with the same plan
/// and request): starts the rank (runtime::start_rank_session with rank_session_request(plan):
/// std::invalid_argument when the world is not plan.tensor_parallel ranks or the host lacks
/// the device), runs run_generation over its tensor-parallel group and shuts the groups down.
/// Every rank returns the same output. Throws what run_generation throws.
GenerateOutput generate_on_rank(const launch::RendezvousInfo& info, const GeneratePlan& plan,
                                const GenerateRequest& request);

}  // namespace loom::generate
