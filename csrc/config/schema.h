// Internal: the recipe schema, written once. visit_recipe() calls `v(path, field, need)` for
// every field in dump order; the reader (tree -> Recipe), the writer (Recipe -> YAML) and the
// key index (known paths for unknown-key checks and suggestions) are visitors over it.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "config/recipe.h"

namespace loom::config::detail {

enum class Need {
  kRequired,  ///< must be present and non-null
  kDefault,   ///< absent: keep the struct's (NeMo) default
  kDerived,   ///< absent or null: computed by apply_derived_defaults()
};

/// model.data: pretraining corpora, fine-tuning's base, model.peft and JSONL datasets
/// (docs/design/finetune.md), or prompt learning's base, tasks and JSONL data.
template <class V>
void visit_model_data(ModelConfig& m, V& v, RecipeKind kind) {
  auto& d = m.data;
  if (kind == RecipeKind::kFinetuning) {
    v("model.restore_from_path", m.restore_from_path, Need::kRequired);
    auto& p = m.peft;
    v("model.peft.peft_scheme", p.peft_scheme, Need::kDefault);
    v("model.peft.lora_tuning.target_modules", p.lora_tuning.target_modules, Need::kDefault);
    v("model.peft.lora_tuning.adapter_dim", p.lora_tuning.adapter_dim, Need::kDefault);
    v("model.peft.lora_tuning.alpha", p.lora_tuning.alpha, Need::kDefault);
    v("model.peft.lora_tuning.adapter_dropout", p.lora_tuning.adapter_dropout, Need::kDefault);
    v("model.answer_only_loss", m.answer_only_loss, Need::kDefault);
    auto& t = d.sft_train;
    v("model.data.train_ds.file_names", t.file_names, Need::kRequired);
    v("model.data.train_ds.prompt_template", t.prompt_template, Need::kDefault);
    v("model.data.train_ds.label_key", t.label_key, Need::kDefault);
    v("model.data.train_ds.truncation_field", t.truncation_field, Need::kDefault);
    v("model.data.train_ds.truncation_method", t.truncation_method, Need::kDefault);
    v("model.data.train_ds.max_seq_length", t.max_seq_length, Need::kDefault);
    v("model.data.train_ds.add_bos", t.add_bos, Need::kDefault);
    v("model.data.train_ds.add_eos", t.add_eos, Need::kDefault);
    v("model.data.train_ds.packed_sequence", t.packed_sequence, Need::kDefault);
    v("model.data.train_ds.chat_template", t.chat_template, Need::kDefault);
    v("model.data.validation_ds.file_names", d.sft_validation.file_names, Need::kDefault);
    return;
  }
  if (kind == RecipeKind::kPretraining) {
    v("model.data.data_prefix", d.data_prefix, Need::kRequired);
    v("model.data.splits_string", d.splits_string, Need::kDefault);
    // Fine-tuning has no encoder_seq_length of its own (the base's shape is adopted).
    v("model.data.seq_length", d.seq_length, Need::kDerived);
    v("model.data.eod_mask_loss", d.eod_mask_loss, Need::kDefault);
    v("model.data.index_mapping_dir", d.index_mapping_dir, Need::kDefault);
    v("model.data.num_workers", d.num_workers, Need::kDefault);
  } else {
    auto& p = m.prompt;
    v("model.language_model_path", p.language_model_path, Need::kRequired);
    v("model.language_model_iteration", p.language_model_iteration, Need::kDefault);
    v("model.virtual_prompt_style", p.virtual_prompt_style, Need::kDefault);
    v("model.task_templates", p.task_templates, Need::kRequired);
    v("model.new_tasks", p.new_tasks, Need::kDerived);
    v("model.existing_tasks", p.existing_tasks, Need::kDefault);
    v("model.restore_path", p.restore_path, Need::kDefault);
    v("model.p_tuning.encoder_type", p.p_tuning.encoder_type, Need::kDefault);
    v("model.p_tuning.encoder_hidden", p.p_tuning.encoder_hidden, Need::kDefault);
    v("model.p_tuning.num_layers", p.p_tuning.num_layers, Need::kDefault);
    v("model.p_tuning.dropout", p.p_tuning.dropout, Need::kDefault);
    v("model.p_tuning.init_std", p.p_tuning.init_std, Need::kDefault);
    v("model.prompt_tuning.new_prompt_init_methods", p.prompt_tuning.new_prompt_init_methods, Need::kDefault);
    v("model.prompt_tuning.new_prompt_init_text", p.prompt_tuning.new_prompt_init_text, Need::kDefault);
    v("model.data.train_ds", d.train_ds, Need::kRequired);
    v("model.data.validation_ds", d.validation_ds, Need::kDefault);
    v("model.data.test_ds", d.test_ds, Need::kDefault);
    v("model.data.add_bos", d.add_bos, Need::kDefault);
    v("model.data.add_eos", d.add_eos, Need::kDefault);
    v("model.data.max_seq_length", d.max_seq_length, Need::kDefault);
  }

}

/// model.tokenizer and model.optim.
template <class V>
void visit_model_tokenizer_and_optim(ModelConfig& m, V& v, bool pretraining) {
  // Prompt learning reads the tokenizer of the base's run unless the recipe names one.
  auto& k = m.tokenizer;
  v("model.tokenizer.library", k.library, Need::kDefault);
  // The GPT-2 files are required of the megatron library only (read before them: the visitor
  // goes in this order).
  const Need files = pretraining && k.library == TokenizerLibrary::kMegatron ? Need::kRequired : Need::kDefault;
  v("model.tokenizer.type", k.type, Need::kDefault);
  v("model.tokenizer.model", k.model, Need::kDefault);
  v("model.tokenizer.vocab_file", k.vocab_file, files);
  v("model.tokenizer.merge_file", k.merge_file, files);

  auto& o = m.optim;
  v("model.optim.name", o.name, Need::kDefault);
  v("model.optim.lr", o.lr, Need::kRequired);
  v("model.optim.weight_decay", o.weight_decay, Need::kDefault);
  v("model.optim.betas", o.betas, Need::kDefault);
  v("model.optim.eps", o.eps, Need::kDefault);
  v("model.optim.sched.name", o.sched.name, Need::kDefault);
  v("model.optim.sched.warmup_steps", o.sched.warmup_steps, Need::kDefault);
  v("model.optim.sched.constant_steps", o.sched.constant_steps, Need::kDefault);
  v("model.optim.sched.min_lr", o.sched.min_lr, Need::kDefault);
  v("model.optim.sched.max_steps", o.sched.max_steps, Need::kDerived);
  v("model.optim.overlap_grad_sync", o.overlap_grad_sync, Need::kDefault);
  v("model.optim.overlap_param_sync", o.overlap_param_sync, Need::kDefault);
  v("model.optim.ddp_bucket_size", o.ddp_bucket_size, Need::kDefault);
}

/// The model section in dump order. Pretraining recipes hold the model's shape and their data;
/// prompt-learning recipes (docs/design/ptuning.md; NeMo's megatron_gpt_prompt_learning_config
/// keys) take the shape from the base checkpoint and hold the base, the tasks and JSONL data;
/// fine-tuning recipes (docs/design/lora.md; NeMo's megatron_gpt_finetuning_config keys) take
/// the shape from the base and hold the base, model.peft and their data.
template <class V>
void visit_model(ModelConfig& m, V& v, RecipeKind kind) {
  const bool pretraining = kind == RecipeKind::kPretraining;
  v("model.micro_batch_size", m.micro_batch_size, Need::kRequired);
  v("model.global_batch_size", m.global_batch_size, Need::kRequired);
  v("model.tensor_model_parallel_size", m.tensor_model_parallel_size, Need::kDefault);
  v("model.pipeline_model_parallel_size", m.pipeline_model_parallel_size, Need::kDefault);
  v("model.virtual_pipeline_model_parallel_size", m.virtual_pipeline_model_parallel_size, Need::kDefault);
  v("model.num_layers_in_first_pipeline_stage", m.num_layers_in_first_pipeline_stage, Need::kDefault);
  v("model.num_layers_in_last_pipeline_stage", m.num_layers_in_last_pipeline_stage, Need::kDefault);
  v("model.sequence_parallel", m.sequence_parallel, Need::kDefault);
  if (pretraining) {
    v("model.encoder_seq_length", m.encoder_seq_length, Need::kRequired);
    v("model.max_position_embeddings", m.max_position_embeddings, Need::kDerived);
    v("model.num_layers", m.num_layers, Need::kRequired);
    v("model.hidden_size", m.hidden_size, Need::kRequired);
    v("model.ffn_hidden_size", m.ffn_hidden_size, Need::kDerived);
    v("model.num_attention_heads", m.num_attention_heads, Need::kRequired);
    v("model.init_method_std", m.init_method_std, Need::kDefault);
    v("model.hidden_dropout", m.hidden_dropout, Need::kDefault);
    v("model.attention_dropout", m.attention_dropout, Need::kDefault);
    v("model.use_flash_attention", m.use_flash_attention, Need::kDefault);
    v("model.persist_layer_norm", m.persist_layer_norm, Need::kDefault);
    v("model.bias_activation_fusion", m.bias_activation_fusion, Need::kDefault);
    v("model.apply_rope_fusion", m.apply_rope_fusion, Need::kDefault);
    v("model.ffn_dropout", m.ffn_dropout, Need::kDefault);
    v("model.layernorm_epsilon", m.layernorm_epsilon, Need::kDefault);
    v("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by, Need::kDefault);
  }
  v("model.activations_checkpoint_granularity", m.activations_checkpoint_granularity, Need::kDefault);
  v("model.activations_checkpoint_method", m.activations_checkpoint_method, Need::kDefault);
  v("model.activations_checkpoint_num_layers", m.activations_checkpoint_num_layers, Need::kDefault);
  v("model.seed", m.seed, Need::kDefault);
  if (pretraining) v("model.label_smoothing", m.label_smoothing, Need::kDefault);
  v("model.use_distributed_optimizer", m.use_distributed_optimizer, Need::kDerived);
  v("model.collective_timeout_s", m.collective_timeout_s, Need::kDefault);
  if (pretraining) {
    // The decoder's architecture (docs/design/llama.md), after the GPT fields: "did you mean"
    // suggestions that tie keep preferring the older keys, which come first.
    v("model.normalization", m.normalization, Need::kDefault);
    v("model.position_embedding_type", m.position_embedding_type, Need::kDefault);
    v("model.rotary_base", m.rotary_base, Need::kDefault);
    v("model.rotary_percentage", m.rotary_percentage, Need::kDefault);
    v("model.rope_scaling", m.rope_scaling, Need::kDefault);
    v("model.rope_scaling_factor", m.rope_scaling_factor, Need::kDefault);
    v("model.low_freq_factor", m.low_freq_factor, Need::kDefault);
    v("model.high_freq_factor", m.high_freq_factor, Need::kDefault);
    v("model.old_context_len", m.old_context_len, Need::kDefault);
    v("model.kv_channels", m.kv_channels, Need::kDefault);
    v("model.activation", m.activation, Need::kDefault);
    v("model.num_query_groups", m.num_query_groups, Need::kDefault);
    v("model.bias", m.bias, Need::kDefault);
    v("model.qkv_bias", m.qkv_bias, Need::kDefault);
    v("model.share_embeddings_and_output_weights", m.share_embeddings_and_output_weights, Need::kDefault);
  }

  visit_model_data(m, v, kind);
  visit_model_tokenizer_and_optim(m, v, pretraining);
}

template <class V>
void visit_recipe(Recipe& r, V& v) {
  v("run.name", r.run.name, Need::kDefault);
  v("run.results_dir", r.run.results_dir, Need::kDefault);
  v("run.time_limit", r.run.time_limit, Need::kDefault);

  auto& t = r.trainer;
  v("trainer.num_nodes", t.num_nodes, Need::kDefault);
  v("trainer.devices", t.devices, Need::kDefault);
  v("trainer.accelerator", t.accelerator, Need::kDefault);
  v("trainer.precision", t.precision, Need::kDefault);
  v("trainer.max_steps", t.max_steps, Need::kRequired);
  v("trainer.max_time", t.max_time, Need::kDefault);
  v("trainer.log_every_n_steps", t.log_every_n_steps, Need::kDefault);
  v("trainer.val_check_interval", t.val_check_interval, Need::kDefault);
  v("trainer.limit_val_batches", t.limit_val_batches, Need::kDefault);
  v("trainer.gradient_clip_val", t.gradient_clip_val, Need::kDefault);

  auto& e = r.exp_manager;
  v("exp_manager.explicit_log_dir", e.explicit_log_dir, Need::kDefault);
  v("exp_manager.exp_dir", e.exp_dir, Need::kDefault);
  v("exp_manager.name", e.name, Need::kDefault);
  v("exp_manager.resume_if_exists", e.resume_if_exists, Need::kDefault);
  v("exp_manager.create_checkpoint_callback", e.create_checkpoint_callback, Need::kDefault);
  v("exp_manager.checkpoint_callback_params.every_n_steps", e.checkpoint_callback_params.every_n_steps,
    Need::kDerived);
  v("exp_manager.checkpoint_callback_params.save_last", e.checkpoint_callback_params.save_last, Need::kDefault);

  visit_model(r.model, v, r.kind);

  auto& c = r.cluster;
  v("cluster.partition", c.partition, Need::kDefault);
  v("cluster.account", c.account, Need::kDefault);
  v("cluster.job_name_prefix", c.job_name_prefix, Need::kDefault);
  v("cluster.gpus_per_node", c.gpus_per_node, Need::kDerived);
  v("cluster.exclusive", c.exclusive, Need::kDefault);
  v("cluster.container_image", c.container_image, Need::kDefault);
  v("cluster.container_mounts", c.container_mounts, Need::kDefault);
  v("cluster.gpu", c.gpu, Need::kDefault);
}

/// Every key the schema knows: field paths ("model.hidden_size"), section paths ("model",
/// "model.optim.sched") and each section's child names ("" is the document root).
struct KeyIndex {
  std::set<std::string> fields;
  std::set<std::string> sections;
  std::map<std::string, std::vector<std::string>> children;
  std::map<std::string, Need> need;
};
/// The keys of a recipe of `kind`.
const KeyIndex& key_index(RecipeKind kind = RecipeKind::kPretraining);

/// For an unknown key path: " (did you mean 'x.y'?)" naming the known field or section with the
/// same last name elsewhere, else the closest sibling by edit distance; empty if none.
std::string suggest_key(const std::string& unknown_path, RecipeKind kind = RecipeKind::kPretraining);

/// Accepted alternative spellings of keys: alias path -> canonical path.
const std::vector<std::pair<std::string, std::string>>& key_aliases();

/// Spellings of an enum: value -> names; the first name is the canonical (dumped) one.
/// A value whose first name is "null" is the enum's null.
template <class E>
struct EnumSpelling {
  E value;
  std::vector<std::string> names;
};
template <class E>
const std::vector<EnumSpelling<E>>& enum_spellings();
template <>
const std::vector<EnumSpelling<Accelerator>>& enum_spellings<Accelerator>();
template <>
const std::vector<EnumSpelling<Precision>>& enum_spellings<Precision>();
template <>
const std::vector<EnumSpelling<RecomputeGranularity>>& enum_spellings<RecomputeGranularity>();
template <>
const std::vector<EnumSpelling<RecomputeMethod>>& enum_spellings<RecomputeMethod>();
template <>
const std::vector<EnumSpelling<OptimizerName>>& enum_spellings<OptimizerName>();
template <>
const std::vector<EnumSpelling<SchedulerName>>& enum_spellings<SchedulerName>();
template <>
const std::vector<EnumSpelling<TokenizerLibrary>>& enum_spellings<TokenizerLibrary>();
template <>
const std::vector<EnumSpelling<VirtualPromptStyle>>& enum_spellings<VirtualPromptStyle>();
template <>
const std::vector<EnumSpelling<Normalization>>& enum_spellings<Normalization>();
template <>
const std::vector<EnumSpelling<PositionEmbedding>>& enum_spellings<PositionEmbedding>();
template <>
const std::vector<EnumSpelling<Activation>>& enum_spellings<Activation>();
template <>
const std::vector<EnumSpelling<PromptEncoderType>>& enum_spellings<PromptEncoderType>();
template <>
const std::vector<EnumSpelling<PromptInitMethod>>& enum_spellings<PromptInitMethod>();

/// Canonical name of an enum value (as dumped).
template <class E>
std::string enum_name(E value) {
  for (const auto& s : enum_spellings<E>())
    if (s.value == value) return s.names.front();
  return "?";
}

}  // namespace loom::config::detail
