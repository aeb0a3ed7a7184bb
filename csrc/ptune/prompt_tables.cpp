#include "ptune/prompt_tables.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <fcntl.h>  // AT_FDCWD

#include <cstdio>  // renameat2, RENAME_EXCHANGE (glibc, _GNU_SOURCE)
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>

#include "launch/file_util.h"
#include "tensor_io/safetensors_file.h"

namespace fs = std::filesystem;

namespace loom::ptune {

using tensor_io::read_safetensors;
using tensor_io::SafetensorsContent;
using tensor_io::write_safetensors;

namespace {

constexpr const char* kIndexFile = "index.json";
constexpr const char* kTensorName = "prompt_table";

// A file name for a task: its name when that is a plain word, else its position (task names
// are free text in NeMo's recipes); `taken` holds the names given so far, so that "a b" (task
// 0) and a task named "task_0" never share a file.
std::string table_file(const std::string& task, size_t index, std::set<std::string>& taken) {
  const bool plain = !task.empty() && task.size() <= 100 && task[0] != '.' &&
                     task.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") ==
                         std::string::npos;
  std::string name = plain ? task : fmt::format("task_{}", index);
  while (taken.count(name)) name += fmt::format("_{}", index);
  taken.insert(name);
  return name + ".safetensors";
}

nlohmann::json template_json(const config::TaskTemplate& t) {
  nlohmann::json j{{"taskname", t.taskname},
                   {"prompt_template", t.prompt_template},
                   {"prompt_template_fields", t.prompt_template_fields},
                   {"total_virtual_tokens", t.total_virtual_tokens},
                   {"virtual_token_splits", t.virtual_token_splits},
                   {"answer_only_loss", t.answer_only_loss}};
  j["answer_field"] = t.answer_field ? nlohmann::json(*t.answer_field) : nlohmann::json(nullptr);
  j["truncate_field"] = t.truncate_field ? nlohmann::json(*t.truncate_field) : nlohmann::json(nullptr);
  return j;
}

config::TaskTemplate template_from_json(const nlohmann::json& j) {
  config::TaskTemplate t;
  t.taskname = j.at("taskname").get<std::string>();
  t.prompt_template = j.at("prompt_template").get<std::string>();
  t.prompt_template_fields = j.at("prompt_template_fields").get<std::vector<std::string>>();
  t.total_virtual_tokens = j.at("total_virtual_tokens").get<int64_t>();
  t.virtual_token_splits = j.at("virtual_token_splits").get<std::vector<int64_t>>();
  t.answer_only_loss = j.at("answer_only_loss").get<bool>();
  if (!j.at("answer_field").is_null()) t.answer_field = j.at("answer_field").get<std::string>();
  if (!j.at("truncate_field").is_null()) t.truncate_field = j.at("truncate_field").get<std::string>();
  return t;
}

// `dir` without a trailing separator, so that "<dir>.new" is a sibling.
fs::path folder_path(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  return p.filename().empty() ? p.parent_path() : p;
}

fs::path sibling(const fs::path& dir, const char* suffix) { return fs::path(dir.string() + suffix); }

// Puts the complete folder `staged` in the place of `dir`.
void swap_into_place(const fs::path& staged, const fs::path& dir) {
  if (!fs::exists(dir)) {
    fs::rename(staged, dir);
    return;
  }
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    launch::remove_tree(staged.string());  // now the old set
    return;
  }
  const fs::path previous = sibling(dir, ".old");
  launch::remove_tree(previous.string());
  fs::rename(dir, previous);
  fs::rename(staged, dir);
  launch::remove_tree(previous.string());
}

}  // namespace

const PromptTable* PromptTables::find(const std::string& task) const {
  for (const auto& t : tasks)
    if (t.spec.taskname == task) return &t;
  return nullptr;
}

std::string PromptTables::task_list() const {
  std::string out;
  for (const auto& t : tasks) out += (out.empty() ? "'" : ", '") + t.spec.taskname + "'";
  return out.empty() ? "(none)" : out;
}

std::string prompt_tables_dir(const std::string& run_dir) { return (fs::path(run_dir) / "prompt_tables").string(); }

