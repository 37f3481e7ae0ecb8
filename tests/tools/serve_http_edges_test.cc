// The HTTP front end's edges on a real tessera-serve child (kjv-llama, which has a tokenizer),
// with raw bytes over a loopback socket: framings it cannot read are refused before their
// body (so the body is never parsed as a next request), HTTP/1.1 needs Host, CORS for the
// origins in server.http.cors_origins (preflight included), HEAD on GET routes, and vLLM's
// /tokenize, /detokenize and /v1/models/{id}.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "common/tokenizer/tokenizer.h"
#include "tests/test_support.h"
#include "tests/tools/raw_http.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

using nlohmann::json;
using testing::raw_exchange;
using testing::RawResponse;
using testing::split_responses;

constexpr const char* kAllowed = "https://app.example";

class ServeHttpEdges : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (testing::fixtures_dir().empty()) return;
    server_ = new testing::ServeProcess();
    if (!server_->start({"--model", testing::fixtures_dir() + "/kjv-llama", "--set", "worker.backend=cpu", "--set",
                         "worker.threads=1", "--set", "cache.num_blocks=64", "--set",
                         std::string("server.http.cors_origins=[\"") + kAllowed + "\"]"})) {
      ADD_FAILURE() << server_->log();
      delete server_;
      server_ = nullptr;
    }
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    TESSERA_REQUIRE_FIXTURES();
    ASSERT_NE(server_, nullptr);
  }
  int port() const { return server_->port(); }

  // One request with Connection: close; its (single) response.
  RawResponse one(const std::string& request, bool head = false) {
    bool closed = false;
    const std::string raw = raw_exchange(port(), request, &closed);
    EXPECT_TRUE(closed) << "the server kept the connection open:\n" << raw;
    const std::vector<RawResponse> all = split_responses(raw, head);
    EXPECT_EQ(all.size(), 1u) << raw;
    return all.empty() ? RawResponse{} : all[0];
  }
  static std::string post(const std::string& path, const std::string& body, const std::string& extra = "") {
    return "POST " + path + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\n" + extra +
           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  }

  static testing::ServeProcess* server_;
};
testing::ServeProcess* ServeHttpEdges::server_ = nullptr;

TEST_F(ServeHttpEdges, UnsupportedTransferEncodingIsRefusedAndItsBodyNeverReadAsARequest) {
  // Before the fix the body below was answered as a second request (200 from /health).
  for (const std::string te : {"gzip", "gzip, chunked", "deflate"}) {
    const std::string smuggled = "GET /health HTTP/1.1\r\nHost: t\r\n\r\n";
    bool closed = false;
    const std::string raw = raw_exchange(
        port(), "POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: " + te + "\r\n\r\n" + smuggled, &closed);
    const std::vector<RawResponse> all = split_responses(raw);
    ASSERT_EQ(all.size(), 1u) << te << ":\n" << raw;
    EXPECT_EQ(all[0].status, 501) << te;
    EXPECT_NE(all[0].body.find("Transfer-Encoding"), std::string::npos) << all[0].body;
    EXPECT_TRUE(closed) << te;
  }
  // chunked itself still works.
  const std::string body = R"({"prompt":"In the beginning","max_tokens":2,"temperature":0})";
  char size[16];
  std::snprintf(size, sizeof(size), "%zx", body.size());
  const RawResponse ok = one("POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: "
                             "application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
                             std::string(size) + "\r\n" + body + "\r\n0\r\n\r\n");
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST_F(ServeHttpEdges, CompressedBodyIs415WithAcceptEncoding) {
  const RawResponse r = one(post("/v1/completions", "\x1f\x8b\x08\x00", "Content-Encoding: gzip\r\n"));
  EXPECT_EQ(r.status, 415) << r.body;
  EXPECT_EQ(r.header("accept-encoding"), "identity");
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "unsupported_content_encoding");
  const RawResponse identity =
      one(post("/v1/completions", R"({"prompt":"In","max_tokens":1})", "Content-Encoding: identity\r\n"));
  EXPECT_EQ(identity.status, 200) << identity.body;
}

