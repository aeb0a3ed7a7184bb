// Chat templates of `loom serve` (serve/chat_template.h, minja): Jinja as transformers renders
// it (trim_blocks, lstrip_blocks, bos/eos tokens, add_generation_prompt), the template's own
// refusals as ChatTemplateError, and a template that does not parse named by its origin.
// (tests/python/test_serve_api.py compares renderings with transformers' apply_chat_template.)
#include <catch2/catch.hpp>

#include "serve/chat_template.h"

using loom::serve::ChatTemplate;
using loom::serve::ChatTemplateError;

TEST_CASE("ChatTemplate: renders messages with the tokens and the generation prompt") {
  const ChatTemplate t(
      "{{ bos_token }}{% for m in messages %}\n"
      "  {% if m.role == 'user' %}Q: {{ m.content | trim }}{% else %}A: {{ m.content }}{{ eos_token }}{% endif %}\n"
      "{% endfor %}{% if add_generation_prompt %}A:{% endif %}",
      "<s>", "</s>", "inline");
  const auto messages = nlohmann::json::parse(R"([{"role": "user", "content": " hi "}, {"role": "assistant",
      "content": "yo"}, {"role": "user", "content": "again"}])");
  // trim_blocks drops the newline after each block tag and lstrip_blocks the indentation before
  // one, as jinja2 renders it for transformers.
  CHECK(t.render(messages, true) == "<s>Q: hiA: yo</s>Q: againA:");
  CHECK(t.render(messages, false) == "<s>Q: hiA: yo</s>Q: again");
}

TEST_CASE("ChatTemplate: raise_exception is the template's refusal and bad syntax names the file") {
  const ChatTemplate t("{% if messages | length > 1 %}{{ raise_exception('one message only') }}{% endif %}ok", "", "",
                       "inline");
  CHECK(t.render(nlohmann::json::parse(R"([{"role": "user", "content": "a"}])"), true) == "ok");
  const auto two = nlohmann::json::parse(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  CHECK_THROWS_AS(t.render(two, true), ChatTemplateError);
  CHECK_THROWS_WITH(t.render(two, true), Catch::Matchers::Contains("one message only"));
  const auto broken = [] { ChatTemplate("{% for m in messages %}", "", "", "RUN/tokenizer/chat_template.jinja"); };
  CHECK_THROWS_AS(broken(), std::invalid_argument);
  CHECK_THROWS_WITH(broken(), Catch::Matchers::Contains("RUN/tokenizer/chat_template.jinja"));
}
