// The request assembler of `loom serve`'s HTTP front (serve/http_intake.h): a request fed in
// pieces of any size gives the same decoded request (chunked bodies become Content-Length ones),
// the bytes after it stay for the next one, and each limit or malformed part fails with its
// status and field, a chunked body as soon as its size passes the limit.
#include <catch2/catch.hpp>

#include <string>

#include "serve/http_intake.h"

using loom::serve::RequestAssembler;

namespace {

// Feeds `raw` in pieces of `piece` bytes; returns the assembler and what was left over.
std::pair<RequestAssembler, std::string> assemble(const std::string& raw, size_t piece, size_t max_body = 1000) {
  RequestAssembler a(512, max_body);
  std::string in;
  for (size_t at = 0; at < raw.size(); at += piece) {
    in.append(raw, at, piece);
    if (a.feed(in)) {
      if (at + piece < raw.size()) in.append(raw, at + piece, std::string::npos);
      break;
    }
  }
  return {std::move(a), in};
}

}  // namespace

TEST_CASE("RequestAssembler: chunked and Content-Length bodies in pieces of any size") {
  const std::string expected =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello world";
  const std::string chunked =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
      "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: t\r\n\r\nGET /health HTTP/1.1\r\n";
  const std::string plain = "\r\nPOST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello worldGET";
  for (size_t piece : {size_t{1}, size_t{2}, size_t{7}, size_t{1000}}) {
    INFO("pieces of " << piece);
    auto [a, rest] = assemble(chunked, piece);
    REQUIRE(a.done());
    REQUIRE(a.take_request() == expected);
    REQUIRE(rest == "GET /health HTTP/1.1\r\n");  // the next request's start
    auto [b, rest_b] = assemble(plain, piece);
    REQUIRE(b.done());
    REQUIRE(b.take_request() == expected);
    REQUIRE(rest_b == "GET");
  }
  // 100 Continue is asked for once, after the head, when a body is coming.
  RequestAssembler c(512, 1000);
  std::string head = chunked.substr(0, chunked.find("\r\n\r\n") + 4);
  REQUIRE_FALSE(c.feed(head));
  REQUIRE(c.wants_continue());
  REQUIRE_FALSE(c.wants_continue());
  auto [get, none] = assemble("GET /health HTTP/1.1\r\n\r\n", 3);
  REQUIRE(get.done());
  REQUIRE(get.take_request() == "GET /health HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
}

TEST_CASE("RequestAssembler: limits and malformed requests fail with their status and field") {
  struct Case {
    std::string raw;
    int status;
    std::string field;
  };
  const std::string post = "POST / HTTP/1.1\r\n";
  const Case cases[] = {
      {post + "Content-Length: 1001\r\n\r\n", 413, "body"},  // refused before any body byte
      {post + "Transfer-Encoding: chunked\r\n\r\n3e8\r\n" + std::string(1000, 'a') + "\r\n1\r\n", 413, "body"},
      {post + "X: " + std::string(600, 'x'), 431, "headers"},  // no end of the head within 512 bytes
      {post + "Transfer-Encoding: gzip\r\n\r\n", 501, "Transfer-Encoding"},
      {post + "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400, "Content-Length"},
      {post + "Content-Length: 3\r\nContent-Length: 4\r\n\r\n", 400, "Content-Length"},
      {post + "Content-Length: -3\r\n\r\n", 400, "Content-Length"},
      {post + "Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "body"},
      {post + "Transfer-Encoding: chunked\r\n\r\n2\r\nabXY", 400, "body"},
      {"NONSENSE\r\n\r\n", 400, "request line"},
      {post + "no colon here\r\n\r\n", 400, "headers"},
  };
  for (const auto& c : cases) {
    INFO(c.raw.substr(0, 120));
    auto [a, rest] = assemble(c.raw, 5);
    REQUIRE(a.failed());
    REQUIRE(a.status() == c.status);
    REQUIRE(a.field() == c.field);
    REQUIRE_FALSE(a.message().empty());
  }
  // The chunked body is refused at the chunk that passes the limit, before its bytes arrive.
  RequestAssembler early(512, 1000);
  std::string in = post + "Transfer-Encoding: chunked\r\n\r\n3e8\r\n";
  REQUIRE_FALSE(early.feed(in));
  in += std::string(1000, 'a') + "\r\n3e8\r\n";
  REQUIRE(early.feed(in));
  REQUIRE(early.status() == 413);
}
