#include "serve/chat_template.h"

// minja (third_party/minja, fetched by tools/setup.sh) defines a global `json` alias: it is
// included in this file only. Its chat_template class is not used: it probes each template with
// made-up conversations (printing to stderr when they fail) to rewrite messages for templates
// that lack a feature, and transformers renders the messages as they are.
#include <minja/minja.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <mutex>
#include <sstream>

namespace loom::serve {

struct ChatTemplate::Impl {
  std::shared_ptr<minja::TemplateNode> root;
  std::mutex mutex;  // one render at a time: minja does not promise concurrent renders
};

ChatTemplate::ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token,
                           std::string origin)
    : impl_(std::make_unique<Impl>()), bos_(std::move(bos_token)), eos_(std::move(eos_token)),
      origin_(std::move(origin)) {
  try {
    // transformers' Jinja environment: trim_blocks and lstrip_blocks, no kept trailing newline.
    impl_->root = minja::Parser::parse(source, minja::Options{/*trim_blocks=*/true, /*lstrip_blocks=*/true,
                                                              /*keep_trailing_newline=*/false});
  } catch (const std::exception& e) {
    throw std::invalid_argument(origin_ + ": the chat template does not parse: " + e.what());
  }
}

ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt) const {
  // minja's values are ordered JSON.
  auto context = minja::Context::make(minja::Value(nlohmann::ordered_json{
      {"messages", nlohmann::ordered_json::parse(messages.dump())}, {"add_generation_prompt", add_generation_prompt}}));
  context->set("bos_token", bos_);
  context->set("eos_token", eos_);
  // transformers' strftime_now: the local time now, formatted as strftime formats it.
  const auto now = std::chrono::system_clock::now();
  context->set("strftime_now", minja::Value::callable([now](const std::shared_ptr<minja::Context>&,
                                                             minja::ArgumentsValue& args) {
    args.expectArgs("strftime_now", {1, 1}, {0, 0});
    const std::time_t time = std::chrono::system_clock::to_time_t(now);
    std::tm local{};
    localtime_r(&time, &local);
    std::ostringstream out;
    out << std::put_time(&local, args.args[0].get<std::string>().c_str());
    return minja::Value(out.str());
  }));
  std::lock_guard<std::mutex> lock(impl_->mutex);
  try {
    return impl_->root->render(context);
  } catch (const std::exception& e) {
    // minja adds the template's source around each enclosing block: the first line, without
    // its position, is the message (raise_exception's text).
    std::string message = e.what();
    message.resize(std::min(message.size(), message.find('\n')));
    if (const size_t at = message.rfind(" at row "); at != std::string::npos) message.resize(at);
    throw ChatTemplateError(message);
  }
}

std::unique_ptr<ChatTemplate> read_chat_template(const std::string& path, std::string bos_token,
                                                 std::string eos_token) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument(path + ": cannot read the chat template");
  std::ostringstream text;
  text << in.rdbuf();
  return std::make_unique<ChatTemplate>(text.str(), std::move(bos_token), std::move(eos_token), path);
}

}  // namespace loom::serve
