#include "config/recipe_fields.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <stdexcept>
#include <type_traits>

#include "config/schema.h"
#include "config/tree.h"

namespace loom::config {

namespace {

using detail::Need;
using detail::Node;

// The enum behind a field's type (E, std::optional<E> or std::vector<E>); void for other types.
template <class T>
struct EnumOf {
  using type = std::conditional_t<std::is_enum_v<T>, T, void>;
};
template <class T>
struct EnumOf<std::optional<T>> : EnumOf<T> {};
template <class T>
struct EnumOf<std::vector<T>> : EnumOf<T> {};

template <class T>
std::vector<std::vector<std::string>> choices_of() {
  std::vector<std::vector<std::string>> out;
  using E = typename EnumOf<T>::type;
  if constexpr (!std::is_void_v<E>) {
    for (const auto& s : detail::enum_spellings<E>())
      if (s.names.front() != "null") out.push_back(s.names);
  }
  return out;
}

// A value of the dumped tree as one line of YAML (defaults are scalars or lists of scalars).
std::string flow_text(const Node& value, const std::string& path) {
  Node holder = Node::map();
  holder.set("x", value);
  std::string text = detail::emit_yaml(holder);
  if (text.rfind("x: ", 0) != 0 || text.find('\n') != text.size() - 1)
    throw std::logic_error("recipe_fields: the default of " + path + " is not a one-line YAML value: " + text);
  return text.substr(3, text.size() - 4);
}

struct FieldLister {
  const Node& root;
  std::vector<RecipeField> fields;

  template <class T>
  void operator()(const std::string& path, T&, Need need) {
    RecipeField f;
    f.path = path;
    f.choices = choices_of<T>();
    switch (need) {
      case Need::kRequired: f.need = "required"; break;
      case Need::kDerived: f.need = "derived"; break;
      case Need::kDefault: {
        f.need = "default";
        const Node* cur = &root;
        for (const auto& key : detail::split_path(path)) cur = cur ? cur->find(key) : nullptr;
        if (!cur) throw std::logic_error("recipe_fields: " + path + " is missing from the dumped recipe");
        f.default_yaml = flow_text(*cur, path);
        break;
      }
    }
    fields.push_back(std::move(f));
  }
};

}  // namespace

std::vector<RecipeField> recipe_fields(RecipeKind kind) {
  Recipe r;
  r.kind = kind;
  const Node root = detail::recipe_tree(r);
  FieldLister lister{root, {}};
  detail::visit_recipe(r, lister);
  return std::move(lister.fields);
}

std::string recipe_fields_json() {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [name, kind] : {std::pair{"pretraining", RecipeKind::kPretraining},
                                   std::pair{"prompt_learning", RecipeKind::kPromptLearning},
                                   std::pair{"finetuning", RecipeKind::kFinetuning}}) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& f : recipe_fields(kind)) {
      nlohmann::ordered_json j;
      j["field"] = f.path;
      j["need"] = f.need;
      j["default"] = f.need == "default" ? nlohmann::ordered_json(f.default_yaml) : nlohmann::ordered_json();
      j["choices"] = f.choices;
      list.push_back(std::move(j));
    }
    out[name] = std::move(list);
  }
  return out.dump(1);
}

}  // namespace loom::config
