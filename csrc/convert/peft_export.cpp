#include "convert/peft_export.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>

#include "convert/convert_error.h"
#include "convert/lora_checkpoint.h"
#include "convert/peft_modules.h"
#include "convert/hf_files.h"
#include "convert/hf_gpt2.h"
#include "convert/hf_llama.h"
#include "finetune/lora_run.h"
#include "generate/checkpoint_reader.h"
#include "model/lora.h"
#include "ptune/frozen_base.h"
#include "tensor_io/safetensors_file.h"
#include "train/checkpoint_files.h"

namespace fs = std::filesystem;

namespace loom::convert {

PeftExportResult export_peft(const HfExportRequest& request, const std::string& base_model) {
  refuse_occupied_output(request.output_dir, request.overwrite, "--to peft");
  const std::string what = "--checkpoint " + request.checkpoint;
  const AdapterCheckpoint checkpoint = read_adapter_checkpoint(request.checkpoint, request.iteration);
  const generate::CheckpointInfo& info = checkpoint.info;
  const finetune::LoraRecord& record = checkpoint.record;
  const generate::FullCheckpoint& adapters = checkpoint.adapters;
  const generate::FullCheckpoint& base = checkpoint.base;

  Gpt2Shape shape;
  static_cast<ModelShape&>(shape) = info.layout.model_shape;
  const bool gpt2 = shape.is_gpt();
  const int64_t r = record.lora.dim;
  // B's rows go where the converter puts the weight's rows: every adapted weight is replaced by a
  // probe [B | 0] (B in its first r input columns) and the model mapped once; each HF tensor's
  // first r input columns are then that module's B (A is unchanged: no mapping reorders inputs).
  std::map<std::string, at::Tensor> probes = base.params;
  const auto maps = peft_module_maps(gpt2);
  for (int64_t i = 0; i < shape.num_layers; ++i)
    for (const auto& m : maps) {
      if (!record.lora.adapts(m.target)) continue;
      const std::string linear = fmt::format("layers.{}.{}", i, m.loom);
      const at::Tensor& w = base.params.at(linear + ".weight");
      const at::Tensor& b = adapters.params.at(model::lora_b_name(linear));
      if (b.size(1) != r || r > w.size(1))
        throw ConvertInputError(fmt::format("{}: {} is [{}, {}], expected [{}, {}] with r <= the weight's {} inputs", what,
                                            model::lora_b_name(linear), b.size(0), b.size(1), w.size(0), r, w.size(1)));
      probes[linear + ".weight"] = at::cat({b.to(w.scalar_type()), at::zeros({w.size(0), w.size(1) - r}, w.options())}, 1);
    }
  const std::map<std::string, at::Tensor> hf = gpt2 ? loom_to_hf(probes, shape) : loom_to_llama(probes, shape);

  tensor_io::SafetensorsContent content;
  content.metadata = {{"format", "pt"}};
  std::vector<std::string> targets;
  PeftExportResult result;
  result.iteration = info.iteration;
  const std::string root = peft_layer_root(gpt2);
  for (const auto& m : maps) {
    if (!record.lora.adapts(m.target)) continue;
    // PEFT matches a target by the module name's suffix: "attn.c_proj" is attention's only.
    targets.insert(targets.end(), m.modules.begin(), m.modules.end());
    for (int64_t i = 0; i < shape.num_layers; ++i) {
      const std::string linear = fmt::format("layers.{}.{}", i, m.loom);
      const at::Tensor& a = adapters.params.at(model::lora_a_name(linear));
      for (const auto& module : m.modules) {
        const at::Tensor& mapped = hf.at(fmt::format("{}{}.{}.weight", root, i, module));
        // GPT-2's Conv1D stores [in, out]: B^T is in its first r rows.
        const at::Tensor b = gpt2 ? mapped.narrow(0, 0, r).t() : mapped.narrow(1, 0, r);
        const std::string name = fmt::format("base_model.model.{}{}.{}", root, i, module);
        content.tensors[name + ".lora_A.weight"] = a.contiguous();
        content.tensors[name + ".lora_B.weight"] = b.contiguous();
        ++result.modules;
      }
    }
  }
  nlohmann::ordered_json config = {{"peft_type", "LORA"},
                                   {"task_type", "CAUSAL_LM"},
                                   {"base_model_name_or_path", base_model.empty() ? record.base_checkpoints : base_model},
                                   {"r", r},
                                   {"lora_alpha", record.lora.alpha},
                                   {"lora_dropout", record.lora.dropout},
                                   {"target_modules", targets},
                                   {"fan_in_fan_out", gpt2},
                                   {"bias", "none"},
                                   {"use_rslora", false},
                                   {"use_dora", false},
                                   {"init_lora_weights", true},
                                   {"modules_to_save", nullptr},
                                   {"inference_mode", true}};
  fs::create_directories(request.output_dir);
  tensor_io::write_safetensors((fs::path(request.output_dir) / "adapter_model.safetensors").string(), content);
  train::write_text_atomically((fs::path(request.output_dir) / "adapter_config.json").string(), config.dump(2) + "\n");
  return result;
}

}  // namespace loom::convert
