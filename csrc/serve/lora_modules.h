// `loom serve --lora NAME=DIR ...` (docs/serving.md, "LoRA adapters"): adapter checkpoints of
// `loom finetune` (docs/design/lora.md, "Checkpoints") served over the checkpoint they were
// trained on, each under its own model id (vLLM's --lora-modules name=path). Checked before any
// rank starts (syntax, names, each adapter naming the served checkpoint and iteration); each
// rank then reads the adapters' tensors, checks the base's digest against the one recorded at
// training and keeps its shards (model/lora_serving.h).
#pragma once
#include <string>
#include <vector>

#include "finetune/lora_run.h"
#include "generate/checkpoint_reader.h"
#include "generate/generate_run.h"
#include "model/lora_serving.h"

namespace loom::serve {

/// One --lora value.
struct LoraModule {
  std::string name;  ///< the model id requests name
  std::string dir;   ///< a loom finetune run directory or its checkpoints/
};

/// Parses "NAME=DIR" (NAME non-empty, without spaces; DIR non-empty). Throws
/// std::invalid_argument naming --lora and the value.
LoraModule parse_lora_module(const std::string& value);

/// An adapter checkpoint to serve (its latest iteration), checked against the served base.
struct ServedAdapter {
  LoraModule module;
  generate::CheckpointLocation location;
  generate::CheckpointInfo info;
  finetune::LoraRecord record;
};

/// Checks the modules against the served checkpoint `base` (served as `base_name`): distinct
/// names, none the base's; each DIR a LoRA adapter checkpoint whose record names `base`'s
/// checkpoints directory and iteration. Throws generate::GenerateInputError naming
/// "--lora NAME=DIR" (and both checkpoints for another base), or train::CheckpointError for an
/// adapter checkpoint that does not read.
std::vector<ServedAdapter> plan_lora_modules(const std::vector<LoraModule>& modules, const std::string& base_name,
                                             const generate::GeneratePlan& base);

/// On a rank: reads each adapter's tensors into `bank` (its index = its place in `adapters`),
/// after checking that `base` (the served checkpoint, as read) has the digest recorded when the
/// adapters were trained. Throws generate::GenerateInputError naming the module when it has
/// not (the base changed since) or the adapters do not fit the model.
void load_lora_modules(const std::vector<ServedAdapter>& adapters, const generate::FullCheckpoint& base,
                       model::LoraBank& bank);

}  // namespace loom::serve
