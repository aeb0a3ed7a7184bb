#include "ptune/prompt_encoder.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "loom_ops/ops.h"
#include "model/init.h"

namespace loom::ptune {
namespace {

using config::PromptEncoderType;

// FNV-1a of the task name: the encoder dropout of each task draws its own masks.
uint64_t task_hash(const std::string& task) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : task) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The dropout layer id of prompt encoders: above any transformer layer (< 2^16).
constexpr int64_t kPromptDropoutLayer = 0xFFFF;

}  // namespace

PromptEncoder::PromptEncoder(const PromptEncoderOptions& options, runtime::CommunicatorPtr tp)
    : options_(options), tp_(std::move(tp)) {
  const auto& o = options_;
  const auto& pt = o.p_tuning;
  if (o.tokens < 1 || o.hidden < 1)
    throw std::invalid_argument(fmt::format("prompt encoder of task '{}': expected tokens and hidden >= 1, found {} and {}",
                                            o.task, o.tokens, o.hidden));
  encoder_hidden_ = pt.encoder_hidden.value_or(std::max<int64_t>(1, o.hidden / 2));
  if (o.style == config::VirtualPromptStyle::kPromptTuning) {
    init_prompt_tuning_table();
    return;
  }
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(o.device);
  const int64_t n = o.tokens, h = o.hidden;
  if (pt.encoder_type == PromptEncoderType::kEmbedding) {
    // Xavier-normal: std = sqrt(2 / (fan_in + fan_out)).
    table_ = model::make_parameter(model::full_normal(o.seed, name_prefix() + "table", {n, h}, std::sqrt(2.0 / double(n + h))),
                                   opts);
    return;
  }
  // The encoders' input table starts as torch.nn.Embedding does: N(0, 1).
  table_ = model::make_parameter(model::full_normal(o.seed, name_prefix() + "input", {n, h}, 1.0), opts);
  switch (pt.encoder_type) {
    case PromptEncoderType::kMlp: init_mlp(); break;
    case PromptEncoderType::kLstm: init_lstm(); break;
    case PromptEncoderType::kTpMlp: init_tpmlp(); break;
    case PromptEncoderType::kEmbedding: break;
  }
}

void PromptEncoder::init_prompt_tuning_table() {
  const auto& o = options_;
  const int64_t n = o.tokens, h = o.hidden;
  at::Tensor init = o.initial_table;
  if (init.defined()) {
    if (init.dim() != 2 || init.size(0) != n || init.size(1) != h)
      throw std::invalid_argument(fmt::format("prompt tuning of task '{}': the initial table must be [{}, {}]",
                                              o.task, n, h));
  } else {
    init = model::full_normal(o.seed, name_prefix() + "table", {n, h}, o.p_tuning.init_std);
  }
  table_ = model::make_parameter(init.to(at::kFloat), at::TensorOptions().dtype(at::kFloat).device(o.device));
}

// PyTorch's default init of Linear and LSTM: U(-1/sqrt(fan), 1/sqrt(fan)).
void PromptEncoder::add_linear(const std::string& name, int64_t out, int64_t in) {
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(options_.device);
  const double bound = 1.0 / std::sqrt(double(in));
  mlp_w_.push_back(model::make_parameter(model::full_uniform(options_.seed, name + ".weight", {out, in}, -bound, bound), opts));
  mlp_b_.push_back(model::make_parameter(model::full_uniform(options_.seed, name + ".bias", {out}, -bound, bound), opts));
}

void PromptEncoder::init_mlp() {
  const auto& pt = options_.p_tuning;
  const int64_t h = options_.hidden, H = encoder_hidden_;
  if (pt.num_layers < 2)
    throw std::invalid_argument(fmt::format("model.p_tuning.num_layers: an mlp encoder needs at least 2 layers, found {}",
                                            pt.num_layers));
  for (int64_t i = 0; i < pt.num_layers; ++i) {
    const int64_t in = i == 0 ? h : H, out = i + 1 == pt.num_layers ? h : H;
    add_linear(fmt::format("{}mlp.{}", name_prefix(), i), out, in);
  }
}

void PromptEncoder::init_lstm() {
  const auto& pt = options_.p_tuning;
  const int64_t h = options_.hidden, H = encoder_hidden_;
  if (pt.num_layers < 1)
    throw std::invalid_argument(fmt::format("model.p_tuning.num_layers: an lstm encoder needs at least 1 layer, found {}",
                                            pt.num_layers));
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(options_.device);
  const double bound = 1.0 / std::sqrt(double(H));
  for (int64_t layer = 0; layer < pt.num_layers; ++layer) {
    const int64_t in = layer == 0 ? h : 2 * H;
    for (const char* dir : {"forward", "reverse"}) {
      const std::string name = fmt::format("{}lstm.{}.{}.", name_prefix(), layer, dir);
      for (auto [what, shape] : std::vector<std::pair<const char*, std::vector<int64_t>>>{
               {"w_ih", {4 * H, in}}, {"w_hh", {4 * H, H}}, {"b_ih", {4 * H}}, {"b_hh", {4 * H}}})
        lstm_params_.push_back(
            model::make_parameter(model::full_uniform(options_.seed, name + what, shape, -bound, bound), opts));
    }
  }
  add_linear(name_prefix() + "head.0", 2 * H, 2 * H);
  add_linear(name_prefix() + "head.1", h, 2 * H);
}

