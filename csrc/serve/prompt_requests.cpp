#include "serve/prompt_requests.h"

#include <fmt/format.h>

#include <set>

#include "data/data_error.h"
#include "serve/http_api.h"

namespace loom::serve {

PromptTasks make_prompt_tasks(const std::vector<config::TaskTemplate>& templates, bool add_bos,
                              const data::Tokenizer& tokenizer, int64_t context) {
  PromptTasks tasks;
  tasks.templates = prompt_data::parse_task_templates(templates, context);
  tasks.options = prompt_data::example_options(tokenizer);
  tasks.options.add_bos = add_bos;
  tasks.options.max_seq_length = context;
  tasks.options.for_inference = true;
  for (const auto& t : tasks.templates)
    tasks.task_list += (tasks.task_list.empty() ? "'" : ", '") + t.taskname() + "'";
  return tasks;
}

int64_t prompt_task_index(const PromptTasks* tasks, const nlohmann::json& value, const std::string& field) {
  if (!tasks) throw ApiError(400, field, "this server has no learned prompts (start it with --prompt-checkpoint)");
  const int64_t n = static_cast<int64_t>(tasks->templates.size());
  if (value.is_string()) {
    const int64_t k = prompt_data::find_task(tasks->templates, value.get<std::string>());
    if (k < 0)
      throw ApiError(400, field, fmt::format("expected one of the tasks {}, found {}", tasks->task_list, excerpt(value)));
    return k;
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() < n) return value.get<int64_t>();
  throw ApiError(400, field,
                 fmt::format("expected a task name ({}) or index in [0, {}), found {}", tasks->task_list, n, excerpt(value)));
}

void lay_out_record(const PromptTasks& tasks, int64_t task, const nlohmann::json& record, const data::Tokenizer& tokenizer,
                    const std::string& field, RequestSpec& spec) {
  if (!record.is_object())
    throw ApiError(400, field, "expected an object of the task's template fields, found " + excerpt(record));
  prompt_data::PromptRecord fields;
  for (const auto& [key, value] : record.items()) {
    if (key == "taskname") continue;
    if (!value.is_string())
      throw ApiError(400, field + "." + key, "expected a string, found " + excerpt(value));
    fields[key] = value.get<std::string>();
  }
  const auto& tmpl = tasks.templates[static_cast<size_t>(task)];
  if (auto problem = prompt_data::record_problem(fields, tmpl, /*answer_required=*/false))
    throw ApiError(400, field, *problem);
  std::optional<prompt_data::PromptExample> example;
  try {
    example = prompt_data::make_prompt_example(fields, task, tmpl, tokenizer, tasks.options);
  } catch (const data::DataError& e) {
    throw ApiError(400, field, e.what());
  }
  if (!example)
    throw ApiError(400, field,
                   fmt::format("the record of task '{}' does not fit the model's context of {} tokens",
                               tmpl.taskname(), tasks.options.max_seq_length));
  spec.prompt = example->tokens;
  spec.prompt_task = task;
  spec.virtual_positions.clear();
  for (size_t i = 0; i < example->is_virtual.size(); ++i)
    if (example->is_virtual[i]) spec.virtual_positions.push_back(static_cast<int64_t>(i));
}

std::vector<size_t> text_positions(const RequestSpec& spec) {
  const std::set<int64_t> virtual_at(spec.virtual_positions.begin(), spec.virtual_positions.end());
  std::vector<size_t> out;
  for (size_t i = 0; i < spec.prompt.size(); ++i)
    if (!virtual_at.count(static_cast<int64_t>(i))) out.push_back(i);
  return out;
}

}  // namespace loom::serve
