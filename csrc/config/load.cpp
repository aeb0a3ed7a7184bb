// load_recipe(): parse -> aliases -> overrides -> interpolation -> key check -> typed read ->
// derived defaults -> validation; every problem is collected and thrown as one RecipeError.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/interpolation.h"
#include "config/overrides.h"
#include "config/recipe.h"
#include "config/schema.h"
#include "config/schema_read.h"
#include "config/validate.h"

namespace loom::config {

namespace {

/// Largest recipe file read (docs/design/hardening.md); a million-key file is ~15 MiB.
constexpr uintmax_t kMaxRecipeBytes = uintmax_t{64} << 20;

using detail::Diagnostics;
using detail::Need;

/// Fills fields marked Need::kDerived that the recipe left absent or null. A derived value
/// whose source had an error is marked bad too, so validation does not report it again.
void apply_derived_defaults(Recipe& r, const std::set<std::string>& derived, std::set<std::string>& bad) {
  auto derive = [&](const char* path, const char* source, auto& field, auto value) {
    if (!derived.count(path)) return;
    field = value;
    if (bad.count(source)) bad.insert(path);
  };
  auto& m = r.model;
  derive("model.max_position_embeddings", "model.encoder_seq_length", m.max_position_embeddings,
         m.encoder_seq_length);
  // A hidden_size beyond range is reported by validation (which then skips the derived field);
  // computing 4h must not overflow meanwhile.
  int64_t four_h = 0;
  if (__builtin_mul_overflow(m.hidden_size, int64_t{4}, &four_h)) four_h = 0;
  derive("model.ffn_hidden_size", "model.hidden_size", m.ffn_hidden_size, four_h);
  derive("model.data.seq_length", "model.encoder_seq_length", m.data.seq_length, m.encoder_seq_length);
  derive("model.optim.sched.max_steps", "trainer.max_steps", m.optim.sched.max_steps, r.trainer.max_steps);
  derive("exp_manager.checkpoint_callback_params.every_n_steps", "trainer.val_check_interval",
         r.exp_manager.checkpoint_callback_params.every_n_steps, r.trainer.val_check_interval);
  derive("cluster.gpus_per_node", "trainer.devices", r.cluster.gpus_per_node, r.trainer.devices);
  derive("model.use_distributed_optimizer", "model.optim.name", m.use_distributed_optimizer,
         m.optim.name == OptimizerName::kDistributedFusedAdam);
  std::vector<std::string> every_task;
  for (const auto& t : m.prompt.task_templates) every_task.push_back(t.taskname);
  derive("model.new_tasks", "model.task_templates", m.prompt.new_tasks, every_task);
}

std::string located(const Recipe& r, const std::string& path, const std::string& message) {
  auto it = r.origin.locations.find(path);
  if (it != r.origin.locations.end()) return detail::format_issue(it->second, path, message);
  const auto& need = detail::key_index(r.kind).need;
  auto n = need.find(path);
  const char* how = (n != need.end() && n->second == Need::kDerived) ? " (not set; derived)" : " (not set; default)";
  return detail::format_issue(SourceLocation{r.origin.file, 0, 0}, path + how, message);
}

}  // namespace

Recipe load_recipe_from_string(const std::string& yaml, const std::string& origin,
                               const std::vector<std::string>& overrides, RecipeKind kind) {
  Diagnostics diag;
  Recipe r;
  r.kind = kind;
  r.origin.file = origin;
  r.origin.overrides = overrides;
  const SourceLocation root_where{origin, 0, 0};

  detail::Node root = detail::parse_yaml(yaml, origin, diag);
  if (root.kind == detail::Node::Kind::kNull && !diag.errors.empty()) throw RecipeError(diag.report());
  detail::apply_key_aliases(root, diag);
  detail::apply_overrides(root, overrides, diag, kind);
  detail::resolve_interpolations(root, diag, kind);
  detail::check_keys(root, root_where, diag, kind);
  std::set<std::string> derived;
  detail::read_fields(root, root_where, r, diag, derived);
  apply_derived_defaults(r, derived, diag.bad_paths);

  std::vector<std::string> errors = diag.errors;
  std::vector<std::string> warnings = diag.warnings;
  for (const Finding& f : validate_recipe(r, diag.bad_paths)) {
    (f.warning ? warnings : errors).push_back(located(r, f.path, f.message));
  }
  if (diag.suppressed > 0) errors.push_back(diag.report().back());
  if (!errors.empty()) throw RecipeError(errors);
  if (r.model.sequence_parallel && r.model.tensor_model_parallel_size == 1) r.model.sequence_parallel = false;
  r.origin.warnings = warnings;
  return r;
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides, RecipeKind kind) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw RecipeError({path + ": cannot open recipe file (" + std::strerror(errno) + ")"});
  }
  // Refuse a huge file before reading it whole (a recipe is a few KiB; a device or a pipe
  // reports size 0 and is read as it is).
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec && size > kMaxRecipeBytes) {
    throw RecipeError({path + ": expected a recipe file of at most " + std::to_string(kMaxRecipeBytes >> 20) +
                       " MiB, found " + std::to_string(size) + " bytes"});
  }
  std::ostringstream text;
  text << in.rdbuf();
  return load_recipe_from_string(text.str(), path, overrides, kind);
}

