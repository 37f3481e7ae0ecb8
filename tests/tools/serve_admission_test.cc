// Admission on a real tessera-serve: a request that can never fit (more prompts than the queue
// holds, prompt + max_tokens beyond what the whole KV pool holds) is a 400 naming the limit,
// never a 429 the client would retry forever; a request's n choices count once against
// server.max_queued_requests, and n beyond scheduler.max_num_seqs runs in turns.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

using nlohmann::json;

struct Reply {
  int status = 0;
  json body;
};

Reply post(int port, const json& body) {
  const std::string raw = testing::http(port, "POST", "/v1/completions", body.dump());
  Reply r;
  if (raw.size() > 12) r.status = std::atoi(raw.substr(9, 3).c_str());
  const size_t at = raw.find("\r\n\r\n");
  if (at != std::string::npos) r.body = json::parse(raw.substr(at + 4), nullptr, false);
  return r;
}

std::string error_message(const Reply& r) {
  if (!r.body.is_object() || !r.body.contains("error")) return "";
  return r.body["error"].value("message", "");
}

TEST(ServeAdmission, MorePromptsThanTheQueueHoldsIsA400NamingTheLimit) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess server;
  ASSERT_TRUE(server.start(testing::tiny_llama_cpu_args({"--set", "server.max_queued_requests=4"}))) << server.log();
  json prompts = json::array();
  for (int i = 0; i < 5; ++i) prompts.push_back(json::array({1, 2, 3 + i}));
  const Reply too_many = post(server.port(), {{"prompt", prompts}, {"max_tokens", 2}});
  EXPECT_EQ(too_many.status, 400) << too_many.body.dump();
  EXPECT_NE(error_message(too_many).find("the request has 5 prompts but at most 4 requests can wait at once "
                                         "(server.max_queued_requests"),
            std::string::npos)
      << too_many.body.dump();
  // As many prompts as the queue holds are served.
  prompts.erase(prompts.begin());
  const Reply fits = post(server.port(), {{"prompt", prompts}, {"max_tokens", 2}});
  EXPECT_EQ(fits.status, 200) << fits.body.dump();
  EXPECT_EQ(fits.body["choices"].size(), 4u);
}

TEST(ServeAdmission, PromptPlusMaxTokensBeyondTheWholeKvPoolIsA400NamingThePool) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess server;
  // 4 blocks of 16 tokens: no sequence can ever grow past 64 tokens.
  ASSERT_TRUE(server.start(testing::tiny_llama_cpu_args({"--set", "cache.num_blocks=4"}))) << server.log();
  const Reply r = post(server.port(), {{"prompt", json::array({1, 2, 3, 4, 5, 6, 7, 8, 9, 10})}, {"max_tokens", 60}});
  EXPECT_EQ(r.status, 400) << r.body.dump();
  EXPECT_EQ(r.body["error"].value("code", ""), "context_length_exceeded") << r.body.dump();
  EXPECT_NE(error_message(r).find("maximum context length is 64 tokens. However, you requested 70 tokens"),
            std::string::npos)
      << r.body.dump();
  EXPECT_NE(error_message(r).find("(The limit is the 64 tokens the whole KV pool holds (4 blocks of 16 tokens"),
            std::string::npos)
      << r.body.dump();
  // The same n = 3 request within the pool runs (its choices take turns in the pool).
  const Reply ok = post(server.port(), {{"prompt", json::array({1, 2, 3})}, {"max_tokens", 50}, {"n", 3},
                                        {"temperature", 0}});
  EXPECT_EQ(ok.status, 200) << ok.body.dump();
  EXPECT_EQ(ok.body["choices"].size(), 3u);
}

TEST(ServeAdmission, NBeyondMaxNumSeqsRunsInTurnsAndCountsOnceInTheQueue) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess server;
  ASSERT_TRUE(server.start(testing::tiny_llama_cpu_args({"--set", "server.max_queued_requests=2", "--set",
                                           "scheduler.max_num_seqs=1", "--set", "cache.num_blocks=64"})))
      << server.log();
  // n = 128 (the most choices) against a queue of 2 and one running sequence: served.
  const Reply wide = post(server.port(), {{"prompt", json::array({1, 2, 3})}, {"max_tokens", 2}, {"n", 128}});
  ASSERT_EQ(wide.status, 200) << wide.body.dump();
  EXPECT_EQ(wide.body["choices"].size(), 128u);
  const Reply over = post(server.port(), {{"prompt", json::array({1, 2, 3})}, {"max_tokens", 2}, {"n", 129}});
  EXPECT_EQ(over.status, 400) << over.body.dump();

  // While a request's forked choices wait for their turn, two more requests are admitted:
  // the waiting choices are one request, not 15 queue entries.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string body =
      json{{"prompt", json::array({1, 2, 3})}, {"max_tokens", 24}, {"n", 16}, {"stream", true}}.dump();
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::string stream;
  char buf[4096];
  while (stream.find("data: {") == std::string::npos) {  // the first token: the fork is done
    const ssize_t n = read(fd, buf, sizeof(buf));
    ASSERT_GT(n, 0) << stream;
    stream.append(buf, static_cast<size_t>(n));
  }
  Reply second, third;
  std::thread a([&] { second = post(server.port(), {{"prompt", json::array({4, 5})}, {"max_tokens", 2}}); });
  std::thread b([&] { third = post(server.port(), {{"prompt", json::array({6, 7})}, {"max_tokens", 2}}); });
  a.join();
  b.join();
  EXPECT_EQ(second.status, 200) << second.body.dump();
  EXPECT_EQ(third.status, 200) << third.body.dump();
  for (ssize_t n; stream.find("data: [DONE]") == std::string::npos && (n = read(fd, buf, sizeof(buf))) > 0;) {
    stream.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  EXPECT_NE(stream.find("data: [DONE]"), std::string::npos);
}

}  // namespace
}  // namespace tessera
