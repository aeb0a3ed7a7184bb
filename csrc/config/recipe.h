// Loom training recipes: the typed form of a NeMo-Megatron-style GPT YAML file.
//
// Sections and field names follow NeMo's `megatron_gpt_config.yaml` and the NeMo Framework
// Launcher's GPT-3 training configs (run, trainer, exp_manager, model{data,tokenizer,optim},
// cluster). Every field below is marked
//   [required]   the recipe must set it;
//   [default]    the initialiser (NeMo's value where NeMo has the key) when the key is absent;
//   [derived]    absent or null means "computed from other fields" (stated per field).
// Nullable fields (std::optional, or an enum with a kNone member) accept `null`.
// recipes/README.md's field table is generated from these (loom recipe-fields); checks: validate.h.
//
// Paths in a recipe (data_prefix, vocab_file, merge_file, log dirs) are kept exactly as
// written: a relative path is relative to the process's working directory (Loom is run from
// the repository root, so `data/gpt2-vocab.json` means <repo>/data/gpt2-vocab.json).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "rules/layout_terms.h"
#include "rules/model_shape.h"

namespace loom::config {

enum class Accelerator { kCpu, kGpu };
/// trainer.precision (accepted spellings: 32, "32-true"; bf16, "bf16-mixed"; 16, "16-mixed"),
/// model.activations_checkpoint_granularity and _method: the one vocabulary the recipe, the
/// model and the planner share (rules/layout_terms.h).
using loom::Activation;
using loom::Normalization;
using loom::PositionEmbedding;
using loom::Precision;
using loom::RecomputeGranularity;
using loom::RecomputeMethod;
/// model.optim.name. Every name is AdamW (decoupled weight decay, train/optim/adamw.h) on fp32
/// main parameters: fused_adam and adamw as NeMo's FusedAdam in its default adam_w_mode, and
/// `adam` too (Loom has no torch.optim.Adam with its L2 penalty added to the gradient).
/// distributed_fused_adam additionally shards optimizer state over data-parallel ranks.
enum class OptimizerName { kAdam, kFusedAdam, kDistributedFusedAdam, kAdamW };
/// model.optim.sched.name. CosineAnnealing (NeMo): linear warm-up, cosine decay to min_lr,
/// then min_lr for the last constant_steps. LinearDecay (alias NeMo's WarmupAnnealing):
/// linear warm-up then linear decay to min_lr. Constant (alias WarmupPolicy): warm-up, then lr.
enum class SchedulerName { kCosineAnnealing, kLinearDecay, kConstant };
/// model.tokenizer.library as NeMo spells it: megatron (GPT-2 BPE vocab + merges),
/// sentencepiece (a .model file), huggingface (a tokenizer.json byte-level BPE).
enum class TokenizerLibrary { kMegatron, kSentencePiece, kHuggingFace };
/// What a recipe describes: pretraining a GPT (`loom train`), prompt learning on a frozen
/// one (`loom ptune`, docs/design/ptuning.md) or fine-tuning a pretrained one (`loom finetune`,
/// docs/design/lora.md). The kind decides which keys the recipe has.
enum class RecipeKind { kPretraining, kPromptLearning, kFinetuning };
/// model.virtual_prompt_style: p-tuning (an encoder makes the virtual tokens) or
/// prompt-tuning (a table per task is trained directly).
enum class VirtualPromptStyle { kPTuning, kPromptTuning };
/// model.p_tuning.encoder_type: embedding | mlp | lstm | tpmlp (docs/design/ptuning.md).
enum class PromptEncoderType { kEmbedding, kMlp, kLstm, kTpMlp };
/// model.prompt_tuning.new_prompt_init_methods items: text | random.
enum class PromptInitMethod { kText, kRandom };

struct RunConfig {
  std::string name = "megatron_gpt";          ///< [default]
  std::optional<std::string> results_dir;     ///< [default null]
  std::optional<std::string> time_limit;      ///< [default null] Slurm time limit, e.g. "1-00:00:00"
};

struct TrainerConfig {
  int64_t num_nodes = 1;                      ///< [default]
  int64_t devices = 1;                        ///< [default] ranks per node
  Accelerator accelerator = Accelerator::kGpu;  ///< [default]
  Precision precision = Precision::kBf16;     ///< [default]
  int64_t max_steps = 0;                      ///< [required] optimizer steps
  std::optional<std::string> max_time;        ///< [default null] "DD:HH:MM:SS"
  int64_t log_every_n_steps = 10;             ///< [default]
  int64_t val_check_interval = 100;           ///< [default] steps between validations
  int64_t limit_val_batches = 50;             ///< [default] global batches per validation
  double gradient_clip_val = 1.0;             ///< [default] max global grad norm; 0 = off
};

struct CheckpointCallbackParams {
  /// [derived: trainer.val_check_interval] steps between checkpoints; NeMo's spelling
  /// `every_n_train_steps` is accepted as an alias.
  int64_t every_n_steps = 0;
  bool save_last = true;                      ///< [default]
};

struct ExpManagerConfig {
  std::optional<std::string> explicit_log_dir;  ///< [default null] run directory if set
  std::optional<std::string> exp_dir;           ///< [default null] else <exp_dir or runs>/<name>
  std::string name = "megatron_gpt";            ///< [default]
  bool resume_if_exists = true;                 ///< [default]
  /// [default] false: no checkpoint is ever written (NeMo's switch; `loom plan --measure`
  /// uses it for its short timing runs).
  bool create_checkpoint_callback = true;
  CheckpointCallbackParams checkpoint_callback_params;
};

/// One entry of model.data.data_prefix: Megatron blends datasets with these weights
/// (normalised to sum 1). `path` is an indexed-dataset prefix (<path>.bin / <path>.idx).
struct DataBlendEntry {
  double weight = 1.0;
  std::string path;
  bool operator==(const DataBlendEntry& o) const { return weight == o.weight && path == o.path; }
};

/// A fine-tuning dataset, model.data.train_ds / validation_ds (NeMo's GPTSFTDataset options;
/// docs/design/finetune.md, "Examples"): JSON-lines records, each either prompt/answer fields
/// rendered through prompt_template or a chat record (`messages`) rendered with the base's chat
/// template. validation_ds takes file_names only; its records are laid out as train_ds's.
struct SftDatasetConfig {
  std::vector<std::string> file_names;        ///< [required for train_ds] JSONL files
  /// [default] the record's fields as `{name}` placeholders; the label_key field ends it.
  std::string prompt_template = "{input} {output}";
  std::string label_key = "output";           ///< [default] the answer field
  /// [default] the field shortened from its end when an example exceeds max_seq_length; "" = none
  std::string truncation_field = "input";
  std::string truncation_method = "right";    ///< [default] right (the one method Loom has)
  /// [default null: the base model's max_position_embeddings] most tokens of one example.
  std::optional<int64_t> max_seq_length;
  bool add_bos = false;                       ///< [default] BOS before a prompt/answer example
  bool add_eos = true;                        ///< [default] EOS after its answer
  bool packed_sequence = false;               ///< [default] pack examples by first-fit decreasing
  /// [default null: the base run's tokenizer/chat_template.jinja] Loom: the Jinja chat template
  /// file that renders chat records.
  std::optional<std::string> chat_template;
};

struct DataConfig {
  /// [required] `[w1, prefix1, w2, prefix2, ...]`, or a single prefix (string or one-item list)
  /// which gets weight 1. Pretraining only (as are splits_string .. num_workers).
  std::vector<DataBlendEntry> data_prefix;
  std::string splits_string = "900,50,50";    ///< [default] train,valid,test weights
  int64_t seq_length = 0;                     ///< [derived: model.encoder_seq_length]
  bool eod_mask_loss = false;                 ///< [default]
  std::optional<std::string> index_mapping_dir;  ///< [default null: <run dir>/index_cache]
  int64_t num_workers = 2;                    ///< [default]

