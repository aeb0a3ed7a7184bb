#include "config/schema.h"

#include "config/suggest.h"
#include "config/tree.h"

namespace loom::config::detail {

template <>
const std::vector<EnumSpelling<Accelerator>>& enum_spellings<Accelerator>() {
  static const std::vector<EnumSpelling<Accelerator>> s = {{Accelerator::kCpu, {"cpu"}},
                                                           {Accelerator::kGpu, {"gpu"}}};
  return s;
}

template <>
const std::vector<EnumSpelling<Precision>>& enum_spellings<Precision>() {
  // Lightning spellings; "32", "16" and "bf16" are NeMo's.
  static const std::vector<EnumSpelling<Precision>> s = {{Precision::kFp32, {"32", "32-true"}},
                                                         {Precision::kBf16, {"bf16", "bf16-mixed"}},
                                                         {Precision::kFp16, {"16", "16-mixed"}}};
  return s;
}

template <>
const std::vector<EnumSpelling<RecomputeGranularity>>& enum_spellings<RecomputeGranularity>() {
  static const std::vector<EnumSpelling<RecomputeGranularity>> s = {
      {RecomputeGranularity::kNone, {"null"}},
      {RecomputeGranularity::kSelective, {"selective"}},
      {RecomputeGranularity::kFull, {"full"}}};
  return s;
}

template <>
const std::vector<EnumSpelling<RecomputeMethod>>& enum_spellings<RecomputeMethod>() {
  static const std::vector<EnumSpelling<RecomputeMethod>> s = {{RecomputeMethod::kNone, {"null"}},
                                                               {RecomputeMethod::kUniform, {"uniform"}},
                                                               {RecomputeMethod::kBlock, {"block"}}};
  return s;
}

template <>
const std::vector<EnumSpelling<OptimizerName>>& enum_spellings<OptimizerName>() {
  static const std::vector<EnumSpelling<OptimizerName>> s = {
      {OptimizerName::kAdam, {"adam"}},
      {OptimizerName::kFusedAdam, {"fused_adam"}},
      {OptimizerName::kDistributedFusedAdam, {"distributed_fused_adam"}},
      {OptimizerName::kAdamW, {"adamw"}}};
  return s;
}

template <>
const std::vector<EnumSpelling<SchedulerName>>& enum_spellings<SchedulerName>() {
  static const std::vector<EnumSpelling<SchedulerName>> s = {
      {SchedulerName::kCosineAnnealing, {"CosineAnnealing"}},
      {SchedulerName::kLinearDecay, {"LinearDecay", "WarmupAnnealing"}},
      {SchedulerName::kConstant, {"Constant", "WarmupPolicy"}}};
  return s;
}

template <>
const std::vector<EnumSpelling<TokenizerLibrary>>& enum_spellings<TokenizerLibrary>() {
  static const std::vector<EnumSpelling<TokenizerLibrary>> s = {{TokenizerLibrary::kMegatron, {"megatron"}},
                                                                 {TokenizerLibrary::kSentencePiece, {"sentencepiece"}},
                                                                 {TokenizerLibrary::kHuggingFace, {"huggingface"}}};
  return s;
}

template <>
const std::vector<EnumSpelling<VirtualPromptStyle>>& enum_spellings<VirtualPromptStyle>() {
  static const std::vector<EnumSpelling<VirtualPromptStyle>> s = {
      {VirtualPromptStyle::kPTuning, {"p-tuning"}}, {VirtualPromptStyle::kPromptTuning, {"prompt-tuning"}}};
  return s;
}

template <>
const std::vector<EnumSpelling<Normalization>>& enum_spellings<Normalization>() {
  static const std::vector<EnumSpelling<Normalization>> s = {{Normalization::kLayerNorm, {"layernorm"}},
                                                              {Normalization::kRmsNorm, {"rmsnorm"}}};
  return s;
}

template <>
const std::vector<EnumSpelling<PositionEmbedding>>& enum_spellings<PositionEmbedding>() {
  static const std::vector<EnumSpelling<PositionEmbedding>> s = {
      {PositionEmbedding::kLearnedAbsolute, {"learned_absolute"}}, {PositionEmbedding::kRope, {"rope"}}};
  return s;
}

template <>
const std::vector<EnumSpelling<Activation>>& enum_spellings<Activation>() {
  // NeMo 1.x spells the gated SiLU MLP "fast-swiglu" (one fused fc1 for gate and up) or
  // "swiglu"; both are the same function here.
  static const std::vector<EnumSpelling<Activation>> s = {{Activation::kGelu, {"gelu"}},
                                                           {Activation::kSwiglu, {"fast-swiglu", "swiglu"}}};
  return s;
}

template <>
const std::vector<EnumSpelling<PromptEncoderType>>& enum_spellings<PromptEncoderType>() {
  // NeMo spells them in capitals in code (PromptEncoderType.TPMLP) and lower case in configs.
  static const std::vector<EnumSpelling<PromptEncoderType>> s = {
      {PromptEncoderType::kEmbedding, {"embedding", "EMBEDDING"}},
      {PromptEncoderType::kMlp, {"mlp", "MLP"}},
      {PromptEncoderType::kLstm, {"lstm", "LSTM"}},
      {PromptEncoderType::kTpMlp, {"tpmlp", "TPMLP"}}};
  return s;
}

template <>
const std::vector<EnumSpelling<PromptInitMethod>>& enum_spellings<PromptInitMethod>() {
  static const std::vector<EnumSpelling<PromptInitMethod>> s = {{PromptInitMethod::kText, {"text"}},
                                                                {PromptInitMethod::kRandom, {"random"}}};
  return s;
}

const std::vector<std::pair<std::string, std::string>>& key_aliases() {
  static const std::vector<std::pair<std::string, std::string>> a = {
      {"exp_manager.checkpoint_callback_params.every_n_train_steps",
       "exp_manager.checkpoint_callback_params.every_n_steps"}};
  return a;
}

namespace {

struct IndexBuilder {
  KeyIndex index;
  void add_child(const std::string& parent, const std::string& name) {
    auto& kids = index.children[parent];
    for (const auto& k : kids)
      if (k == name) return;
    kids.push_back(name);
  }
  void add(const std::string& path, Need need) {
    index.fields.insert(path);
    index.need[path] = need;
    const auto keys = split_path(path);
    for (size_t i = 0; i < keys.size(); ++i) {
      const std::string parent = join_path(keys, i);
      if (i > 0) index.sections.insert(parent);
      add_child(parent, keys[i]);
    }
  }
  template <class T>
  void operator()(const std::string& path, T&, Need need) {
    add(path, need);
  }
};

}  // namespace

namespace {
KeyIndex build_key_index(RecipeKind kind) {
  IndexBuilder b;
  Recipe r;
  r.kind = kind;
  visit_recipe(r, b);
  for (const auto& [alias, canonical] : key_aliases()) {
    const auto keys = split_path(alias);
    b.add_child(join_path(keys, keys.size() - 1), keys.back());
    b.index.need[alias] = b.index.need[canonical];
  }
  return b.index;
}
}  // namespace

const KeyIndex& key_index(RecipeKind kind) {
  static const KeyIndex pretraining = build_key_index(RecipeKind::kPretraining);
  static const KeyIndex prompt_learning = build_key_index(RecipeKind::kPromptLearning);
  static const KeyIndex finetuning = build_key_index(RecipeKind::kFinetuning);
  return kind == RecipeKind::kPretraining ? pretraining : kind == RecipeKind::kPromptLearning ? prompt_learning : finetuning;
}

std::string suggest_key(const std::string& unknown_path, RecipeKind kind) {
  const KeyIndex& index = key_index(kind);
  const auto keys = split_path(unknown_path);
  const std::string& leaf = keys.back();
  // The same name under another section (e.g. trainer.micro_batch_size -> model.micro_batch_size).
  for (const auto& set : {&index.fields, &index.sections}) {
    for (const auto& known : *set) {
      const auto known_keys = split_path(known);
      if (known_keys.back() == leaf && known != unknown_path) return " (did you mean '" + known + "'?)";
    }
  }
  // Otherwise the closest name among the siblings in the deepest known section.
  size_t depth = keys.size() - 1;
  while (depth > 0 && !index.sections.count(join_path(keys, depth))) --depth;
  const std::string parent = join_path(keys, depth);
  auto it = index.children.find(parent);
  if (it == index.children.end()) return "";
  const std::string best = closest(keys[depth], it->second);
  if (best.empty()) return "";
  return " (did you mean '" + (parent.empty() ? best : parent + "." + best) + "'?)";
}

}  // namespace loom::config::detail
