// Learned prompts in `loom serve --prompt-checkpoint DIR` (docs/serving.md, "Learned prompts"):
// the tasks of a prompt-learning run's inference tables (ptune/prompt_tables.h) and the layout
// of a request's record by its task's template, exactly as `loom generate --prompt-checkpoint`
// lays out an input line (prompt_data/prompt_example.h, for inference: everything before the
// answer, virtual positions holding the pad id). The engine splices the task's table into
// those positions in the prefill (serve/engine.h), so requests of different tasks and plain
// requests share one batch.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "prompt_data/prompt_example.h"
#include "prompt_data/task_template.h"
#include "serve/request.h"

namespace loom::serve {

struct PromptTasks {
  std::vector<prompt_data::ParsedTemplate> templates;  ///< by task index (the tables' order)
  prompt_data::ExampleOptions options;                 ///< the run's add_bos; inference examples
  std::string task_list;                               ///< "'a', 'b'" for messages
};

/// The tasks of the tables' templates for a model of `context` positions. Throws
/// prompt_data::TemplateError for a template that no longer parses.
PromptTasks make_prompt_tasks(const std::vector<config::TaskTemplate>& templates, bool add_bos,
                              const data::Tokenizer& tokenizer, int64_t context);

/// The task index a request names in `field`: a task name (string) or an index (integer).
/// Throws ApiError (400) naming `field` for another type or an unknown task, or when the
/// server has no tables (`tasks` null).
int64_t prompt_task_index(const PromptTasks* tasks, const nlohmann::json& value, const std::string& field);

/// Lays out `record` (an object of the template's string fields; a "taskname" key is ignored)
/// for task `task` into `spec` (prompt, prompt_task, virtual_positions). Throws ApiError (400)
/// naming `field` when the record is not an object of strings, lacks a field or has an unknown
/// one, or does not fit the context even after truncation.
void lay_out_record(const PromptTasks& tasks, int64_t task, const nlohmann::json& record, const data::Tokenizer& tokenizer,
                    const std::string& field, RequestSpec& spec);

/// Indices of the prompt positions that are not virtual (every position of a plain request):
/// the prompt tokens a response shows.
std::vector<size_t> text_positions(const RequestSpec& spec);

}  // namespace loom::serve
