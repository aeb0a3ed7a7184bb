#include "convert/peft_import.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <vector>

#include "convert/checkpoint_writer.h"
#include "convert/convert_error.h"
#include "convert/hf_gpt2.h"
#include "convert/hf_llama.h"
#include "convert/peft_modules.h"
#include "finetune/lora_run.h"
#include "generate/checkpoint_reader.h"
#include "model/lora.h"
#include "ptune/frozen_base.h"
#include "tensor_io/safetensors_file.h"
#include "train/checkpoint_files.h"

namespace fs = std::filesystem;

namespace loom::convert {

namespace {

// adapter_config.json, checked: what Loom's adapters can represent.
struct PeftConfig {
  int64_t r = 0;
  double scale = 0;  // PEFT's: lora_alpha / r, or / sqrt(r) with use_rslora
  double dropout = 0;
};

PeftConfig read_peft_config(const std::string& dir) {
  const fs::path file = fs::path(dir) / "adapter_config.json";
  std::ifstream in(file);
  if (!in) throw ConvertInputError(fmt::format("{} does not exist or cannot be read (a PEFT adapter directory holds "
                                               "adapter_config.json and adapter_model.safetensors)",
                                               file.string()));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ConvertInputError(fmt::format("{}: not valid JSON: {}", file.string(), e.what()));
  }
  auto fail = [&](const std::string& why) { throw ConvertInputError(fmt::format("{}: {}", file.string(), why)); };
  if (!j.is_object()) fail("expected a JSON object");
  if (!j.contains("peft_type") || j["peft_type"] != "LORA")
    fail(fmt::format("peft_type is {}, expected \"LORA\" (Loom imports LoRA adapters only)",
                     j.contains("peft_type") ? j["peft_type"].dump() : "missing"));
  // A field that changes the update beyond B·A must be absent or neutral.
  auto neutral = [&](const char* key, const nlohmann::json& expected, const char* why) {
    if (j.contains(key) && !j[key].is_null() && j[key] != expected)
      fail(fmt::format("{} is {}: {}", key, j[key].dump(), why));
  };
  neutral("use_dora", false, "DoRA's magnitude vectors have no Loom counterpart");
  neutral("bias", "none", "Loom's adapters train no biases");
  neutral("lora_bias", false, "Loom's adapters have no bias on B");
  neutral("modules_to_save", nlohmann::json::array(), "Loom's adapter checkpoints hold adapters only");
  neutral("rank_pattern", nlohmann::json::object(), "Loom's adapters have one rank");
  neutral("alpha_pattern", nlohmann::json::object(), "Loom's adapters have one alpha");
  PeftConfig c;
  if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() < 1) fail("r must be an integer >= 1");
  c.r = j["r"].get<int64_t>();
  const nlohmann::json alpha = j.value("lora_alpha", nlohmann::json(8));  // PEFT's default
  if (!alpha.is_number()) fail("lora_alpha must be a number");
  const nlohmann::json rslora_field = j.value("use_rslora", nlohmann::json(false));
  if (!rslora_field.is_boolean() && !rslora_field.is_null()) fail("use_rslora must be true or false");
  const bool rslora = rslora_field.is_boolean() && rslora_field.get<bool>();
  c.scale = alpha.get<double>() / (rslora ? std::sqrt(double(c.r)) : double(c.r));
  const nlohmann::json dropout = j.value("lora_dropout", nlohmann::json(0.0));
  if (!dropout.is_number() || dropout.get<double>() < 0 || dropout.get<double>() >= 1)
    fail("lora_dropout must be a number in [0, 1)");
  c.dropout = dropout.get<double>();
  return c;
}

std::map<std::string, at::Tensor> read_peft_tensors(const std::string& dir) {
  const fs::path file = fs::path(dir) / "adapter_model.safetensors";
  if (!fs::exists(file))
    throw ConvertInputError(fmt::format("{} does not exist{}", file.string(),
                                        fs::exists(fs::path(dir) / "adapter_model.bin")
                                            ? " (adapter_model.bin is not read: save with safe_serialization=True)"
                                            : ""));
  try {
    return tensor_io::read_safetensors(file.string()).tensors;
  } catch (const std::exception& e) {
    throw ConvertInputError(fmt::format("{}: {}", file.string(), e.what()));
  }
}

// One Loom linear of one layer: its HF modules' adapters (undefined: the module has none).
struct LinearAdapters {
  std::string linear;  // "layers.3.self_attention.linear_qkv"
  std::vector<std::string> modules;
  std::vector<at::Tensor> a, b;  // per module: A [r, in], B [out_m, r]
  std::vector<at::Tensor> distinct_a;
  std::vector<int64_t> slot;  // per module: its A's index in distinct_a
};

}  // namespace

