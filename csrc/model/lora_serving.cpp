#include "model/lora_serving.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>

namespace loom::model {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The global layer of "layers.N.<...>", or -1.
int layer_of(const std::string& linear) {
  const std::string prefix = "layers.";
  if (linear.rfind(prefix, 0) != 0) return -1;
  const size_t dot = linear.find('.', prefix.size());
  try {
    return dot == std::string::npos ? -1 : std::stoi(linear.substr(prefix.size(), dot - prefix.size()));
  } catch (const std::exception&) {
    return -1;
  }
}

// y (its [tokens, features] view) += update(x rows) on each group's tokens.
template <typename Update>
at::Tensor add_updates(const LoraBatch& batch, const std::string& linear, const at::Tensor& x, at::Tensor y,
                       Update update) {
  const auto* adapters = batch.bank->adapters(linear);
  if (adapters == nullptr) return y;
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  at::Tensor y2 = y.view({-1, y.size(-1)});
  for (size_t g = 0; g < batch.adapter.size(); ++g) {
    const auto& adapter = (*adapters)[static_cast<size_t>(batch.adapter[g])];
    if (!adapter) continue;
    const at::Tensor& rows = batch.tokens[g];
    const at::Tensor u = update(*adapter, x2.index_select(0, rows).unsqueeze(1));  // [m, 1, out(/t)]
    y2.index_add_(0, rows, u.squeeze(1).to(y2.scalar_type()));
  }
  return y;
}

}  // namespace

LoraBase lora_base_of(const std::string& linear_name) {
  if (ends_with(linear_name, ".linear_qkv") || ends_with(linear_name, ".linear_fc1")) return LoraBase::kColumnParallel;
  if (ends_with(linear_name, ".linear_proj") || ends_with(linear_name, ".linear_fc2")) return LoraBase::kRowParallel;
  throw std::invalid_argument("LoRA adapter on '" + linear_name +
                              "': expected a linear_qkv, linear_proj, linear_fc1 or linear_fc2 of a layer");
}

LoraBank::LoraBank(int first_layer, int num_layers, runtime::CommunicatorPtr tp, at::TensorOptions options)
    : first_layer_(first_layer), num_layers_(num_layers), tp_(std::move(tp)), options_(options) {}

void LoraBank::add(const std::map<std::string, at::Tensor>& full, const LoraConfig& config, const std::string& what) {
  const std::string a_suffix = ".lora_a.weight", b_suffix = ".lora_b.weight";
  int adapted = 0;
  for (const auto& [name, tensor] : full) {
    if (ends_with(name, b_suffix)) {
      const std::string linear = name.substr(0, name.size() - b_suffix.size());
      if (!full.count(lora_a_name(linear)))
        throw std::invalid_argument(fmt::format("{}: {} has no {}", what, name, lora_a_name(linear)));
      continue;
    }
    if (!ends_with(name, a_suffix))
      throw std::invalid_argument(fmt::format("{}: {} is not a LoRA adapter tensor (expected *{} and *{})", what, name,
                                              a_suffix, b_suffix));
    const std::string linear = name.substr(0, name.size() - a_suffix.size());
    const auto b = full.find(lora_b_name(linear));
    if (b == full.end()) throw std::invalid_argument(fmt::format("{}: {} has no {}", what, name, lora_b_name(linear)));
    const at::Tensor& a = tensor;
    if (a.dim() != 2 || b->second.dim() != 2 || a.size(0) != config.dim || b->second.size(1) != config.dim)
      throw std::invalid_argument(fmt::format("{}: {} {} and {} {} do not have the recorded rank {}", what, name,
                                              c10::str(a.sizes()), b->first, c10::str(b->second.sizes()), config.dim));
    LoraBase base;
    try {
      base = lora_base_of(linear);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(what + ": " + e.what());
    }
    ++adapted;
    const int layer = layer_of(linear);
    if (layer < first_layer_ || layer >= first_layer_ + num_layers_) continue;  // another stage's
    auto& list = by_linear_[linear];
    list.resize(static_cast<size_t>(count_ + 1));
    list.back() = std::make_shared<const LoraAdapter>(linear, base, a, b->second, config.scale(), tp_, options_);
  }
  if (adapted == 0) throw std::invalid_argument(what + ": the checkpoint holds no LoRA adapters");
  ++count_;
  for (auto& [linear, list] : by_linear_) list.resize(static_cast<size_t>(count_));
}

const std::vector<std::shared_ptr<const LoraAdapter>>* LoraBank::adapters(const std::string& linear) const {
  const auto it = by_linear_.find(linear);
  return it == by_linear_.end() ? nullptr : &it->second;
}

at::Tensor LoraBatch::add_column_updates(const std::string& linear, const at::Tensor& x, at::Tensor y) const {
  return add_updates(*this, linear, x, std::move(y),
                     [](const LoraAdapter& a, const at::Tensor& rows) { return a.column_update(rows, nullptr); });
}

at::Tensor LoraBatch::add_row_partial_updates(const std::string& linear, const at::Tensor& x,
                                              at::Tensor partial) const {
  return add_updates(*this, linear, x, std::move(partial),
                     [](const LoraAdapter& a, const at::Tensor& rows) { return a.row_partial_update(rows, nullptr); });
}

}  // namespace loom::model
