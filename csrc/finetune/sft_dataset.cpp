#include "finetune/sft_dataset.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>

#include <nlohmann/json.hpp>

#include "data/data_error.h"
#include "data/input_stream.h"
#include "prompt_data/prompt_example.h"

namespace loom::finetune {
namespace {

bool blank(const std::string& line) { return line.find_first_not_of(" \t\r\n\f\v") == std::string::npos; }

// The `{name}` placeholders of `text`, each once, in order (brace errors are the parser's).
std::vector<std::string> placeholders(const std::string& text) {
  std::vector<std::string> out;
  for (size_t open = text.find('{'); open != std::string::npos; open = text.find('{', open + 1)) {
    const size_t close = text.find('}', open);
    if (close == std::string::npos) break;
    const std::string name = text.substr(open + 1, close - open - 1);
    if (!name.empty() && name.find('{') == std::string::npos &&
        std::find(out.begin(), out.end(), name) == out.end())
      out.push_back(name);
  }
  return out;
}

// The recipe key a template rule is about.
std::string recipe_key(const std::string& template_key) {
  if (template_key == "answer_field" || template_key == "answer_only_loss") return "model.data.train_ds.label_key";
  if (template_key == "truncate_field") return "model.data.train_ds.truncation_field";
  return "model.data.train_ds.prompt_template";
}

void append(std::vector<int64_t>& tokens, std::vector<uint8_t>& answer, const std::vector<int32_t>& ids, bool is_answer) {
  tokens.insert(tokens.end(), ids.begin(), ids.end());
  answer.insert(answer.end(), ids.size(), is_answer ? 1 : 0);
}

// A chat record's example (see the header); nullopt when cut to nothing to learn.
std::optional<SftExample> chat_example(const nlohmann::json& messages, const SftLayout& layout,
                                       const data::Tokenizer& tokenizer, bool& truncated,
                                       const std::function<void(const std::string&)>& fail) {
  if (!messages.is_array() || messages.empty()) fail("\"messages\": expected a non-empty list of {role, content} objects");
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string())
      fail(fmt::format("\"messages\"[{}]: expected an object with string \"role\" and \"content\"", i));
  }
  if (!layout.chat_template)
    fail("a chat record (\"messages\"), but the base run has no chat template (tokenizer/chat_template.jinja): set "
         "model.data.train_ds.chat_template to a Jinja chat template file");
  const serve::ChatTemplate& chat = *layout.chat_template;
  auto render = [&](size_t n, bool generation_prompt) {
    try {
      return chat.render(nlohmann::json(std::vector<nlohmann::json>(messages.begin(), messages.begin() + long(n))),
                         generation_prompt);
    } catch (const serve::ChatTemplateError& e) {
      fail(fmt::format("the chat template {} refused \"messages\": {}", chat.origin(), e.what()));
      return std::string();
    }
  };
  const std::string whole = render(messages.size(), false);
  SftExample ex;
  ex.chat = true;
  size_t done = 0;  // characters of `whole` tokenised so far
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] != "assistant") continue;
    const std::string before = render(i, true), through = render(i + 1, false);
    if (whole.compare(0, before.size(), before) != 0 || whole.compare(0, through.size(), through) != 0 ||
        before.size() < done || through.size() < before.size())
      fail(fmt::format("\"messages\"[{}]: the chat template {} does not render the conversation up to this assistant "
                       "turn as a prefix of the whole conversation, so its answer tokens cannot be located",
                       i, chat.origin()));
    append(ex.tokens, ex.answer, tokenizer.encode(std::string_view(whole).substr(done, before.size() - done)), false);
    append(ex.tokens, ex.answer, tokenizer.encode(std::string_view(whole).substr(before.size(), through.size() - before.size())),
           true);
    done = through.size();
  }
  if (done == 0) fail("\"messages\": no message has role \"assistant\": there is no answer to learn");
  append(ex.tokens, ex.answer, tokenizer.encode(std::string_view(whole).substr(done)), false);
  if (ex.size() > layout.max_seq_length) {
    ex.tokens.resize(static_cast<size_t>(layout.max_seq_length));
    ex.answer.resize(static_cast<size_t>(layout.max_seq_length));
    truncated = true;
  }
  // An answer token needs a token before it to be a label.
  if (ex.size() < 2 || std::find(ex.answer.begin() + 1, ex.answer.end(), uint8_t{1}) == ex.answer.end())
    return std::nullopt;
  return ex;
}

}  // namespace

