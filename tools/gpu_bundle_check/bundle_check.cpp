// Uses each library Loom links or includes from gpu_bundle/prefix (gloo: its headers only).
// Prints "bundle check: ok" and exits 0 when every one of them works.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <gloo/config.h>  // headers only: c10d's ProcessGroupGloo.hpp includes gloo/*.h
#include <httplib.h>
#include <lzma.h>
#include <pcre2.h>
#include <sentencepiece_processor.h>
#include <utf8proc.h>
#include <yaml-cpp/yaml.h>
#include <zlib.h>
#include <zstd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

int main(int argc, char** argv) {
  CLI::App app{"bundle check"};
  std::string value = "a: 3";
  app.add_option("--yaml", value);
  CLI11_PARSE(app, argc, argv);
  const int a = YAML::Load(value)["a"].as<int>();
  const auto j = nlohmann::json::parse(fmt::format("{{\"a\": {}}}", a));
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>("\\p{L}+"), PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  // One call into each library that loom preprocess and loom serve link.
  sentencepiece::SentencePieceProcessor sp;
  const bool codecs = ZSTD_versionNumber() > 0 && zlibVersion() != nullptr && lzma_version_number() > 0;
  const bool text = utf8proc_version() != nullptr;  // and the SentencePiece processor above links
  httplib::Server server;
  const bool ok = a == 3 && j["a"] == 3 && re != nullptr && codecs && text && server.is_valid();
  pcre2_code_free(re);
  std::printf("bundle check: %s (yaml-cpp, fmt %d, nlohmann_json %d.%d.%d, CLI11 %s, PCRE2 %d.%d)\n",
              ok ? "ok" : "FAILED", FMT_VERSION, NLOHMANN_JSON_VERSION_MAJOR,
              NLOHMANN_JSON_VERSION_MINOR, NLOHMANN_JSON_VERSION_PATCH, CLI11_VERSION,
              PCRE2_MAJOR, PCRE2_MINOR);
  return ok ? 0 : 1;
}
