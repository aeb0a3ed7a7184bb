#include "config/validate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <initializer_list>

#include "config/derived.h"
#include "config/schema.h"
#include "config/schema_read.h"
#include "rules/lora_config.h"
#include "rules/layout_rules.h"

namespace loom::config {

namespace {

using detail::enum_name;

/// Fields whose default is computed from another one: not re-checked when the source is bad.
const std::pair<const char*, const char*> kDerivedFrom[] = {
    {"model.max_position_embeddings", "model.encoder_seq_length"},
    {"model.ffn_hidden_size", "model.hidden_size"},
    {"model.data.seq_length", "model.encoder_seq_length"},
    {"model.optim.sched.max_steps", "trainer.max_steps"},
    {"exp_manager.checkpoint_callback_params.every_n_steps", "trainer.val_check_interval"},
    {"cluster.gpus_per_node", "trainer.devices"},
};

class Checker {
 public:
  Checker(const Recipe& r, const std::set<std::string>& skip) : r_(r), skip_(skip) {}

  /// True when none of `paths` (nor the field a derived path defaults from) had an error so far.
  bool ok(std::initializer_list<const char*> paths) const {
    for (const char* p : paths) {
      if (bad(p)) return false;
      for (const auto& [derived, source] : kDerivedFrom)
        if (derived == p && bad(source)) return false;
    }
    return true;
  }
  bool bad(const std::string& p) const { return skip_.count(p) || failed_.count(p); }
  void error(const std::string& path, const std::string& message) {
    findings_.push_back({path, message, false});
    failed_.insert(path);
  }
  void warn(const std::string& path, const std::string& message) { findings_.push_back({path, message, true}); }

  void at_least(const char* path, int64_t value, int64_t min) {
    if (ok({path}) && value < min) error(path, fmt::format("expected an integer >= {}, found {}", min, value));
  }
  /// Sizes the model and the planner hold in 32-bit integers.
  void size_in_range(const char* path, int64_t value, int64_t min) {
    at_least(path, value, min);
    if (ok({path}) && value > kMaxSize) {
      error(path, fmt::format("expected an integer in [{}, {}], found {}", min, kMaxSize, value));
    }
  }
  /// `path`'s value times the other factors must fit in 64 bits (Loom computes the product).
  void product_fits(const char* path, std::initializer_list<std::pair<const char*, int64_t>> factors,
                    const char* what) {
    for (const auto& f : factors)
      if (!ok({f.first}) || f.second < 0) return;
    int64_t product = 1;
    bool overflow = false;
    std::string text;
    for (const auto& f : factors) {
      text += (text.empty() ? "" : " x ") + fmt::format("{} ({})", f.first, f.second);
      overflow = overflow || __builtin_mul_overflow(product, f.second, &product);
    }
    if (overflow) error(path, fmt::format("expected {} = {} to fit in 64 bits, found an overflow", what, text));
  }
  static constexpr int64_t kMaxSize = 2147483647;
  void positive_real(const char* path, double value) {
    if (ok({path}) && !(value > 0)) error(path, fmt::format("expected a number > 0, found {}", value));
  }
  void non_negative_real(const char* path, double value) {
    if (ok({path}) && !(value >= 0)) error(path, fmt::format("expected a number >= 0, found {}", value));
  }
  void probability(const char* path, double value) {
    if (ok({path}) && !(value >= 0 && value < 1)) {
      error(path, fmt::format("expected a probability in [0, 1), found {}", value));
    }
  }
  void tokenizer();
  void non_empty(const char* path, const std::string& value) {
    if (ok({path}) && value.empty()) error(path, "expected a non-empty string, found an empty string");
  }

  std::vector<Finding> run();

 private:
  void field_ranges();
  void parallel_layout();
  void sequence_lengths();
  void recompute();
  void optimizer();
  void data();
  void prompt_learning();
  void finetuning();