prompt_data::ParsedTemplate parse_sft_template(const config::SftDatasetConfig& train, int64_t max_seq_length) {
  config::TaskTemplate spec;
  spec.taskname = "train_ds";
  spec.prompt_template = train.prompt_template;
  spec.prompt_template_fields = placeholders(train.prompt_template);
  spec.answer_field = train.label_key;
  if (!train.truncation_field.empty()) spec.truncate_field = train.truncation_field;
  spec.answer_only_loss = true;  // the mask of answer tokens is always kept; the loss rule is the task's
  try {
    return prompt_data::parse_task_template(spec, max_seq_length);
  } catch (const prompt_data::TemplateError& e) {
    std::string message;
    for (const auto& p : e.problems) message += (message.empty() ? "" : "\n") + recipe_key(p.key) + ": " + p.message;
    throw std::invalid_argument(message);
  }
}

SftDataset::SftDataset(const std::vector<std::string>& files, const SftLayout& layout, const data::Tokenizer& tokenizer)
    : files_(files), max_seq_length_(layout.max_seq_length) {
  for (const auto& f : files_) read_file(f, layout, tokenizer);
}

void SftDataset::read_file(const std::string& path, const SftLayout& layout, const data::Tokenizer& tokenizer) {
  if (!std::ifstream(path, std::ios::binary))
    throw data::DataError(fmt::format("{}: cannot open the JSONL file ({})", path, std::strerror(errno)));
  prompt_data::ExampleOptions options = prompt_data::example_options(tokenizer);
  options.add_bos = layout.add_bos;
  options.add_eos = layout.add_eos;
  options.max_seq_length = layout.max_seq_length;
  const auto& fields = layout.prompt_template.spec.prompt_template_fields;
  data::LineStream in(path, data::kMaxRecordLineBytes, "a record is at most one line of 64 MiB");
  std::string line;
  int64_t line_no = 0, records = 0;
  while (in.next_line(line)) {
    ++line_no;
    if (blank(line)) continue;
    ++records;
    const std::string where = fmt::format("{}:{}: ", path, line_no);
    auto fail = [&](const std::string& message) { throw data::DataError(where + message); };
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      fail(std::string("not valid JSON: ") + e.what());
    }
    if (!j.is_object()) fail(std::string("expected a JSON object, found ") + j.type_name());
    std::optional<SftExample> ex;
    bool truncated = false;
    if (j.contains("messages")) {
      ex = chat_example(j["messages"], layout, tokenizer, truncated, fail);
    } else {
      prompt_data::PromptRecord record;
      for (const auto& name : fields) {
        if (!j.contains(name))
          fail(fmt::format("no field \"{}\" (prompt_template \"{}\" needs {}; a chat record has \"messages\")", name,
                           layout.prompt_template.spec.prompt_template, fmt::join(fields, ", ")));
        if (!j[name].is_string()) fail(fmt::format("field \"{}\": expected a string, found {}", name, j[name].type_name()));
        record[name] = j[name].get<std::string>();
      }
      const auto pe = prompt_data::make_prompt_example(record, 0, layout.prompt_template, tokenizer, options);
      if (pe) {
        ex.emplace();
        ex->tokens = pe->tokens;
        ex->answer.assign(pe->tokens.size(), 0);
        for (int64_t k = pe->answer_start; k < pe->answer_start + pe->answer_length; ++k) ex->answer[size_t(k)] = 1;
        truncated = pe->truncated > 0;
      }
    }
    if (!ex) {
      ++dropped_;
      continue;
    }
    truncated_ += truncated ? 1 : 0;
    chat_ += ex->chat ? 1 : 0;
    examples_.push_back(std::move(*ex));
    sources_.push_back(fmt::format("{}:{}", path, line_no));
  }
  if (records == 0)
    throw data::DataError(fmt::format("{}: holds no records ({}); expected one JSON object per line", path,
                                      line_no == 0 ? "the file is empty" : fmt::format("only {} blank line(s)", line_no)));
}

int64_t SftDataset::longest_input() const {
  int64_t out = 0;
  for (const auto& e : examples_) out = std::max(out, e.size() - 1);
  return out;
}

std::string SftDataset::summary() const {
  std::string s = fmt::format("{} examples ({} prompt/answer, {} chat) from {} file{}", size(), size() - chat_, chat_,
                              files_.size(), files_.size() == 1 ? "" : "s");
  if (dropped_) s += fmt::format("; {} longer than max_seq_length {} dropped", dropped_, max_seq_length_);
  if (truncated_) s += fmt::format("; {} truncated", truncated_);
  return s;
}

}  // namespace loom::finetune
