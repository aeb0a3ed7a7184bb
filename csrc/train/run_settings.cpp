#include "train/run_settings.h"

#include <fmt/format.h>

#include <algorithm>

#include "config/derived.h"
#include "data/recipe_tokenizer.h"

namespace loom::train {

optim::OptimizerOptions optimizer_options(const config::Recipe& r) {
  optim::OptimizerOptions o;
  o.adamw.beta1 = r.model.optim.betas[0];
  o.adamw.beta2 = r.model.optim.betas[1];
  o.adamw.eps = r.model.optim.eps;
  o.adamw.weight_decay = r.model.optim.weight_decay;
  o.distributed = config::uses_distributed_optimizer(r);
  o.clip_grad = r.trainer.gradient_clip_val;
  o.overlap_grad_reduce = r.model.optim.overlap_grad_sync;
  o.overlap_param_gather = r.model.optim.overlap_param_sync && o.distributed;
  // NeMo's fused_adam / distributed_fused_adam are apex's multi-tensor kernels; adam / adamw
  // keep the per-tensor update (torch.optim.AdamW's operation order, bit for bit).
  o.fused_adamw = r.model.optim.name == config::OptimizerName::kFusedAdam ||
                  r.model.optim.name == config::OptimizerName::kDistributedFusedAdam;
  // Megatron-Core's bucket_size counts parameters: default max(40M, 1M · d); fp32 gradients.
  const int64_t bucket_numel = r.model.optim.ddp_bucket_size.value_or(
      std::max<int64_t>(40'000'000, 1'000'000 * config::data_parallel_size(r)));
  o.bucket_bytes = 4 * bucket_numel;
  return o;
}

optim::LrScheduleConfig lr_schedule_config(const config::Recipe& r) {
  const auto& sched = r.model.optim.sched;
  optim::LrScheduleConfig c;
  c.lr = r.model.optim.lr;
  c.min_lr = sched.min_lr;
  c.warmup_steps = sched.warmup_steps;
  c.constant_steps = sched.constant_steps;
  c.max_steps = sched.max_steps > 0 ? sched.max_steps : r.trainer.max_steps;
  c.max_steps = std::max(c.max_steps, c.warmup_steps + c.constant_steps);
  switch (sched.name) {
    case config::SchedulerName::kCosineAnnealing: c.decay = optim::LrDecay::kCosine; break;
    case config::SchedulerName::kLinearDecay: c.decay = optim::LrDecay::kLinear; break;
    case config::SchedulerName::kConstant: c.decay = optim::LrDecay::kConstant; break;
  }
  return c;
}

data::GptDataConfig gpt_data_config(const config::Recipe& r, int64_t train_samples,
                                    int64_t valid_samples, const std::string& default_cache_dir) {
  data::GptDataConfig c;
  const auto& blend = r.model.data.data_prefix;
  if (blend.size() == 1) {
    c.data_prefix = {blend[0].path};
  } else {
    for (const auto& e : blend) {
      c.data_prefix.push_back(fmt::format("{}", e.weight));
      c.data_prefix.push_back(e.path);
    }
  }
  c.splits_string = r.model.data.splits_string;
  c.seq_length = r.model.data.seq_length;
  c.seed = static_cast<uint32_t>(r.model.seed);
  c.num_samples = {train_samples, valid_samples, std::nullopt};
  c.eod_mask_loss = r.model.data.eod_mask_loss;
  c.index_cache_dir = r.model.data.index_mapping_dir.value_or(default_cache_dir);
  c.vocab_size = data::recipe_vocab_size(r.model.tokenizer);  // the model's vocabulary follows the tokenizer
  return c;
}

}  // namespace loom::train