void validate_adopted_shape(const Recipe& r) {
  std::vector<std::string> errors;
  for (const Finding& f : validate_recipe(r, {}, /*model_shape_known=*/true))
    if (!f.warning)
      errors.push_back(located(r, f.path,
                               f.message + " (the model's shape is the base's, " +
                                   (r.kind == RecipeKind::kFinetuning ? "model.restore_from_path)" : "model.language_model_path)")));
  if (!errors.empty()) throw RecipeError(errors);
}

void check_input_files(const Recipe& r) {
  namespace fs = std::filesystem;
  std::vector<std::string> errors;
  std::error_code ec;
  const std::string cwd = fs::current_path(ec).string();
  auto check = [&](const std::string& path, const std::string& file, const std::string& what) {
    if (fs::is_regular_file(file, ec)) return;
    std::string message = "expected an existing " + what + ", found \"" + file + "\"";
    if (fs::path(file).is_relative()) message += " (relative to the working directory " + cwd + ")";
    errors.push_back(located(r, path, message));
  };
  // A prompt-learning recipe may leave the tokenizer to the base's run.
  const auto& k = r.model.tokenizer;
  const bool pretraining = r.kind == RecipeKind::kPretraining;
  if (k.library == TokenizerLibrary::kMegatron) {
    if (!k.vocab_file.empty() || pretraining) check("model.tokenizer.vocab_file", k.vocab_file, "GPT-2 vocab file");
    if (!k.merge_file.empty() || pretraining) check("model.tokenizer.merge_file", k.merge_file, "GPT-2 merges file");
  } else if (k.model || pretraining) {
    const std::string file = k.model.value_or("");
    if (k.library == TokenizerLibrary::kSentencePiece)
      check("model.tokenizer.model", file, "SentencePiece model file");
    else if (!fs::is_directory(file, ec) || !fs::is_regular_file(fs::path(file) / "tokenizer.json", ec))
      check("model.tokenizer.model", file, "tokenizer.json (or a folder holding one)");
  }
  for (const auto& entry : r.model.data.data_prefix) {
    check("model.data.data_prefix", entry.path + ".bin", "indexed dataset file");
    check("model.data.data_prefix", entry.path + ".idx", "indexed dataset index");
  }
  for (const auto* list : {&r.model.data.train_ds, &r.model.data.validation_ds, &r.model.data.test_ds}) {
    const char* field = list == &r.model.data.train_ds        ? "model.data.train_ds"
                        : list == &r.model.data.validation_ds ? "model.data.validation_ds"
                                                              : "model.data.test_ds";
    for (const auto& file : *list) check(field, file, "JSONL file of records");
  }
  const auto& d = r.model.data;
  for (const auto& file : d.sft_train.file_names) check("model.data.train_ds.file_names", file, "JSONL file of records");
  for (const auto& file : d.sft_validation.file_names)
    check("model.data.validation_ds.file_names", file, "JSONL file of records");
  if (d.sft_train.chat_template)
    check("model.data.train_ds.chat_template", *d.sft_train.chat_template, "Jinja chat template file");
  if (!errors.empty()) throw RecipeError(errors);
}

}  // namespace loom::config