TEST_F(ServeHttpEdges, Http11RequiresExactlyOneHost) {
  const RawResponse none = one("GET /health HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(none.status, 400);
  EXPECT_NE(none.body.find("Host"), std::string::npos) << none.body;
  const RawResponse two = one("GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(two.status, 400);
  // HTTP/1.0 has no Host requirement.
  const RawResponse old = one("GET /health HTTP/1.0\r\n\r\n");
  EXPECT_EQ(old.status, 200) << old.body;
}

TEST_F(ServeHttpEdges, ABodyIsParsedWholeAndANulByteIsNotItsEnd) {
  // Before the fix the parser stopped at the NUL and the rest was ignored: 200.
  for (const auto& [path, value] : std::vector<std::pair<std::string, std::string>>{
           {"/v1/completions", R"({"prompt":"In","max_tokens":3})"}, {"/tokenize", R"({"prompt":"In the beginning"})"}}) {
    const RawResponse r = one(post(path, value + '\0' + R"({"bogus":1})"));
    EXPECT_EQ(r.status, 400) << path << ": " << r.body;
    EXPECT_NE(r.body.find("NUL byte at offset " + std::to_string(value.size())), std::string::npos) << r.body;
    // Anything after the value other than whitespace is refused; whitespace is fine.
    EXPECT_EQ(one(post(path, value + " x")).status, 400) << path;
    EXPECT_EQ(one(post(path, value + " \r\n\t")).status, 200) << path;
  }
  const std::string chat = std::string(R"({"messages":[{"role":"user","content":"In"}],"max_tokens":2})") + '\0';
  EXPECT_EQ(one(post("/v1/chat/completions", chat)).status, 400);
}

TEST_F(ServeHttpEdges, TwoAuthorizationHeadersAre400) {
  // Before the fix the first one won.
  for (const std::string path : {"/v1/models", "/health"}) {
    const RawResponse r = one("GET " + path +
                              " HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer a\r\n"
                              "Authorization: Bearer b\r\n\r\n");
    EXPECT_EQ(r.status, 400) << path << ": " << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["code"], "duplicate_authorization") << r.body;
  }
  EXPECT_EQ(one("GET /v1/models HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer a\r\n\r\n").status,
            200);
}

TEST_F(ServeHttpEdges, CorsHeadersOnlyForAllowedOriginsAndPreflightAnswered) {
  const RawResponse allowed = one(std::string("GET /health HTTP/1.1\r\nHost: t\r\nOrigin: ") + kAllowed +
                                  "\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(allowed.status, 200);
  EXPECT_EQ(allowed.header("access-control-allow-origin"), kAllowed);
  EXPECT_EQ(allowed.header("vary"), "Origin");
  const RawResponse other =
      one("GET /health HTTP/1.1\r\nHost: t\r\nOrigin: https://evil.example\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(other.status, 200);
  EXPECT_EQ(other.header("access-control-allow-origin"), "");
  // Errors carry the grant too, so the page's script can read them.
  const RawResponse bad = one(post("/v1/completions", R"({"prompt":"x","max_tokens":0})",
                                   std::string("Origin: ") + kAllowed + "\r\n"));
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.header("access-control-allow-origin"), kAllowed);

  const std::string preflight = std::string("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: t\r\nOrigin: ") +
                                kAllowed +
                                "\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: "
                                "Authorization, Content-Type\r\nConnection: close\r\n\r\n";
  const RawResponse pre = one(preflight, true);
  EXPECT_EQ(pre.status, 204);
  EXPECT_EQ(pre.header("access-control-allow-origin"), kAllowed);
  EXPECT_EQ(pre.header("access-control-allow-methods"), "POST, OPTIONS");
  EXPECT_EQ(pre.header("access-control-allow-headers"), "authorization, content-type");
  EXPECT_FALSE(pre.header("access-control-max-age").empty());
  const RawResponse refused = one(
      "OPTIONS /v1/completions HTTP/1.1\r\nHost: t\r\nOrigin: https://evil.example\r\nAccess-Control-Request-Method: "
      "POST\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(refused.status, 403);
  EXPECT_EQ(refused.header("access-control-allow-origin"), "");
  // A plain OPTIONS (no CORS) says what the route allows; an unknown route is a 404.
  const RawResponse plain = one("OPTIONS /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", true);
  EXPECT_EQ(plain.status, 204);
  EXPECT_EQ(plain.header("allow"), "GET, HEAD, OPTIONS");
  EXPECT_EQ(one("OPTIONS /nowhere HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").status, 404);
}

TEST_F(ServeHttpEdges, HeadOnGetRoutesHasTheHeadersButNoBody) {
  for (const char* path : {"/health", "/v1/models", "/v1/models/kjv-llama"}) {
    const RawResponse get = one(std::string("GET ") + path + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    bool closed = false;
    const std::string raw =
        raw_exchange(port(), std::string("HEAD ") + path + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", &closed);
    const std::vector<RawResponse> heads = split_responses(raw, true);
    ASSERT_EQ(heads.size(), 1u) << raw;
    EXPECT_EQ(heads[0].status, 200) << path;
    EXPECT_EQ(heads[0].header("content-length"), std::to_string(get.body.size())) << path;
    EXPECT_EQ(raw.substr(raw.find("\r\n\r\n") + 4), "") << "HEAD " << path << " sent a body";
  }
  // Two HEADs then a GET on one kept-alive connection: each answer is framed right.
  const std::string raw = raw_exchange(port(),
                                       "HEAD /health HTTP/1.1\r\nHost: t\r\n\r\nHEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\n"
                                       "GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(raw.substr(raw.rfind("\r\n\r\n") + 4), R"({"status":"ok"})") << raw;
  const RawResponse post_only = one("HEAD /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", true);
  EXPECT_EQ(post_only.status, 405);
  EXPECT_EQ(post_only.header("allow"), "POST");
}

TEST_F(ServeHttpEdges, TokenizeAndDetokenizeAsVllmHasThem) {
  auto tok = Tokenizer::load(testing::fixtures_dir() + "/kjv-llama");
  ASSERT_TRUE(tok.is_ok());
  const std::string text = "In the beginning God created the heaven and the earth.";
  const RawResponse r = one(post("/tokenize", json{{"prompt", text}, {"return_token_strs", true}}.dump()));
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  const std::vector<int32_t> expected = tok.value()->encode(text, true);  // add_special_tokens defaults to true
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), expected);
  EXPECT_EQ(j["count"], expected.size());
  EXPECT_GT(j["max_model_len"].get<int>(), 0);
  ASSERT_EQ(j["token_strs"].size(), expected.size());
  EXPECT_EQ(j["token_strs"][1], tok.value()->id_to_token(expected[1]));

  const RawResponse plain = one(post("/tokenize", json{{"prompt", text}, {"add_special_tokens", false}}.dump()));
  const json pj = json::parse(plain.body);
  EXPECT_EQ(pj["tokens"].get<std::vector<int32_t>>(), tok.value()->encode(text, false));
  EXPECT_TRUE(pj["token_strs"].is_null());
  const RawResponse back = one(post("/detokenize", json{{"tokens", pj["tokens"]}, {"model", "kjv-llama"}}.dump()));
  ASSERT_EQ(back.status, 200) << back.body;
  EXPECT_EQ(json::parse(back.body)["prompt"], text);

  const RawResponse chat =
      one(post("/tokenize", json{{"messages", {{{"role", "user"}, {"content", "Who made the earth?"}}}}}.dump()));
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_GT(json::parse(chat.body)["count"].get<int>(), 5);

  // Every mistake is a 400 (or 404 for another model) naming the field.
  struct Bad {
    std::string path, body, param;
    int status;
  };
  for (const Bad& b : std::vector<Bad>{{"/tokenize", R"({"prompt":"x","bogus":1})", "bogus", 400},
                                       {"/tokenize", R"({"prompt":5})", "prompt", 400},
                                       {"/tokenize", R"({"prompt":"x","messages":[]})", "messages", 400},
                                       {"/tokenize", R"({"prompt":"x","model":"gpt-4"})", "model", 404},
                                       {"/detokenize", R"({"tokens":[1,-3]})", "tokens[1]", 400},
                                       {"/detokenize", R"({"tokens":"1 2"})", "tokens", 400}}) {
    const RawResponse e = one(post(b.path, b.body));
    EXPECT_EQ(e.status, b.status) << b.body << " -> " << e.body;
    EXPECT_EQ(json::parse(e.body)["error"]["param"], b.param) << e.body;
  }
}

TEST_F(ServeHttpEdges, ModelsByIdAnswersTheServedModelOnly) {
  const RawResponse card = one("GET /v1/models/kjv-llama HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  ASSERT_EQ(card.status, 200) << card.body;
  const json j = json::parse(card.body);
  EXPECT_EQ(j["id"], "kjv-llama");
  EXPECT_EQ(j["object"], "model");
  EXPECT_GT(j["max_model_len"].get<int>(), 0);
  const RawResponse missing = one("GET /v1/models/gpt-4 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(json::parse(missing.body)["error"]["code"], "model_not_found");
}

}  // namespace
}  // namespace tessera
