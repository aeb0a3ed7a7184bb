#include "convert/lora_checkpoint.h"

#include <fmt/format.h>

#include <stdexcept>

#include "convert/convert_error.h"
#include "ptune/frozen_base.h"

namespace loom::convert {

AdapterCheckpoint read_adapter_checkpoint(const std::string& checkpoint, std::optional<int64_t> iteration) {
  const std::string what = "--checkpoint " + checkpoint;
  AdapterCheckpoint a;
  a.location = generate::locate_checkpoint(checkpoint);
  a.info = generate::read_checkpoint_info(a.location.checkpoints, iteration);
  const nlohmann::json& task = a.info.layout.task_record;
  if (!task.contains(finetune::kLoraRecordKey))
    throw ConvertInputError(fmt::format("{}: iteration {} is not a LoRA adapter checkpoint of loom finetune (its "
                                        "metadata.json records no layout.model.lora)",
                                        what, a.info.iteration));
  try {
    a.record = finetune::LoraRecord::from_json(task[finetune::kLoraRecordKey], what);
  } catch (const std::invalid_argument& e) {
    throw ConvertInputError(e.what());
  }
  // The base the adapters were trained on, exactly: the recorded iteration and checkpoint digest.
  a.base_location = generate::locate_checkpoint(a.record.base_checkpoints);
  a.base = generate::read_full_checkpoint(
      a.base_location.checkpoints, generate::read_checkpoint_info(a.base_location.checkpoints, a.record.base_iteration));
  const std::string digest = ptune::checkpoint_digest(a.base);
  if (digest != a.record.base_digest)
    throw ConvertInputError(fmt::format("{}: its base {} iteration {} has changed since the adapters were trained "
                                        "(checkpoint digest {}, recorded {})",
                                        what, a.record.base_checkpoints, a.record.base_iteration, digest,
                                        a.record.base_digest));
  a.adapters = generate::read_full_checkpoint(a.location.checkpoints, a.info);
  return a;
}

}  // namespace loom::convert
