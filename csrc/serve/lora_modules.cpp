#include "serve/lora_modules.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "ptune/frozen_base.h"

namespace loom::serve {

using generate::GenerateInputError;

namespace {

std::string flag(const LoraModule& m) { return "--lora " + m.name + "=" + m.dir; }

std::string same_path(const std::string& path) {
  return std::filesystem::weakly_canonical(std::filesystem::absolute(path)).lexically_normal().string();
}

}  // namespace

LoraModule parse_lora_module(const std::string& value) {
  const size_t eq = value.find('=');
  LoraModule m;
  if (eq != std::string::npos) m = {value.substr(0, eq), value.substr(eq + 1)};
  const bool spaced = std::any_of(m.name.begin(), m.name.end(), [](unsigned char c) { return std::isspace(c); });
  if (eq == std::string::npos || m.name.empty() || m.dir.empty() || spaced)
    throw std::invalid_argument(fmt::format(
        "--lora {}: expected NAME=DIR (NAME the model id requests name, without spaces; DIR a loom finetune run)",
        value));
  return m;
}

std::vector<ServedAdapter> plan_lora_modules(const std::vector<LoraModule>& modules, const std::string& base_name,
                                             const generate::GeneratePlan& base) {
  std::vector<ServedAdapter> out;
  std::set<std::string> names;
  for (const LoraModule& m : modules) {
    if (m.name == base_name)
      throw GenerateInputError(fmt::format("{}: '{}' is the base model's id (--model-name); name the adapter otherwise",
                                           flag(m), m.name));
    if (!names.insert(m.name).second)
      throw GenerateInputError(fmt::format("{}: the name '{}' is given to two adapters", flag(m), m.name));
    ServedAdapter a;
    a.module = m;
    try {
      a.location = generate::locate_checkpoint(m.dir);
      a.info = generate::read_checkpoint_info(a.location.checkpoints);
    } catch (const std::exception& e) {
      throw GenerateInputError(fmt::format("{}: {}", flag(m), e.what()));
    }
    const nlohmann::json& task = a.info.layout.task_record;
    if (!task.is_object() || !task.contains(finetune::kLoraRecordKey))
      throw GenerateInputError(fmt::format("{}: iteration {} is not a LoRA adapter checkpoint of loom finetune (its "
                                           "metadata.json records no layout.model.lora)",
                                           flag(m), a.info.iteration));
    try {
      a.record = finetune::LoraRecord::from_json(task[finetune::kLoraRecordKey], flag(m));
    } catch (const std::invalid_argument& e) {
      throw GenerateInputError(e.what());
    }
    if (same_path(a.record.base_checkpoints) != same_path(base.location.checkpoints) ||
        a.record.base_iteration != base.info.iteration)
      throw GenerateInputError(fmt::format(
          "{}: the adapters were trained on {} iteration {}, the served checkpoint is {} iteration {}: serve them "
          "over their base (--checkpoint {} --iteration {})",
          flag(m), a.record.base_checkpoints, a.record.base_iteration, same_path(base.location.checkpoints),
          base.info.iteration, a.record.base_checkpoints, a.record.base_iteration));
    out.push_back(std::move(a));
  }
  return out;
}

void load_lora_modules(const std::vector<ServedAdapter>& adapters, const generate::FullCheckpoint& base,
                       model::LoraBank& bank) {
  if (adapters.empty()) return;
  const std::string digest = ptune::checkpoint_digest(base);
  for (const ServedAdapter& a : adapters) {
    if (a.record.base_digest != digest)
      throw GenerateInputError(fmt::format("{}: the served checkpoint {} iteration {} has changed since the adapters "
                                           "were trained (checkpoint digest {}, recorded {})",
                                           flag(a.module), a.record.base_checkpoints, a.record.base_iteration, digest,
                                           a.record.base_digest));
    const generate::FullCheckpoint tensors = generate::read_full_checkpoint(a.location.checkpoints, a.info);
    try {
      bank.add(tensors.params, a.record.lora, flag(a.module));
    } catch (const std::invalid_argument& e) {
      throw GenerateInputError(e.what());
    }
  }
}

}  // namespace loom::serve
