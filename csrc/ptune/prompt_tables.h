// The inference tables of a prompt-learning run (docs/design/ptuning.md, "Checkpoints and the
// inference table"): per task the encoder's output frozen into a [tokens, hidden] float32
// table, in <run_dir>/prompt_tables/<file>.safetensors (tensor "prompt_table"; metadata: task,
// tokens, hidden, virtual_token_splits, prompt_template) so that other tools read it, and
// prompt_tables/index.json listing the tasks, their templates and files, and the base model.
// `loom generate --prompt-checkpoint` and later runs adding tasks (restore_path) read them.
#pragma once
#include <functional>
#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/recipe.h"

namespace loom::ptune {

struct PromptTable {
  config::TaskTemplate spec;  ///< the task's template as the run had it
  at::Tensor vectors;         ///< [total_virtual_tokens, hidden] float32, CPU
};

struct PromptTables {
  std::vector<PromptTable> tasks;
  std::string style;          ///< "p-tuning" | "prompt-tuning"
  nlohmann::json base;        ///< {"path", "checkpoints", "iteration", "model_shape"}
  int64_t iteration = 0;      ///< the training step the tables come from
  double val_loss = -1;       ///< the validation loss at that step (-1: not validated)
  bool add_bos = false;       ///< model.data.add_bos of the run (records are laid out alike)
  bool add_eos = true;        ///< model.data.add_eos: answers were trained to end with <|endoftext|>

  const PromptTable* find(const std::string& task) const;
  std::string task_list() const;  ///< "'a', 'b'" for messages
};

/// The folder of a run's tables: <run_dir>/prompt_tables.
std::string prompt_tables_dir(const std::string& run_dir);

/// Writes the set of tables as one: every table and index.json into the fresh folder
/// "<dir>.new", which then replaces `dir` in one atomic exchange of the two folders
/// (renameat2 RENAME_EXCHANGE; where the file system lacks it, two renames through
/// "<dir>.old", which read_prompt_tables falls back to). A crash at any point leaves `dir`
/// holding either the old set or the new one, never a mix. `after_file` (tests) is called after
/// each file is written. Throws std::runtime_error or std::filesystem::filesystem_error naming
/// the file on an I/O failure.
void write_prompt_tables(const std::string& dir, const PromptTables& tables,
                         const std::function<void(const std::string& file)>& after_file = {});

/// Reads index.json and every table it names, given the tables' folder or a run directory
/// holding prompt_tables/. Throws std::invalid_argument naming the file and the problem (no
/// index, bad JSON, a missing field or file, a table whose shape differs from the index).
PromptTables read_prompt_tables(const std::string& dir_or_run);

}  // namespace loom::ptune