void PromptEncoder::init_tpmlp() {
  const auto& o = options_;
  const int64_t h = o.hidden, H = encoder_hidden_;
  if (H % tp_->size() != 0)
    throw std::invalid_argument(fmt::format("model.p_tuning.encoder_hidden: a tpmlp encoder needs H = {} divisible by "
                                            "the tensor-parallel size {}", H, tp_->size()));
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(o.device);
  const std::string base = name_prefix();
  tp_in_ = std::make_unique<model::ColumnParallelLinear>(
      base + "tpmlp.first", model::full_normal(o.seed, base + "tpmlp.first.weight", {H, h}, o.p_tuning.init_std),
      // host: full initial values; the layer slices them and places its shard on the device
      at::zeros({H}), tp_, /*sequence_parallel=*/false, opts);
  tp_out_ = std::make_unique<model::RowParallelLinear>(
      base + "tpmlp.second", model::full_normal(o.seed, base + "tpmlp.second.weight", {h, H}, o.p_tuning.init_std),
      // host: full initial values, as above
      at::zeros({h}), tp_, /*sequence_parallel=*/false, opts);
}

PromptEncoder::~PromptEncoder() = default;
PromptEncoder::PromptEncoder(PromptEncoder&&) noexcept = default;

at::Tensor PromptEncoder::forward(bool training, uint64_t step) const {
  at::Tensor input = table_;
  const double p = options_.p_tuning.dropout;
  const bool encoder = options_.style == config::VirtualPromptStyle::kPTuning;
  if (training && encoder && p > 0) {
    ops::DropoutSpec spec;
    spec.p = p;
    spec.key.seed = options_.seed ^ task_hash(options_.task);
    spec.key.stream = ops::make_dropout_stream(step, kPromptDropoutLayer, 0);
    input = ops::dropout(input, spec);
  }
  return encode(input);
}

at::Tensor PromptEncoder::encode(const at::Tensor& input) const {
  if (options_.style == config::VirtualPromptStyle::kPromptTuning) return input;
  auto mlp = [&](at::Tensor x, size_t first) {
    for (size_t i = first; i < mlp_w_.size(); ++i) {
      x = at::linear(x, mlp_w_[i], mlp_b_[i]);
      if (i + 1 < mlp_w_.size()) x = at::relu(x);
    }
    return x;
  };
  switch (options_.p_tuning.encoder_type) {
    case PromptEncoderType::kEmbedding:
      return input;
    case PromptEncoderType::kMlp:
      return mlp(input, 0);
    case PromptEncoderType::kLstm: {
      // [n, 1, h] as a sequence of n steps, batch 1; zero initial states.
      const int64_t layers = options_.p_tuning.num_layers, H = encoder_hidden_;
      at::Tensor h0 = at::zeros({2 * layers, 1, H}, input.options());
      auto out = at::lstm(input.unsqueeze(1), {h0, h0}, lstm_params_, /*has_biases=*/true, layers,
                          /*dropout=*/0.0, /*train=*/false, /*bidirectional=*/true, /*batch_first=*/false);
      return mlp(std::get<0>(out).squeeze(1), 0);
    }
    case PromptEncoderType::kTpMlp: {
      // Column-parallel on the replicated [n, 1, h], bias-GeLU, row-parallel back to [n, 1, h].
      at::Tensor x = tp_in_->forward(input.unsqueeze(1), /*skip_bias_add=*/true);
      x = ops::bias_gelu(x, tp_in_->bias());
      auto [y, bias] = tp_out_->forward(x);
      return (y + bias).squeeze(1);
    }
  }
  throw std::logic_error("PromptEncoder: unknown encoder type");
}

model::ParamList PromptEncoder::parameters() const {
  model::ParamList out;
  const std::string base = "prompt." + options_.task + ".";
  const bool tuning = options_.style == config::VirtualPromptStyle::kPromptTuning;
  const auto type = options_.p_tuning.encoder_type;
  model::Param table{base + (tuning || type == PromptEncoderType::kEmbedding ? "table" : "input"), table_};
  out.push_back(table);
  if (type == PromptEncoderType::kLstm && !tuning) {
    const int64_t layers = options_.p_tuning.num_layers;
    size_t k = 0;
    for (int64_t layer = 0; layer < layers; ++layer)
      for (const char* dir : {"forward", "reverse"})
        for (const char* what : {"w_ih", "w_hh", "b_ih", "b_hh"}) {
          out.push_back({fmt::format("{}lstm.{}.{}.{}", base, layer, dir, what), lstm_params_[k++]});
        }
  }
  for (size_t i = 0; i < mlp_w_.size(); ++i) {
    const std::string name = type == PromptEncoderType::kLstm ? fmt::format("{}head.{}", base, i)
                                                              : fmt::format("{}mlp.{}", base, i);
    out.push_back({name + ".weight", mlp_w_[i]});
    out.push_back({name + ".bias", mlp_b_[i]});
  }
  // The encoder's own parameters decay as Megatron's matrices do; its biases do not (the
  // tensor-parallel layers below say so themselves).
  for (auto& p : out) p.weight_decay = p.tensor.dim() > 1;
  if (tp_in_) tp_in_->collect(out);
  if (tp_out_) tp_out_->collect(out);
  return out;
}

int64_t PromptEncoder::num_parameters() const {
  int64_t count = 0;
  for (const auto& p : parameters()) count += p.tensor.numel() * (p.tensor_parallel() ? tp_->size() : 1);
  return count;
}

}  // namespace loom::ptune
