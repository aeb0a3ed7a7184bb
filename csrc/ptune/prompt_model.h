// The virtual tokens of every task of a prompt-learning run (docs/design/ptuning.md): a prompt
// encoder per task trained now (model.prompt.new_tasks), a frozen table per task kept from an
// earlier run (existing_tasks, read from restore_path's inference tables), and the splice of
// a batch's virtual positions. Lives on the first pipeline stage only; every tensor-parallel
// rank there holds it (tpmlp split over them) and splices the same vectors.
#pragma once
#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "config/recipe.h"
#include "data/tokenizer.h"
#include "model/parameter.h"
#include "model/prompt_splice.h"
#include "prompt_data/prompt_batch.h"
#include "prompt_data/task_template.h"
#include "ptune/prompt_encoder.h"
#include "ptune/prompt_tables.h"
#include "runtime/communicator.h"

namespace loom::ptune {

class PromptModel {
 public:
  /// `templates`: the run's task list (batch rows carry indices into it). `word_embeddings`:
  /// the base's full [vocab(+padding), h] word embedding (CPU), for prompt tuning's text
  /// initialisation. `restored`: restore_path's tables (existing tasks), or null. Throws
  /// std::invalid_argument naming the field: an existing task missing from `restored` or of
  /// another token count or hidden size, an init text that tokenises to nothing.
  PromptModel(const config::Recipe& recipe, const std::vector<prompt_data::ParsedTemplate>& templates,
              const at::Tensor& word_embeddings, const data::Tokenizer& tokenizer,
              const PromptTables* restored, runtime::CommunicatorPtr tp, at::Device device);

  /// The virtual positions of rows [first_row, first_row + rows) of `batch` and their vectors
  /// (the row's task's [n, h], in position order); inactive when the rows hold none.
  /// `training` applies the encoders' dropout (keyed by `step`). Differentiable in the trained
  /// tasks' parameters. Collective over tp when a tpmlp encoder runs.
  model::PromptSplice splice(const prompt_data::PromptBatch& batch, int64_t first_row, int64_t rows, bool training,
                             uint64_t step) const;

  /// Every task's [n, h] float32 vectors without dropout or autograd, on the host: the
  /// inference tables (collective over tp for tpmlp).
  std::vector<PromptTable> tables() const;

  /// The trained parameters (every new task's encoder), in task order.
  model::ParamList parameters() const;
  /// Trainable parameter count (whole tensors, not this rank's shards).
  int64_t num_parameters() const;

 private:
  at::Tensor vectors(int64_t task, bool training, uint64_t step) const;

  std::vector<prompt_data::ParsedTemplate> templates_;
  std::vector<int64_t> encoder_of_;           ///< per task: index into encoders_, or -1 (frozen)
  std::vector<PromptEncoder> encoders_;
  std::map<int64_t, at::Tensor> frozen_;      ///< per existing task: its table on the device
  at::Device device_;
};

/// Prompt tuning's initial table for a task of n tokens: the frozen embeddings of `text`'s
/// tokens, tiled (or cut) to n rows. Throws std::invalid_argument when `text` has no tokens.
at::Tensor text_initial_table(const std::string& text, int64_t n, const at::Tensor& word_embeddings,
                              const data::Tokenizer& tokenizer);

}  // namespace loom::ptune