  // Prompt learning only (docs/design/ptuning.md): JSONL files of records.
  std::vector<std::string> train_ds;          ///< [required] training records
  std::vector<std::string> validation_ds;     ///< [default []] validation records
  std::vector<std::string> test_ds;           ///< [default []] records for `loom generate`
  bool add_bos = false;                       ///< [default] <|endoftext|> before a record
  bool add_eos = true;                        ///< [default] <|endoftext|> after it
  /// [default null: the base model's max_position_embeddings] longest record, in tokens.
  std::optional<int64_t> max_seq_length;

  // Fine-tuning only (docs/design/finetune.md).
  SftDatasetConfig sft_train;                 ///< model.data.train_ds.*
  SftDatasetConfig sft_validation;            ///< model.data.validation_ds.file_names
};

/// The tokenizer (docs/design/tokenizers.md); data::make_tokenizer builds it.
struct TokenizerConfig {
  TokenizerLibrary library = TokenizerLibrary::kMegatron;  ///< [default]
  /// [default] megatron: the tokenizer class (GPT2BPETokenizer only);
  /// huggingface: the model's hub name, informational (files are read offline, from `model`);
  /// sentencepiece: unused (NeMo writes null).
  std::optional<std::string> type = std::string("GPT2BPETokenizer");
  /// [default null; required for sentencepiece and huggingface] sentencepiece: the .model
  /// file; huggingface: a tokenizer.json, or a folder holding one.
  std::optional<std::string> model;
  std::string vocab_file;                     ///< [required for megatron] GPT-2 vocab.json
  std::string merge_file;                     ///< [required for megatron] GPT-2 merges.txt
};

/// One entry of model.task_templates (prompt learning; NeMo's field names). A template is text
/// with `{field}` placeholders and `<|VIRTUAL_PROMPT_k|>` markers, marker k standing for
/// virtual_token_splits[k] virtual tokens (docs/design/ptuning.md, "Templates and records").
struct TaskTemplate {
  std::string taskname;                             ///< [required]
  std::string prompt_template;                      ///< [required]
  std::vector<std::string> prompt_template_fields;  ///< [required] the {field} names, in order
  int64_t total_virtual_tokens = 0;                 ///< [required] sum of the splits
  std::vector<int64_t> virtual_token_splits;        ///< [required] tokens per marker
  bool answer_only_loss = false;                    ///< [default]
  std::optional<std::string> answer_field;          ///< [default null] last in the template
  std::optional<std::string> truncate_field;        ///< [default null] cut when too long
  bool operator==(const TaskTemplate& o) const {
    return taskname == o.taskname && prompt_template == o.prompt_template &&
           prompt_template_fields == o.prompt_template_fields &&
           total_virtual_tokens == o.total_virtual_tokens &&
           virtual_token_splits == o.virtual_token_splits && answer_only_loss == o.answer_only_loss &&
           answer_field == o.answer_field && truncate_field == o.truncate_field;
  }
};

struct SchedConfig {
  SchedulerName name = SchedulerName::kCosineAnnealing;  ///< [default]
  int64_t warmup_steps = 500;                 ///< [default]
  int64_t constant_steps = 50000;             ///< [default]
  double min_lr = 2e-5;                       ///< [default]
  int64_t max_steps = 0;                      ///< [derived: trainer.max_steps]
};

struct OptimConfig {
  OptimizerName name = OptimizerName::kFusedAdam;  ///< [default]
  double lr = 0.0;                            ///< [required] peak learning rate
  double weight_decay = 0.01;                 ///< [default]
  std::array<double, 2> betas{0.9, 0.98};     ///< [default]
  double eps = 1e-8;                          ///< [default]
  SchedConfig sched;
  /// Data-parallel gradient reduction overlapped with backward (NeMo's optim.overlap_grad_sync,
  /// Megatron-Core's overlap_grad_reduce): each gradient bucket's all-reduce / reduce-scatter
  /// starts when its last gradient of the step is accumulated. [default]
  bool overlap_grad_sync = false;
  /// Distributed optimizer only: the parameter all-gathers after the step (one per bucket) are
  /// asynchronous and the next forward waits for each bucket just before a layer reads it
  /// (NeMo's optim.overlap_param_sync, Megatron-Core's overlap_param_gather). [default]
  bool overlap_param_sync = false;
  /// Elements (parameters) per gradient bucket (NeMo's optim.ddp_bucket_size, Megatron-Core's
  /// bucket_size). [default null: Megatron's max(40 000 000, 1 000 000 · data-parallel size)]
  std::optional<int64_t> ddp_bucket_size;
};

/// model.p_tuning (NeMo's keys): the prompt encoder of p-tuning.
struct PTuningConfig {
  PromptEncoderType encoder_type = PromptEncoderType::kTpMlp;  ///< [default]
  std::optional<int64_t> encoder_hidden;      ///< [default null: hidden_size / 2] H
  int64_t num_layers = 2;                     ///< [default] MLP layers (mlp: >= 2; lstm: LSTM layers)
  double dropout = 0.0;                       ///< [default] in the encoder
  double init_std = 0.023;                    ///< [default] normal init of tpmlp's weights
};

/// model.prompt_tuning (NeMo's keys): how the tables of new tasks start. Each list has one
/// entry per new task, or one entry for all of them; empty: random.
struct PromptTuningConfig {
  std::vector<PromptInitMethod> new_prompt_init_methods;  ///< [default []] text | random
  std::vector<std::string> new_prompt_init_text;          ///< [default []] with method text
};

/// The prompt-learning part of model (recipe kind kPromptLearning): the frozen base, the style,
/// the tasks. The base's shape fills the model's num_layers, hidden_size, ... when it is read.
struct PromptLearningConfig {
  std::string language_model_path;            ///< [required] run or checkpoints dir of the base
  /// [default null: on resume the base iteration the prompt checkpoint recorded, else the
  /// base's latest] the base checkpoint iteration to tune on (docs/design/ptuning.md)
  std::optional<int64_t> language_model_iteration;
  VirtualPromptStyle virtual_prompt_style = VirtualPromptStyle::kPTuning;  ///< [default]
  std::vector<TaskTemplate> task_templates;   ///< [required]
  std::vector<std::string> new_tasks;         ///< [derived: every task of task_templates] trained now
  std::vector<std::string> existing_tasks;    ///< [default []] kept from restore_path, not trained
  std::optional<std::string> restore_path;    ///< [default null] an earlier prompt-learning run
  PTuningConfig p_tuning;
  PromptTuningConfig prompt_tuning;
};

/// model.peft.lora_tuning (NeMo 1.x keys): LoRA adapters (docs/design/lora.md).
struct LoraTuningConfig {
  /// [default] attention_qkv | attention_dense | mlp_fc1 | mlp_fc2 | all
  std::vector<std::string> target_modules{"attention_qkv"};
  int64_t adapter_dim = 32;                   ///< [default] r, the adapters' rank
  std::optional<double> alpha;                ///< [default null: adapter_dim] the update is scaled by alpha / r
  double adapter_dropout = 0.0;               ///< [default] dropout on each adapter's input
};

/// model.peft (NeMo 1.x's megatron_gpt_finetuning_config keys; recipe kind kFinetuning).
struct PeftConfig {
  /// [default] lora (adapters on a frozen base) or none (every base parameter trains: full SFT)
  std::string peft_scheme = "lora";
  LoraTuningConfig lora_tuning;
};

struct ModelConfig {
  int64_t micro_batch_size = 0;               ///< [required] sequences per micro-batch per DP rank
  int64_t global_batch_size = 0;              ///< [required] sequences per optimizer step
  int64_t tensor_model_parallel_size = 1;     ///< [default] t
  int64_t pipeline_model_parallel_size = 1;   ///< [default] p
  std::optional<int64_t> virtual_pipeline_model_parallel_size;  ///< [default null] v (interleaving)
  /// [default null: an even share] Megatron-Core's uneven pipeline split: transformer layers of
  /// the first / last pipeline stage; the other layers split evenly over the middle stages
  /// (rules::stage_layer_counts, docs/design/parallel_layout.md "Uneven stages").
  std::optional<int64_t> num_layers_in_first_pipeline_stage;
  std::optional<int64_t> num_layers_in_last_pipeline_stage;  ///< [default null: an even share]
  bool sequence_parallel = false;             ///< [default]; forced off (warning) when t == 1
  int64_t encoder_seq_length = 0;             ///< [required] s, tokens per sample
  int64_t max_position_embeddings = 0;        ///< [derived: encoder_seq_length]
  int64_t num_layers = 0;                     ///< [required] L
  int64_t hidden_size = 0;                    ///< [required] h
  int64_t ffn_hidden_size = 0;                ///< [derived: 4 * hidden_size]
  int64_t num_attention_heads = 0;            ///< [required] a
  double init_method_std = 0.02;              ///< [default]
  double hidden_dropout = 0.1;                ///< [default]
  double attention_dropout = 0.1;             ///< [default]
  /// [default] NeMo's name: the attention core through ATen's fused
  /// scaled_dot_product_attention (flash / memory-efficient / cuDNN kernels; no s×s
  /// activations). Needs attention_dropout 0 and no selective recompute
  /// (rules::fused_attention_violations; docs/design/sp_sar.md, "Fused attention").
  bool use_flash_attention = false;
  /// [default] NeMo's name: LayerNorm / RMSNorm through the op library's fused kernels
  /// (loom::layer_norm, loom::rms_norm; a bias-less LayerNorm is always ATen's); false: ATen.
  bool persist_layer_norm = true;
  /// [default] NeMo's name: the MLP activation through loom::bias_gelu (with a bias) or
  /// loom::swiglu; false: ATen compositions.
  bool bias_activation_fusion = true;
  /// [default] NeMo's name: RoPE through loom::rotary; false: the ATen composition.
  bool apply_rope_fusion = true;
  double ffn_dropout = 0.0;                   ///< [default]
  double layernorm_epsilon = 1e-5;            ///< [default] LayerNorm's or RMSNorm's epsilon
  int64_t make_vocab_size_divisible_by = 128;  ///< [default]
  // The decoder's architecture (NeMo's names; docs/design/llama.md). The defaults are GPT-3's.
  Normalization normalization = Normalization::kLayerNorm;  ///< [default] layernorm | rmsnorm
  /// [default] learned_absolute | rope
  PositionEmbedding position_embedding_type = PositionEmbedding::kLearnedAbsolute;
  double rotary_base = 10000.0;               ///< [default] RoPE's base θ (rope only)
  double rotary_percentage = 1.0;             ///< [default] rotated fraction of each head, (0, 1]
  bool rope_scaling = false;                  ///< [default] Llama 3.1's RoPE frequency scaling
  double rope_scaling_factor = 8.0;           ///< [default] its factor (low frequencies / factor)
  double low_freq_factor = 1.0;               ///< [default] wavelengths > old_context_len / this: scaled
  double high_freq_factor = 4.0;              ///< [default] wavelengths < old_context_len / this: kept
  int64_t old_context_len = 8192;             ///< [default] the pre-training context (positions)
  /// [default null: hidden_size / num_attention_heads] the width of each attention head
  std::optional<int64_t> kv_channels;
  Activation activation = Activation::kGelu;  ///< [default] gelu | fast-swiglu (gated MLP)
  /// [default null: num_attention_heads] K/V heads of grouped-query attention (1: multi-query);
  /// must divide num_attention_heads and be a multiple of tensor_model_parallel_size.
  std::optional<int64_t> num_query_groups;
  bool bias = true;                           ///< [default] biases of the linear layers and norms
  bool qkv_bias = false;                      ///< [default] a QKV bias even with bias false (Qwen2)
  /// [default] the output layer is the word embedding (false: its own weight)
  bool share_embeddings_and_output_weights = true;
  RecomputeGranularity activations_checkpoint_granularity = RecomputeGranularity::kNone;  ///< [default]
  RecomputeMethod activations_checkpoint_method = RecomputeMethod::kNone;  ///< [default]
  std::optional<int64_t> activations_checkpoint_num_layers;  ///< [default null]
  int64_t seed = 1234;                        ///< [default]
  double label_smoothing = 0.0;               ///< [default]
  /// [derived: true when optim.name is distributed_fused_adam, else false] ZeRO-1 sharding.
  bool use_distributed_optimizer = false;
  double collective_timeout_s = 600.0;        ///< [default] Loom: timeout of every collective
  DataConfig data;
  TokenizerConfig tokenizer;
  OptimConfig optim;
  PromptLearningConfig prompt;  ///< kPromptLearning recipes only
  /// kFinetuning recipes only: the pretrained base, a Loom run or checkpoints directory (NeMo:
  /// the .nemo file). Its shape becomes the model's.
  std::string restore_from_path;
  PeftConfig peft;  ///< kFinetuning recipes only
  /// [default] kFinetuning: the loss counts answer tokens only (chat: the assistant turns)
  bool answer_only_loss = true;
};

/// Slurm / container description for `loom` launch scripts and the planner (NeMo Framework
/// Launcher's cluster config, simplified). The whole section is optional.
struct ClusterConfig {
  std::optional<std::string> partition;       ///< [default null]
  std::optional<std::string> account;         ///< [default null]
  std::string job_name_prefix = "loom-";      ///< [default]
  int64_t gpus_per_node = 0;                  ///< [derived: trainer.devices]
  bool exclusive = true;                      ///< [default]
  std::optional<std::string> container_image;  ///< [default null]
  std::vector<std::string> container_mounts;  ///< [default []]
  std::optional<std::string> gpu;             ///< [default null] GPU model for the planner, e.g. A100-80GB
};

/// Where a recipe came from; not part of the YAML.
struct SourceLocation {
  std::string origin;  ///< recipe file path, or "override 'key=value'"
  int line = 0;        ///< 1-based; 0 when unknown (overrides, defaults)
  int column = 0;      ///< 1-based
  /// "file:line:col", or just the origin when line is 0.
  std::string str() const;
};

struct RecipeOrigin {
  std::string file;                                  ///< recipe path as given ("<string>" for text)
  std::vector<std::string> overrides;                ///< as given, in order
  std::map<std::string, SourceLocation> locations;   ///< field path -> where its value was set
  std::vector<std::string> warnings;                 ///< non-fatal findings, already formatted
};

struct Recipe {
  RecipeKind kind = RecipeKind::kPretraining;  ///< chosen by the command; not in the YAML
  RunConfig run;
  TrainerConfig trainer;
  ExpManagerConfig exp_manager;
  ModelConfig model;
  ClusterConfig cluster;
  RecipeOrigin origin;  ///< provenance for messages; not dumped
};

/// All problems found in a recipe, one formatted line each:
///   "<file>:<line>:<col>: <field.path>: expected ..., found ..."
/// what() is the lines joined with '\n'.
class RecipeError : public std::runtime_error {
 public:
  explicit RecipeError(std::vector<std::string> errors);
  std::vector<std::string> errors;
};

/// Reads `path`, applies `overrides` ("section.key=value", value parsed as YAML, e.g.
/// "model.optim.betas=[0.9,0.95]"), resolves `${a.b}` / `${.sibling}` / `${multiply:x,y}`
/// interpolations, fills defaults and derived fields, and validates everything (see
/// validate.h) for a recipe of `kind` (its keys: schema.h). Throws RecipeError listing every
/// problem found.
Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides = {},
                   RecipeKind kind = RecipeKind::kPretraining);

/// Same as load_recipe for YAML text; `origin` names it in messages.
Recipe load_recipe_from_string(const std::string& yaml, const std::string& origin = "<string>",
                               const std::vector<std::string>& overrides = {},
                               RecipeKind kind = RecipeKind::kPretraining);

/// The full resolved recipe as YAML: every field, defaults and derived values filled, enums in
/// canonical spelling, floats in shortest round-trip form. Loading it again gives the same
/// recipe. Starts with comment lines naming the source file and overrides.
std::string to_yaml(const Recipe& recipe);

/// A prompt-learning or fine-tuning recipe once the base's shape has been filled in (num_layers, hidden_size,
/// heads, sequence length, ...): runs every rule again, the layout rules that need the shape
/// included (heads % t, sequence % t under SP, ...). Throws RecipeError with one located line
/// per problem.
void validate_adopted_shape(const Recipe& recipe);

/// Checks that the input files exist (tokenizer vocab/merges, <prefix>.bin and <prefix>.idx of
/// every data_prefix entry), relative paths against the working directory. Throws RecipeError
/// with one located line per missing file. Kept apart from load_recipe so that recipes for
/// other machines (e.g. for the planner) can be loaded anywhere.
void check_input_files(const Recipe& recipe);

}  // namespace loom::config
