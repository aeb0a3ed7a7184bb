// Where one task's virtual tokens come from (docs/design/ptuning.md, "The model"):
//   prompt tuning       a [n, h] table, trained directly (from an init text's embeddings, or
//                       normal(init_std));
//   p-tuning embedding  the same table (xavier-normal init);
//   p-tuning mlp        an input table [n, h] -> Linear(h, H), ReLU, (Linear(H, H), ReLU)...,
//                       Linear(H, h): num_layers linears, at least 2;
//   p-tuning lstm       the input table -> bidirectional LSTM (h -> H, num_layers layers)
//                       -> Linear(2H, 2H), ReLU, Linear(2H, h);
//   p-tuning tpmlp      the input table -> column-parallel Linear(h, H) (normal(init_std)),
//                       bias-GeLU, row-parallel Linear(H, h) over the tensor-parallel group.
// Every encoder is replicated on the tensor ranks of the first pipeline stage (tpmlp's two
// linears are split over them) and computes the same [n, h] on every rank. Initial values are
// drawn on the host from (seed, parameter name), so every layout starts from the same prompt.
// Parameters are float32 whatever the model's dtype (they are few; the splice converts).
// `p_tuning.dropout` drops elements of the encoder's input table during training, with Loom's
// layout-independent dropout masks keyed by (seed, step).
#pragma once
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "config/recipe.h"
#include "model/parallel_linear.h"
#include "model/parameter.h"
#include "runtime/communicator.h"

namespace loom::ptune {

struct PromptEncoderOptions {
  std::string task;                 ///< names the parameters: "prompt.<task>.*"
  int64_t tokens = 1;               ///< n: the task's total_virtual_tokens
  int64_t hidden = 1;               ///< h: the base model's hidden size
  config::VirtualPromptStyle style = config::VirtualPromptStyle::kPTuning;
  config::PTuningConfig p_tuning;   ///< encoder type, H (default h / 2), layers, dropout, init
  /// Prompt tuning: the starting table [n, h] (an init text's frozen embeddings); undefined:
  /// normal(p_tuning.init_std).
  at::Tensor initial_table;
  uint64_t seed = 1234;
  at::Device device = at::kCPU;
};

class PromptEncoder {
 public:
  /// Builds the parameters on `tp`'s ranks (tpmlp splits over them). Throws
  /// std::invalid_argument for sizes < 1, an mlp with fewer than 2 layers, an initial table of
  /// the wrong shape, or a tpmlp whose H is not divisible by the tensor-parallel size.
  PromptEncoder(const PromptEncoderOptions& options, runtime::CommunicatorPtr tp);
  ~PromptEncoder();
  PromptEncoder(PromptEncoder&&) noexcept;

  /// The task's virtual tokens [n, h], float32 on the device; `training` applies the dropout
  /// with masks keyed by `step`.
  at::Tensor forward(bool training, uint64_t step) const;

  /// The trainable parameters with their parallel attributes, in a fixed order.
  model::ParamList parameters() const;
  const PromptEncoderOptions& options() const { return options_; }
  int64_t num_parameters() const;

 private:
  at::Tensor encode(const at::Tensor& input) const;
  // The constructor's parts: the prompt-tuning table, and each p-tuning encoder's parameters.
  void init_prompt_tuning_table();
  void add_linear(const std::string& name, int64_t out, int64_t in);
  void init_mlp();
  void init_lstm();
  void init_tpmlp();
  std::string name_prefix() const { return "prompt." + options_.task + "."; }
  PromptEncoderOptions options_;
  runtime::CommunicatorPtr tp_;
  int64_t encoder_hidden_ = 0;
  at::Tensor table_;                          ///< the table (embedding) or the encoder's input
  std::vector<at::Tensor> mlp_w_, mlp_b_;     ///< mlp, and lstm's head
  std::vector<at::Tensor> lstm_params_;       ///< per layer, per direction: w_ih, w_hh, b_ih, b_hh
  std::unique_ptr<model::ColumnParallelLinear> tp_in_;
  std::unique_ptr<model::RowParallelLinear> tp_out_;
};

}  // namespace loom::ptune