void write_prompt_tables(const std::string& dir_name, const PromptTables& tables,
                         const std::function<void(const std::string& file)>& after_file) {
  const fs::path final_dir = folder_path(dir_name);
  const fs::path dir = sibling(final_dir, ".new");
  launch::remove_tree(dir.string());  // what an interrupted write left
  fs::create_directories(dir);
  nlohmann::json index{{"format", "loom-prompt-tables"}, {"version", 1}, {"virtual_prompt_style", tables.style},
                       {"base", tables.base}, {"iteration", tables.iteration}, {"val_loss", tables.val_loss},
                       {"add_bos", tables.add_bos}, {"add_eos", tables.add_eos}};
  index["tasks"] = nlohmann::json::array();
  std::set<std::string> taken;
  for (size_t i = 0; i < tables.tasks.size(); ++i) {
    const auto& t = tables.tasks[i];
    const std::string file = table_file(t.spec.taskname, i, taken);
    SafetensorsContent content;
    content.tensors[kTensorName] = t.vectors.to(at::kFloat);
    content.metadata = {{"task", t.spec.taskname},
                        {"tokens", std::to_string(t.vectors.size(0))},
                        {"hidden", std::to_string(t.vectors.size(1))},
                        {"virtual_token_splits", nlohmann::json(t.spec.virtual_token_splits).dump()},
                        {"prompt_template", t.spec.prompt_template},
                        {"virtual_prompt_style", tables.style}};
    write_safetensors((dir / file).string(), content);
    if (after_file) after_file((dir / file).string());
    index["tasks"].push_back({{"taskname", t.spec.taskname},
                              {"file", file},
                              {"tokens", t.vectors.size(0)},
                              {"hidden", t.vectors.size(1)},
                              {"template", template_json(t.spec)}});
  }
  const fs::path path = dir / kIndexFile;
  {
    std::ofstream f(path, std::ios::trunc);
    f << index.dump(2) << "\n";
    f.flush();
    if (!f) throw std::runtime_error(path.string() + ": cannot write the file");
  }
  if (after_file) after_file(path.string());
  swap_into_place(dir, final_dir);
}

PromptTables read_prompt_tables(const std::string& dir_or_run) {
  fs::path dir(dir_or_run);
  if (!fs::exists(dir / kIndexFile) && fs::exists(dir / "prompt_tables" / kIndexFile)) dir /= "prompt_tables";
  // Between the two renames of a file system without RENAME_EXCHANGE, the old set is here.
  if (!fs::exists(dir / kIndexFile) && fs::exists(sibling(folder_path(dir.string()), ".old") / kIndexFile))
    dir = sibling(folder_path(dir.string()), ".old");
  const fs::path path = dir / kIndexFile;
  std::ifstream f(path);
  if (!f)
    throw std::invalid_argument(fmt::format("{}: no prompt tables here (expected {} or prompt_tables/{}, written by "
                                            "loom ptune)", dir_or_run, kIndexFile, kIndexFile));
  PromptTables out;
  try {
    const nlohmann::json index = nlohmann::json::parse(f);
    out.style = index.at("virtual_prompt_style").get<std::string>();
    out.base = index.at("base");
    out.iteration = index.at("iteration").get<int64_t>();
    out.val_loss = index.at("val_loss").get<double>();
    out.add_bos = index.value("add_bos", false);
    out.add_eos = index.value("add_eos", true);
    for (const auto& entry : index.at("tasks")) {
      PromptTable t;
      t.spec = template_from_json(entry.at("template"));
      const std::string file = entry.at("file").get<std::string>();
      if (file.find('/') != std::string::npos || file.find("..") != std::string::npos)
        throw std::invalid_argument("table file '" + file + "' is not a plain file name");
      const SafetensorsContent content = read_safetensors((dir / file).string());
      auto it = content.tensors.find(kTensorName);
      if (it == content.tensors.end())
        throw std::invalid_argument((dir / file).string() + ": no tensor '" + kTensorName + "'");
      if (it->second.scalar_type() != at::kFloat)
        throw std::invalid_argument((dir / file).string() + ": tensor '" + kTensorName + "' is " +
                                    c10::toString(it->second.scalar_type()) + ", expected F32");
      t.vectors = it->second;
      const int64_t tokens = entry.at("tokens").get<int64_t>(), hidden = entry.at("hidden").get<int64_t>();
      if (t.vectors.dim() != 2 || t.vectors.size(0) != tokens || t.vectors.size(1) != hidden ||
          tokens != t.spec.total_virtual_tokens)
        throw std::invalid_argument(fmt::format("{}: table of task '{}' is not [{}, {}] as the index says",
                                                (dir / file).string(), t.spec.taskname, tokens, hidden));
      out.tasks.push_back(std::move(t));
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(path.string() + ": malformed index: " + e.what());
  }
  return out;
}

}  // namespace loom::ptune
