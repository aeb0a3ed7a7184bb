// `loom generate --prompt-checkpoint DIR --task NAME --input FILE.jsonl` (docs/design/ptuning.md):
// generation with a prompt-learning run's inference tables. The frozen base named by the
// tables is loaded for inference (any tensor-parallel size), each record of the input is laid
// out by its task's template up to its answer (virtual positions spliced with the task's
// table in the prefill), and the answer is generated with the usual sampling options. Records
// that carry their answer are scored: exact match means the generated tokens are the answer's
// and generation then stopped at <|endoftext|> (the rule validation uses); for a run trained
// with add_eos false, that the generation starts with the answer's tokens.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "generate/generate_run.h"
#include "launch/env_rendezvous.h"
#include "ptune/prompt_tables.h"
#include "runtime/communicator.h"

namespace loom::ptune {

struct PromptGenerateRequest {
  std::string prompt_checkpoint;   ///< --prompt-checkpoint: a ptune run directory or its tables folder
  std::string task;                ///< --task: the task of records without "taskname"
  std::string input;               ///< --input: JSONL records with the template's fields
  /// --no-virtual-tokens: the no-prompt baseline, the template's text without its virtual tokens
  /// (the frozen base alone, scored alike).
  bool without_virtual_tokens = false;
  /// Sampling, token limits, stop strings, --tensor-parallel, --accelerator, tokenizer flags;
  /// `checkpoint` empty: the base the tables name.
  generate::GenerateRequest generation;
};

struct PromptGeneratePlan {
  PromptTables tables;
  generate::GeneratePlan base;
};

/// Reads the tables, finds their base and checks the task. Throws generate::GenerateInputError
/// naming the flag or file.
PromptGeneratePlan plan_prompt_generation(const PromptGenerateRequest& request);

struct PromptPrediction {
  std::string source;      ///< "FILE:LINE"
  std::string task;
  nlohmann::json record;   ///< the record's fields
  std::string prediction;  ///< the generated text (cut at a stop string)
  bool has_answer = false;
  bool exact_match = false;

  nlohmann::json to_json() const;  ///< the record, then "prediction" (and "exact_match")
};

/// Collective over `tp` (every rank with the same request): every record's prediction, in
/// input order. Throws data::DataError naming FILE:LINE for a bad record.
std::vector<PromptPrediction> run_prompt_generation(const PromptGeneratePlan& plan, const PromptGenerateRequest& request,
                                                    const runtime::CommunicatorPtr& tp);

/// One rank of `loom generate --prompt-checkpoint` (collective over the job's ranks, every one
/// with the same plan and request): starts the rank as generate::generate_on_rank does for
/// plan.base (std::invalid_argument for a world that is not its tensor-parallel size), runs
/// run_prompt_generation and shuts the groups down. Every rank returns every prediction.
std::vector<PromptPrediction> prompt_generate_on_rank(const launch::RendezvousInfo& info,
                                                      const PromptGeneratePlan& plan,
                                                      const PromptGenerateRequest& request);

}  // namespace loom::ptune
