// to_yaml(): the resolved recipe as YAML, written by a visitor over the schema.
#include <string>

#include "config/recipe.h"
#include "config/schema.h"
#include "config/tree.h"

namespace loom::config {

namespace {

using detail::Need;
using detail::Node;

Node to_node(int64_t v) { return Node::scalar_of(std::to_string(v)); }
Node to_node(double v) { return Node::scalar_of(detail::format_double(v)); }
Node to_node(bool v) { return Node::scalar_of(v ? "true" : "false"); }
Node to_node(const std::string& v) { return detail::string_node(v); }

template <class E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
Node to_node(E v) {
  const std::string name = detail::enum_name(v);
  return name == "null" ? Node{} : Node::scalar_of(name);
}

template <class T>
Node to_node(const std::optional<T>& v) {
  return v ? to_node(*v) : Node{};
}

Node to_node(const std::array<double, 2>& v) {
  Node n;
  n.kind = Node::Kind::kSequence;
  for (double x : v) n.items.push_back(to_node(x));
  return n;
}

Node to_node(const std::vector<std::string>& v) {
  Node n;
  n.kind = Node::Kind::kSequence;
  for (const auto& s : v) n.items.push_back(to_node(s));
  return n;
}

template <class T, std::enable_if_t<std::is_same_v<T, int64_t> || std::is_enum_v<T>, int> = 0>
Node to_node(const std::vector<T>& v) {
  Node n;
  n.kind = Node::Kind::kSequence;
  for (const auto& x : v) n.items.push_back(to_node(x));
  return n;
}

Node to_node(const TaskTemplate& t) {
  Node n = Node::map();
  n.set("taskname", to_node(t.taskname));
  n.set("prompt_template", to_node(t.prompt_template));
  n.set("prompt_template_fields", to_node(t.prompt_template_fields));
  n.set("total_virtual_tokens", to_node(t.total_virtual_tokens));
  n.set("virtual_token_splits", to_node(t.virtual_token_splits));
  n.set("answer_only_loss", to_node(t.answer_only_loss));
  n.set("answer_field", to_node(t.answer_field));
  n.set("truncate_field", to_node(t.truncate_field));
  return n;
}

Node to_node(const std::vector<TaskTemplate>& v) {
  Node n;
  n.kind = Node::Kind::kSequence;
  for (const auto& t : v) n.items.push_back(to_node(t));
  return n;
}

Node to_node(const std::vector<DataBlendEntry>& v) {
  Node n;
  n.kind = Node::Kind::kSequence;
  for (const auto& e : v) {
    n.items.push_back(to_node(e.weight));
    n.items.push_back(to_node(e.path));
  }
  return n;
}

struct Writer {
  Node root = Node::map();
  template <class T>
  void operator()(const std::string& path, T& value, Need) {
    const auto keys = detail::split_path(path);
    Node* cur = &root;
    for (size_t i = 0; i + 1 < keys.size(); ++i) {
      Node* next = cur->find(keys[i]);
      cur = next ? next : &cur->set(keys[i], Node::map());
    }
    cur->set(keys.back(), to_node(value));
  }
};

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

namespace detail {
Node recipe_tree(const Recipe& recipe) {
  Recipe copy = recipe;
  Writer writer;
  visit_recipe(copy, writer);
  return writer.root;
}
}  // namespace detail

std::string to_yaml(const Recipe& recipe) {
  std::string header = "# Loom recipe, fully resolved (defaults and derived values filled in)\n";
  if (!recipe.origin.file.empty()) header += "# source: " + one_line(recipe.origin.file) + "\n";
  for (const auto& o : recipe.origin.overrides) header += "# override: " + one_line(o) + "\n";
  return header + detail::emit_yaml(detail::recipe_tree(recipe));
}

}  // namespace loom::config
