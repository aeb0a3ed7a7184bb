#include "ptune/prompt_model.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace loom::ptune {
namespace {

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The i-th new task's entry of a per-new-task list (one entry serves every task).
template <class T>
const T* entry_for(const std::vector<T>& list, size_t i) {
  if (list.empty()) return nullptr;
  return &list[list.size() == 1 ? 0 : i];
}

}  // namespace

at::Tensor text_initial_table(const std::string& text, int64_t n, const at::Tensor& word_embeddings,
                              const data::Tokenizer& tokenizer) {
  const std::vector<int32_t> ids = tokenizer.encode(text);
  if (ids.empty())
    throw std::invalid_argument("model.prompt_tuning.new_prompt_init_text: '" + text + "' has no tokens");
  std::vector<int64_t> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rows[i] = ids[static_cast<size_t>(i) % ids.size()];  // tiled, or cut
  // host: rows of the host copy of the base's embedding (the checkpoint as read)
  return word_embeddings.index_select(0, at::tensor(rows, at::kLong)).to(at::kFloat);
}

PromptModel::PromptModel(const config::Recipe& recipe, const std::vector<prompt_data::ParsedTemplate>& templates,
                         const at::Tensor& word_embeddings, const data::Tokenizer& tokenizer,
                         const PromptTables* restored, runtime::CommunicatorPtr tp, at::Device device)
    : templates_(templates), encoder_of_(templates.size(), -1), device_(device) {
  const auto& p = recipe.model.prompt;
  const int64_t h = recipe.model.hidden_size;
  size_t new_index = 0;
  for (size_t t = 0; t < templates_.size(); ++t) {
    const auto& spec = templates_[t].spec;
    if (contains(p.existing_tasks, spec.taskname)) {
      const PromptTable* table = restored ? restored->find(spec.taskname) : nullptr;
      if (!table)
        throw std::invalid_argument(fmt::format("model.existing_tasks: task '{}' is not in the tables of "
                                                "model.restore_path (they hold {})",
                                                spec.taskname, restored ? restored->task_list() : "nothing"));
      if (table->vectors.size(0) != spec.total_virtual_tokens || table->vectors.size(1) != h)
        throw std::invalid_argument(fmt::format("model.existing_tasks: task '{}' has a [{}, {}] table in "
                                                "model.restore_path, this run needs [{}, {}]",
                                                spec.taskname, table->vectors.size(0), table->vectors.size(1),
                                                spec.total_virtual_tokens, h));
      frozen_[static_cast<int64_t>(t)] = table->vectors.to(at::TensorOptions().dtype(at::kFloat).device(device));
      continue;
    }
    if (!contains(p.new_tasks, spec.taskname)) continue;
    PromptEncoderOptions o;
    o.task = spec.taskname;
    o.tokens = spec.total_virtual_tokens;
    o.hidden = h;
    o.style = p.virtual_prompt_style;
    o.p_tuning = p.p_tuning;
    o.seed = static_cast<uint64_t>(recipe.model.seed);
    o.device = device;
    if (o.style == config::VirtualPromptStyle::kPromptTuning) {
      const auto* method = entry_for(p.prompt_tuning.new_prompt_init_methods, new_index);
      if (method && *method == config::PromptInitMethod::kText) {
        const auto* text = entry_for(p.prompt_tuning.new_prompt_init_text, new_index);
        o.initial_table = text_initial_table(text ? *text : "", o.tokens, word_embeddings, tokenizer);
      }
    }
    encoder_of_[t] = static_cast<int64_t>(encoders_.size());
    encoders_.emplace_back(o, tp);
    ++new_index;
  }
}

at::Tensor PromptModel::vectors(int64_t task, bool training, uint64_t step) const {
  if (task < 0 || task >= static_cast<int64_t>(templates_.size()))
    throw std::out_of_range(fmt::format("prompt model: task index {} outside the {} tasks", task, templates_.size()));
  if (encoder_of_[task] >= 0) return encoders_[encoder_of_[task]].forward(training, step);
  auto it = frozen_.find(task);
  if (it == frozen_.end())
    throw std::invalid_argument(fmt::format("task '{}' has records but is neither in model.new_tasks nor in "
                                            "model.existing_tasks", templates_[task].spec.taskname));
  return it->second;
}

model::PromptSplice PromptModel::splice(const prompt_data::PromptBatch& batch, int64_t first_row, int64_t rows,
                                        bool training, uint64_t step) const {
  const int64_t s = batch.seq_length;
  std::vector<int64_t> seq, row_of;
  std::vector<at::Tensor> parts;
  std::map<int64_t, at::Tensor> per_task;  // one encoder pass per task and micro-batch
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = first_row + r;
    const int64_t task = batch.task.at(static_cast<size_t>(row));
    int64_t count = 0;
    for (int64_t j = 0; j < s; ++j) {
      if (!batch.virtual_mask[static_cast<size_t>(row * s + j)]) continue;
      seq.push_back(j);
      row_of.push_back(r);
      ++count;
    }
    if (count == 0) continue;
    auto it = per_task.find(task);
    if (it == per_task.end()) it = per_task.emplace(task, vectors(task, training, step)).first;
    if (count != it->second.size(0))
      throw std::logic_error(fmt::format("prompt batch row {} has {} virtual positions, task '{}' {} tokens", row,
                                         count, templates_[task].spec.taskname, it->second.size(0)));
    parts.push_back(it->second);
  }
  model::PromptSplice out;
  if (parts.empty()) return out;
  // The positions are known from the batch on the host: one copy each, no device sync.
  const auto on_device = at::TensorOptions().dtype(at::kLong).device(device_);
  out.seq_index = at::tensor(seq, on_device);
  out.batch_index = at::tensor(row_of, on_device);
  out.vectors = parts.size() == 1 ? parts.front() : at::cat(parts, 0);
  return out;
}

std::vector<PromptTable> PromptModel::tables() const {
  at::NoGradGuard no_grad;
  std::vector<PromptTable> out;
  for (size_t t = 0; t < templates_.size(); ++t) {
    if (encoder_of_[t] < 0 && !frozen_.count(static_cast<int64_t>(t))) continue;
    out.push_back({templates_[t].spec, vectors(static_cast<int64_t>(t), false, 0).to(at::kCPU).contiguous()});
  }
  return out;
}

model::ParamList PromptModel::parameters() const {
  model::ParamList out;
  for (const auto& e : encoders_)
    for (auto& p : e.parameters()) out.push_back(std::move(p));
  return out;
}

int64_t PromptModel::num_parameters() const {
  int64_t n = 0;
  for (const auto& e : encoders_) n += e.num_parameters();
  return n;
}

}  // namespace loom::ptune