  const Recipe& r_;
  const std::set<std::string>& skip_;
  std::set<std::string> failed_;
  std::vector<Finding> findings_;
};

void Checker::field_ranges() {
  const auto& t = r_.trainer;
  size_in_range("trainer.num_nodes", t.num_nodes, 1);
  size_in_range("trainer.devices", t.devices, 1);
  at_least("trainer.max_steps", t.max_steps, 1);
  at_least("trainer.log_every_n_steps", t.log_every_n_steps, 1);
  at_least("trainer.val_check_interval", t.val_check_interval, 1);
  at_least("trainer.limit_val_batches", t.limit_val_batches, 0);
  non_negative_real("trainer.gradient_clip_val", t.gradient_clip_val);
  if (t.max_time && ok({"trainer.max_time"}) && !parse_max_time(*t.max_time))
    error("trainer.max_time", "expected DD:HH:MM:SS (e.g. 00:23:30:00), found \"" + *t.max_time + "\"");
  at_least("exp_manager.checkpoint_callback_params.every_n_steps",
           r_.exp_manager.checkpoint_callback_params.every_n_steps, 1);
  non_empty("exp_manager.name", r_.exp_manager.name);
  non_empty("run.name", r_.run.name);

  const auto& m = r_.model;
  size_in_range("model.micro_batch_size", m.micro_batch_size, 1);
  size_in_range("model.global_batch_size", m.global_batch_size, 1);
  size_in_range("model.tensor_model_parallel_size", m.tensor_model_parallel_size, 1);
  size_in_range("model.pipeline_model_parallel_size", m.pipeline_model_parallel_size, 1);
  if (m.virtual_pipeline_model_parallel_size) {
    size_in_range("model.virtual_pipeline_model_parallel_size", *m.virtual_pipeline_model_parallel_size, 1);
  }
  // Only the upper bound here: the layout rules say what a set size below 1 means.
  for (const auto& [path, layers] : {std::pair{"model.num_layers_in_first_pipeline_stage",
                                               m.num_layers_in_first_pipeline_stage},
                                     std::pair{"model.num_layers_in_last_pipeline_stage",
                                               m.num_layers_in_last_pipeline_stage}})
    if (layers && *layers > kMaxSize && ok({path}))
      error(path, fmt::format("expected null or an integer in [1, {}], found {}", kMaxSize, *layers));
  // The model shape's sizes (ModelShape), at least 1; the sequence at least 2: a GPT sample
  // predicts each token from the ones before it, so one token gives nothing to learn.
  struct Size { const char* path; int64_t value, min; };
  for (const Size& size : {Size{"model.encoder_seq_length", m.encoder_seq_length, 2},
                           Size{"model.max_position_embeddings", m.max_position_embeddings, 1},
                           Size{"model.num_layers", m.num_layers, 1}, Size{"model.hidden_size", m.hidden_size, 1},
                           Size{"model.ffn_hidden_size", m.ffn_hidden_size, 1},
                           Size{"model.num_attention_heads", m.num_attention_heads, 1},
                           Size{"model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by, 1}})
    size_in_range(size.path, size.value, size.min);
  positive_real("model.init_method_std", m.init_method_std);
  probability("model.hidden_dropout", m.hidden_dropout);
  probability("model.attention_dropout", m.attention_dropout);
  probability("model.ffn_dropout", m.ffn_dropout);
  if (ok({"model.ffn_dropout"}) && m.ffn_dropout != 0.0)
    error("model.ffn_dropout", fmt::format("expected 0.0 (Loom's MLP has no dropout between its two linear layers; "
                                           "hidden_dropout applies after the MLP), found {}", m.ffn_dropout));
  probability("model.label_smoothing", m.label_smoothing);
  positive_real("model.layernorm_epsilon", m.layernorm_epsilon);
  // null: one K/V head per query head (the layout rules check how groups divide heads and t).
  if (m.num_query_groups) size_in_range("model.num_query_groups", *m.num_query_groups, 1);
  if (m.kv_channels) size_in_range("model.kv_channels", *m.kv_channels, 1);  // null: hidden_size / heads
  at_least("model.seed", m.seed, 0);
  positive_real("model.collective_timeout_s", m.collective_timeout_s);

  size_in_range("cluster.gpus_per_node", r_.cluster.gpus_per_node, 1);

  // Loom counts samples and tokens in 64-bit integers: the training and validation totals
  // must fit (trainer.max_steps: 2^63-1 passes the range check above but overflows here).
  product_fits("trainer.max_steps",
               {{"trainer.max_steps", t.max_steps}, {"model.global_batch_size", m.global_batch_size},
                {"model.encoder_seq_length", m.encoder_seq_length}},
               "the tokens to train on, max_steps x global_batch_size x encoder_seq_length");
  product_fits("trainer.limit_val_batches",
               {{"trainer.limit_val_batches", t.limit_val_batches},
                {"model.global_batch_size", m.global_batch_size},
                {"model.encoder_seq_length", m.encoder_seq_length}},
               "the tokens of one validation, limit_val_batches x global_batch_size x encoder_seq_length");
}

void Checker::parallel_layout() {
  rules::LayoutQuery q;
  q.num_nodes = r_.trainer.num_nodes;
  q.devices = r_.trainer.devices;
  q.layout = recipe_layout(r_);
  q.model = recipe_model_shape(r_, /*vocab_size=*/0);  // the rules do not read the vocabulary
  // A rule is skipped when a field it reads was rejected already (its value means nothing).
  for (const auto& v : rules::layout_violations(q))
    if (std::none_of(v.reads.begin(), v.reads.end(), [&](const std::string& f) { return !ok({f.c_str()}); }))
      error(v.field, v.message);
  if (ok({"cluster.gpus_per_node", "trainer.devices"}) && r_.trainer.accelerator == Accelerator::kGpu &&
      r_.cluster.gpus_per_node != r_.trainer.devices) {
    error("cluster.gpus_per_node", fmt::format("expected trainer.devices ({}) on GPU nodes, found {}",
                                               r_.trainer.devices, r_.cluster.gpus_per_node));
  }
}

void Checker::sequence_lengths() {
  const auto& m = r_.model;
  if (m.sequence_parallel && m.tensor_model_parallel_size == 1 &&
      ok({"model.tensor_model_parallel_size", "model.sequence_parallel"})) {
    warn("model.sequence_parallel",
         "sequence_parallel has no effect with tensor_model_parallel_size 1; turned off (as Megatron-LM does)");
  }
  if (ok({"model.data.seq_length", "model.encoder_seq_length"}) && m.data.seq_length != m.encoder_seq_length) {
    error("model.data.seq_length", fmt::format("expected model.encoder_seq_length ({}), found {}",
                                               m.encoder_seq_length, m.data.seq_length));
  }
}

void Checker::recompute() {
  const auto& m = r_.model;
  const char* method = "model.activations_checkpoint_method";
  if (ok({"model.activations_checkpoint_granularity", method}) &&
      m.activations_checkpoint_granularity == RecomputeGranularity::kNone &&
      m.activations_checkpoint_method != RecomputeMethod::kNone) {
    warn(method, std::string("activations_checkpoint_method ") + enum_name(m.activations_checkpoint_method) +
                     " has no effect without activations_checkpoint_granularity; ignored");
  }
  for (const auto& v : rules::fused_attention_violations(m.use_flash_attention, m.attention_dropout,
                                                         m.activations_checkpoint_granularity))
    if (std::none_of(v.reads.begin(), v.reads.end(), [&](const std::string& f) { return !ok({f.c_str()}); }))
      error(v.field, v.message);
}

void Checker::optimizer() {
  const auto& o = r_.model.optim;
  positive_real("model.optim.lr", o.lr);
  non_negative_real("model.optim.weight_decay", o.weight_decay);
  positive_real("model.optim.eps", o.eps);
  if (ok({"model.optim.betas"}) && !(o.betas[0] >= 0 && o.betas[0] < 1 && o.betas[1] >= 0 && o.betas[1] < 1)) {
    error("model.optim.betas", fmt::format("expected both betas in [0, 1), found [{}, {}]", o.betas[0], o.betas[1]));
  }
  at_least("model.optim.sched.warmup_steps", o.sched.warmup_steps, 0);
  at_least("model.optim.sched.constant_steps", o.sched.constant_steps, 0);
  at_least("model.optim.sched.max_steps", o.sched.max_steps, 1);
  non_negative_real("model.optim.sched.min_lr", o.sched.min_lr);
  if (ok({"model.optim.sched.min_lr", "model.optim.lr"}) && o.sched.min_lr > o.lr) {
    error("model.optim.sched.min_lr", fmt::format("expected at most model.optim.lr ({}), found {}", o.lr, o.sched.min_lr));
  }
  if (ok({"model.optim.sched.warmup_steps", "model.optim.sched.constant_steps", "model.optim.sched.max_steps"}) &&
      o.sched.warmup_steps + o.sched.constant_steps > o.sched.max_steps &&
      o.sched.name == SchedulerName::kCosineAnnealing) {
    warn("model.optim.sched.warmup_steps",
         fmt::format("warmup_steps + constant_steps = {} exceeds the schedule's max_steps {}: the run ends before "
                     "the decay phase", o.sched.warmup_steps + o.sched.constant_steps, o.sched.max_steps));
  }
  if (o.ddp_bucket_size) at_least("model.optim.ddp_bucket_size", *o.ddp_bucket_size, 1);
  if (o.overlap_param_sync && !uses_distributed_optimizer(r_)) {
    warn("model.optim.overlap_param_sync",
         "overlap_param_sync only applies to the distributed optimizer (optim.name distributed_fused_adam); ignored");
  }
}

void Checker::data() {
  const auto& d = r_.model.data;
  at_least("model.data.num_workers", d.num_workers, 0);
  if (ok({"model.data.data_prefix"})) {
    for (size_t i = 0; i < d.data_prefix.size(); ++i) {
      const auto& e = d.data_prefix[i];
      if (!(e.weight > 0)) {
        error("model.data.data_prefix", fmt::format("expected blend weights > 0, found {} (item {})", e.weight, 2 * i));
      }
      if (e.path.empty()) error("model.data.data_prefix", fmt::format("expected a dataset prefix, found an empty string (item {})", 2 * i + 1));
    }
  }
  if (ok({"model.data.splits_string"})) {
    std::vector<double> weights;
    std::string cur;
    bool good = true;
    auto flush = [&] {
      double w = 0;
      std::string s;
      for (char c : cur)
        if (c != ' ') s += c;
      if (!detail::parse_double(s, w) || w < 0) good = false;
      weights.push_back(w);
      cur.clear();
    };
    for (char c : d.splits_string) {
      if (c == ',' || c == '/') {
        flush();
      } else {
        cur += c;
      }
    }
    flush();
    double sum = 0;
    for (double w : weights) sum += w;
    if (!good || weights.size() > 3 || !(sum > 0)) {
      error("model.data.splits_string",
            "expected 1 to 3 non-negative train,valid,test weights with a positive sum (e.g. \"900,50,50\"), found \"" +
                d.splits_string + "\"");
    }
  }
  tokenizer();
}

void Checker::tokenizer() {
  const auto& k = r_.model.tokenizer;
  if (!ok({"model.tokenizer.library"})) return;
  if (k.library == TokenizerLibrary::kMegatron) {
    if (ok({"model.tokenizer.type"}) && k.type.value_or("GPT2BPETokenizer") != "GPT2BPETokenizer")
      error("model.tokenizer.type",
            "expected GPT2BPETokenizer (the megatron library's tokenizer Loom reads; for another vocabulary use "
            "library sentencepiece or huggingface), found '" + *k.type + "'");
    non_empty("model.tokenizer.vocab_file", k.vocab_file);
    non_empty("model.tokenizer.merge_file", k.merge_file);
  } else if (ok({"model.tokenizer.model"}) && (!k.model || k.model->empty())) {
    error("model.tokenizer.model",
          k.library == TokenizerLibrary::kSentencePiece
              ? "expected the SentencePiece .model file (library sentencepiece), found none"
              : "expected a tokenizer.json or the folder holding one (library huggingface; Loom reads it offline, "
                "model.tokenizer.type only names the model), found none");
  }
}

void Checker::finetuning() {
  const auto& m = r_.model;
  non_empty("model.restore_from_path", m.restore_from_path);
  if (ok({"model.peft.peft_scheme"}) && m.peft.peft_scheme != "lora" && m.peft.peft_scheme != "none")
    error("model.peft.peft_scheme",
          "expected lora (adapters on a frozen base) or none (full-parameter fine-tuning), found '" +
              m.peft.peft_scheme + "'");
  const auto& t = m.data.sft_train;
  if (ok({"model.data.train_ds.file_names"}) && t.file_names.empty())
    error("model.data.train_ds.file_names", "expected at least one JSONL file of training records, found none");
  if (t.max_seq_length) size_in_range("model.data.train_ds.max_seq_length", *t.max_seq_length, 2);
  non_empty("model.data.train_ds.label_key", t.label_key);
  if (ok({"model.data.train_ds.truncation_method"}) && t.truncation_method != "right")
    error("model.data.train_ds.truncation_method",
          "expected right (the field is shortened from its end; the one method Loom has), found '" +
              t.truncation_method + "'");
  if (m.peft.peft_scheme != "lora") return;  // the adapter fields are unused
  const auto& l = m.peft.lora_tuning;
  if (ok({"model.peft.lora_tuning.target_modules"})) {
    if (l.target_modules.empty()) {
      error("model.peft.lora_tuning.target_modules",
            "expected at least one of attention_qkv, attention_dense, mlp_fc1, mlp_fc2, all, found none");
    } else {
      try {
        parse_lora_targets(l.target_modules);
      } catch (const std::invalid_argument& e) {
        error("model.peft.lora_tuning.target_modules", e.what());
      }
    }
  }
  size_in_range("model.peft.lora_tuning.adapter_dim", l.adapter_dim, 1);
  if (l.alpha) positive_real("model.peft.lora_tuning.alpha", *l.alpha);
  probability("model.peft.lora_tuning.adapter_dropout", l.adapter_dropout);
}

void Checker::prompt_learning() {
  const auto& p = r_.model.prompt;
  non_empty("model.language_model_path", p.language_model_path);
  if (p.language_model_iteration) at_least("model.language_model_iteration", *p.language_model_iteration, 0);
  std::vector<std::string> names;
  for (const auto& t : p.task_templates) names.push_back(t.taskname);
  const std::string known = fmt::format("{}", fmt::join(names, ", "));
  if (ok({"model.task_templates"}) && p.task_templates.empty())
    error("model.task_templates", "expected at least one task template, found none");
  auto is_task = [&](const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  if (ok({"model.task_templates", "model.new_tasks"})) {
    for (const auto& name : p.new_tasks)
      if (!is_task(name))
        error("model.new_tasks", fmt::format("expected names of model.task_templates ({}), found '{}'", known, name));
    if (p.new_tasks.empty()) error("model.new_tasks", "expected at least one task to train, found none");
  }
  if (ok({"model.task_templates", "model.existing_tasks", "model.new_tasks"})) {
    for (const auto& name : p.existing_tasks) {
      if (!is_task(name))
        error("model.existing_tasks", fmt::format("expected names of model.task_templates ({}), found '{}'", known, name));
      else if (std::find(p.new_tasks.begin(), p.new_tasks.end(), name) != p.new_tasks.end())
        error("model.existing_tasks", fmt::format("expected tasks not trained again, found '{}' in new_tasks too", name));
    }
  }
  if (ok({"model.existing_tasks", "model.restore_path"}) && !p.existing_tasks.empty() && !p.restore_path)
    error("model.restore_path", "expected the earlier prompt-learning run that holds model.existing_tasks, found null");
  const auto& pt = p.p_tuning;
  if (pt.encoder_hidden) at_least("model.p_tuning.encoder_hidden", *pt.encoder_hidden, 1);
  const int64_t min_layers = pt.encoder_type == PromptEncoderType::kMlp ? 2 : 1;
  at_least("model.p_tuning.num_layers", pt.num_layers, min_layers);
  probability("model.p_tuning.dropout", pt.dropout);
  positive_real("model.p_tuning.init_std", pt.init_std);
  const auto& tuning = p.prompt_tuning;
  const size_t n_new = p.new_tasks.size();
  for (const auto& [path, size] : {std::pair{"model.prompt_tuning.new_prompt_init_methods", tuning.new_prompt_init_methods.size()},
                                   std::pair{"model.prompt_tuning.new_prompt_init_text", tuning.new_prompt_init_text.size()}}) {
    if (ok({path, "model.new_tasks"}) && size > 1 && size != n_new)
      error(path, fmt::format("expected one entry, or one per new task ({}), found {}", n_new, size));
  }
  if (ok({"model.prompt_tuning.new_prompt_init_methods", "model.prompt_tuning.new_prompt_init_text"}) &&
      p.virtual_prompt_style == VirtualPromptStyle::kPromptTuning) {
    for (size_t i = 0; i < tuning.new_prompt_init_methods.size(); ++i) {
      if (tuning.new_prompt_init_methods[i] != PromptInitMethod::kText) continue;
      const size_t j = tuning.new_prompt_init_text.size() == 1 ? 0 : i;
      if (j >= tuning.new_prompt_init_text.size() || tuning.new_prompt_init_text[j].empty())
        error("model.prompt_tuning.new_prompt_init_text",
              fmt::format("expected an init text for new task {} (its method is text), found none", i));
    }
  }
  const auto& d = r_.model.data;
  if (ok({"model.data.train_ds"}) && d.train_ds.empty())
    error("model.data.train_ds", "expected at least one JSONL file of training records, found none");
  if (d.max_seq_length) size_in_range("model.data.max_seq_length", *d.max_seq_length, 2);
}

std::vector<Finding> Checker::run() {
  field_ranges();
  optimizer();
  data();
  parallel_layout();
  sequence_lengths();
  recompute();
  if (r_.kind == RecipeKind::kPromptLearning) prompt_learning();
  if (r_.kind == RecipeKind::kFinetuning) finetuning();
  return findings_;
}

// A prompt-learning or fine-tuning recipe has no model shape of its own (prompt learning no
// pretraining data either): until the base checkpoint has been read, rules about them are not
// evaluated (and its tokenizer may come from the base's run).
std::set<std::string> not_in_prompt_recipes(const Recipe& r, bool shape_known) {
  std::set<std::string> out;
  if (r.kind == RecipeKind::kPretraining) return out;
  const auto& own_keys = detail::key_index(r.kind).fields;
  for (const auto& path : detail::key_index(RecipeKind::kPretraining).fields) {
    if (own_keys.count(path)) continue;
    const bool shape = path.rfind("model.data.", 0) != 0;
    if (!shape || !shape_known) out.insert(path);
  }
  if (r.model.tokenizer.vocab_file.empty()) out.insert("model.tokenizer.vocab_file");
  if (r.model.tokenizer.merge_file.empty()) out.insert("model.tokenizer.merge_file");
  if (!r.model.tokenizer.model) out.insert("model.tokenizer.model");
  return out;
}

}  // namespace

std::vector<Finding> validate_recipe(const Recipe& r, const std::set<std::string>& skip,
                                     bool model_shape_known) {
  std::set<std::string> all = not_in_prompt_recipes(r, model_shape_known);
  all.insert(skip.begin(), skip.end());
  return Checker(r, all).run();
}

}  // namespace loom::config