PeftImportResult import_peft(const PeftImportRequest& request) {
  const PeftConfig peft = read_peft_config(request.peft_dir);
  std::map<std::string, at::Tensor> tensors = read_peft_tensors(request.peft_dir);
  const std::string tensor_file = (fs::path(request.peft_dir) / "adapter_model.safetensors").string();

  const generate::CheckpointLocation base_location = generate::locate_checkpoint(request.base);
  const generate::CheckpointInfo base_info = generate::read_checkpoint_info(base_location.checkpoints, request.iteration);
  try {
    generate::refuse_adapter_checkpoint(base_info, request.base);
  } catch (const std::exception& e) {
    throw ConvertInputError(std::string("--base: ") + e.what());
  }
  const generate::FullCheckpoint base = generate::read_full_checkpoint(base_location.checkpoints, base_info);

  const fs::path run(request.output_run);
  const std::string checkpoints = (run / "checkpoints").string();
  if (!train::list_iterations(checkpoints).empty() || fs::exists(fs::path(checkpoints) / train::kTrackerFile))
    throw ConvertInputError(checkpoints + " holds checkpoints already: import into a new run directory");

  Gpt2Shape shape;
  static_cast<ModelShape&>(shape) = base_info.layout.model_shape;
  const bool gpt2 = shape.is_gpt();
  const std::string root = peft_layer_root(gpt2);
  const std::map<std::string, at::Tensor> hf_base = gpt2 ? loom_to_hf(base.params, shape) : loom_to_llama(base.params, shape);

  // Every adapter of the file, by Loom linear; R the widest stack of distinct A's.
  PeftImportResult result;
  result.base_iteration = base_info.iteration;
  std::vector<LinearAdapters> linears;
  unsigned targets = 0;
  std::set<std::string> used;
  for (int64_t i = 0; i < shape.num_layers; ++i)
    for (const auto& map : peft_module_maps(gpt2)) {
      LinearAdapters l;
      l.linear = fmt::format("layers.{}.{}", i, map.loom);
      const int64_t in = base.params.at(l.linear + ".weight").size(1);
      for (const auto& module : map.modules) {
        const std::string name = fmt::format("base_model.model.{}{}.{}", root, i, module);
        const std::string hf_weight = fmt::format("{}{}.{}.weight", root, i, module);
        const int64_t out = gpt2 ? hf_base.at(hf_weight).size(1) : hf_base.at(hf_weight).size(0);  // Conv1D: [in, out]
        auto a = tensors.find(name + ".lora_A.weight");
        auto b = tensors.find(name + ".lora_B.weight");
        l.modules.push_back(hf_weight);
        if (a == tensors.end() && b == tensors.end()) {
          l.a.emplace_back();
          l.b.emplace_back();
          l.slot.push_back(-1);
          continue;
        }
        if (a == tensors.end() || b == tensors.end())
          throw ConvertInputError(fmt::format("{}: {} has lora_{} but no lora_{}", tensor_file, name,
                                              a == tensors.end() ? "B" : "A", a == tensors.end() ? "A" : "B"));
        auto expect = [&](const at::Tensor& t, const std::string& key, int64_t rows, int64_t cols) {
          if (t.dim() != 2 || t.size(0) != rows || t.size(1) != cols || !t.is_floating_point())
            throw ConvertInputError(fmt::format("{}: {} is {} [{}], expected a floating tensor [{}, {}] (r = {})",
                                                tensor_file, key, c10::toString(t.scalar_type()),
                                                fmt::join(t.sizes().vec(), ", "), rows, cols, peft.r));
        };
        expect(a->second, a->first, peft.r, in);
        expect(b->second, b->first, out, peft.r);
        used.insert(a->first);
        used.insert(b->first);
        const at::Tensor a32 = a->second.to(at::kFloat);
        int64_t slot = 0;
        while (slot < int64_t(l.distinct_a.size()) && !at::equal(l.distinct_a[slot], a32)) ++slot;
        if (slot == int64_t(l.distinct_a.size())) l.distinct_a.push_back(a32);
        l.a.push_back(a32);
        l.b.push_back(b->second.to(at::kFloat));
        l.slot.push_back(slot);
        ++result.modules;
      }
      if (l.distinct_a.empty()) continue;
      targets |= map.target;
      result.rank = std::max<int64_t>(result.rank, int64_t(l.distinct_a.size()) * peft.r);
      if (result.rank > in)
        throw ConvertInputError(fmt::format("{}: the adapters of {} stack to rank {}, more than its {} inputs", tensor_file,
                                            l.linear, result.rank, in));
      linears.push_back(std::move(l));
    }
  for (const auto& [name, t] : tensors)
    if (!used.count(name))
      throw ConvertInputError(fmt::format("{}: {} adapts no linear Loom's adapters cover (the attention and MLP "
                                          "linears of {}: {})",
                                          tensor_file, name, gpt2 ? "GPT2LMHeadModel" : "LlamaForCausalLM",
                                          gpt2 ? "attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj"
                                               : "q/k/v/o_proj, gate/up/down_proj"));
  if (linears.empty()) throw ConvertInputError(tensor_file + ": holds no LoRA adapters");
  const int64_t R = result.rank;

  // B's rows in Loom's order: each adapted module's weight replaced by a probe holding its B in
  // its slot's r input columns (zeros elsewhere), the model mapped once; a fused Loom weight's
  // first R columns are then its B (the mappings move rows only).
  std::map<std::string, at::Tensor> probes = hf_base;
  for (const auto& l : linears)
    for (size_t m = 0; m < l.modules.size(); ++m) {
      const at::Tensor& w = hf_base.at(l.modules[m]);
      at::Tensor probe = at::zeros(w.sizes(), w.options().dtype(at::kFloat));
      if (l.slot[m] >= 0) {
        if (gpt2)
          probe.narrow(0, l.slot[m] * peft.r, peft.r).copy_(l.b[m].t());
        else
          probe.narrow(1, l.slot[m] * peft.r, peft.r).copy_(l.b[m]);
      }
      probes[l.modules[m]] = probe;
    }
  const int64_t padded_vocab = base.params.at("embedding.word_embeddings.weight").size(0);
  const std::map<std::string, at::Tensor> mapped = gpt2 ? hf_to_loom(probes, shape, padded_vocab, tensor_file)
                                                        : llama_to_loom(probes, shape, padded_vocab, tensor_file);

  finetune::LoraRecord record;
  record.base_checkpoints = fs::absolute(base_location.checkpoints).lexically_normal().string();
  record.base_iteration = base_info.iteration;
  record.base_digest = ptune::checkpoint_digest(base);
  record.lora.dim = R;
  record.lora.alpha = peft.scale * double(R);  // Loom scales by alpha / R: PEFT's scale
  record.lora.dropout = peft.dropout;
  record.lora.targets = targets;

  train::CheckpointLayout layout;
  layout.model_shape = base_info.layout.model_shape;
  layout.stage_layers = {shape.num_layers};
  layout.task_record = {{finetune::kLoraRecordKey, record.to_json()}};
  train::RankCheckpoint state;
  // Every layer of an adapted target gets its adapter (zero where the file has none), as a
  // loom finetune checkpoint holds them.
  std::map<std::string, const LinearAdapters*> by_linear;
  for (const auto& l : linears) by_linear[l.linear] = &l;
  for (int64_t i = 0; i < shape.num_layers; ++i)
    for (const auto& map : peft_module_maps(gpt2)) {
      if (!(targets & map.target)) continue;
      const std::string linear = fmt::format("layers.{}.{}", i, map.loom);
      const at::Tensor& w = base.params.at(linear + ".weight");
      at::Tensor a = at::zeros({R, w.size(1)}, w.options().dtype(at::kFloat));
      at::Tensor b = at::zeros({w.size(0), R}, w.options().dtype(at::kFloat));
      if (auto it = by_linear.find(linear); it != by_linear.end()) {
        const LinearAdapters& l = *it->second;
        for (size_t k = 0; k < l.distinct_a.size(); ++k) a.narrow(0, int64_t(k) * peft.r, peft.r).copy_(l.distinct_a[k]);
        const int64_t filled = int64_t(l.distinct_a.size()) * peft.r;
        b.narrow(1, 0, filled).copy_(mapped.at(linear + ".weight").narrow(1, 0, filled));
      }
      for (const auto& [name, t] : {std::pair{model::lora_a_name(linear), a}, std::pair{model::lora_b_name(linear), b}}) {
        const at::Tensor local = t.to(w.scalar_type());
        add_fresh_parameter(state, name, local, {{"global_shape", local.sizes().vec()}, {"offset", {0, 0}}});
      }
    }
  state.values = fresh_training_values();
  fs::create_directories(run);
  CheckpointWriter writer(checkpoints, 0, layout);
  writer.write_rank(0, 0, state);
  writer.commit();
  return result;
}

}  // namespace loom::convert
