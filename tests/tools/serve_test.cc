// tessera-serve as an operator runs it: the real program with its real worker processes,
// a real HTTP client over loopback, and a clean drain on SIGTERM.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <thread>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"
#include "tools/client/zmq_client.h"

namespace tessera {
namespace {

using testing::http;

// A model whose every layer has a sliding window (Mistral's, 16 tokens here) gives back a
// sequence's KV blocks once the window has moved past them, and /metrics counts them (that
// the tokens stay the goldens' is tested through the engine, engine_batching_test.cc).
TEST(Serve, SlidingWindowModelReleasesBlocksAndCountsThem) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = testing::fixtures_dir() + "/tiny-mistral-swa";
  std::ifstream in(model + "/goldens/index.json");
  const auto c = nlohmann::json::parse(in)["cases"][4];  // 64 prompt tokens + 24: 5.5 windows
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", model, "--set", "cache.block_size=4"})) << server.log();
  nlohmann::json req = {{"model", "tiny-mistral-swa"}, {"prompt", c["prompt_ids"]}, {"max_tokens", 24},
                        {"temperature", 0}};
  const std::string r = testing::http_body(http(server.port(), "POST", "/v1/completions", req.dump()));
  const auto body = nlohmann::json::parse(r, nullptr, false);
  ASSERT_FALSE(body.is_discarded()) << r;
  EXPECT_EQ(body["usage"]["completion_tokens"], 24) << r;
  const std::string metrics = testing::http_body(http(server.port(), "GET", "/metrics"));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(metrics, m, std::regex(R"(tessera:kv_window_released_blocks_total\{[^}]*\} (\d+))")))
      << metrics;
  // 88 tokens in blocks of 4 = 22 blocks; at most 5 are held at the end (the window's 16
  // keys span 5 blocks), so at least 17 went back early.
  EXPECT_GE(std::stoi(m[1]), 17) << metrics;
  std::cout << "[ REPORT   ] tiny-mistral-swa, 88 tokens, block size 4: " << m[1]
            << " KV blocks released by the window" << std::endl;
}

// A server takes requests before it is warm: one sent as soon as it does (while it warms up,
// most often, which ends the warm-up: its sequences are dropped before the request runs) is
// answered with the tokens a warm server gives, the goldens'.
TEST(Serve, ARequestSentAsSoonAsTheServerTakesRequestsGetsTheGoldenTokens) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = testing::fixtures_dir() + "/kjv-llama";
  std::ifstream in(model + "/goldens/index.json");
  const auto golden = nlohmann::json::parse(in)["cases"][1];
  const nlohmann::json req = {{"model", "kjv-llama"}, {"prompt", golden["prompt_ids"]},
                              {"max_tokens", golden["greedy_ids"].size()}, {"temperature", 0}};
  testing::ServeProcess server;
  server.set_ready_line("taking requests on http://127\\.0\\.0\\.1:(\\d+)");
  ASSERT_TRUE(server.start({"--model", model})) << server.log();
  for (const char* when : {"first", "once serving"}) {
    const std::string r = http(server.port(), "POST", "/v1/completions", req.dump());
    ASSERT_EQ(testing::http_status(r), 200) << when << ": " << r << server.log();
    const auto body = nlohmann::json::parse(testing::http_body(r));
    EXPECT_EQ(body["usage"]["completion_tokens"], golden["greedy_ids"].size()) << when;
    std::string text = body["choices"][0]["text"];
    if (!text.empty() && text[0] == ' ') text.erase(0, 1);
    EXPECT_EQ(text, golden["greedy_text"].get<std::string>()) << when;
    // Serving now: the warm-up ended (cut short, or run to its end before the request came).
    EXPECT_NE(server.log().find("listening on http://127.0.0.1:" + std::to_string(server.port())), std::string::npos)
        << server.log();
  }
  std::smatch warm_up;
  const std::string log = server.log();
  ASSERT_TRUE(std::regex_search(log, warm_up, std::regex("warm-up: [^\n]*"))) << log;
  std::cout << "[ REPORT   ] " << warm_up[0] << std::endl;
}

TEST(Serve, DefaultModelAnswersOpenAIRequestsAndDrainsOnSigterm) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-serve");
  const std::string log = dir + "/serve.log";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    freopen(log.c_str(), "w", stderr);
    const std::string bin = testing::bin_dir() + "/tessera-serve";
    const std::string control = "server.control=ipc://" + dir + "/control.ipc";
    const std::string zmq_client = "server.zmq_client=ipc://" + dir + "/client.ipc";
    execl(bin.c_str(), bin.c_str(), "--port", "0", "--set", control.c_str(), "--set", zmq_client.c_str(), nullptr);
    _exit(127);
  }
  // The contract: one line "listening on http://HOST:PORT" once ready.
  int port = 0;
  const std::regex listening("listening on http://127\\.0\\.0\\.1:(\\d+)");
  for (int i = 0; i < 600 && port == 0; ++i) {
    std::smatch m;
    const std::string text = testing::read_file(log);
    if (std::regex_search(text, m, listening)) port = std::stoi(m[1]);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GT(port, 0) << testing::read_file(log);

  std::ifstream in(testing::fixtures_dir() + "/kjv-llama/goldens/index.json");
  const auto golden = nlohmann::json::parse(in)["cases"][1];  // "And the LORD said unto Moses,"
  nlohmann::json req = {{"model", "kjv-llama"}, {"prompt", golden["prompt_text"]},
                        {"max_tokens", golden["greedy_ids"].size()}, {"temperature", 0}};
  const std::string resp = http(port, "POST", "/v1/completions", req.dump());
  ASSERT_NE(resp.find("200 OK"), std::string::npos) << resp;
  auto j = nlohmann::json::parse(testing::http_body(resp));
  std::string text = j["choices"][0]["text"];
  // The continuation carries its leading space; the golden decode of the output alone does not.
  if (!text.empty() && text[0] == ' ') text.erase(0, 1);
  EXPECT_EQ(text, golden["greedy_text"].get<std::string>());
  EXPECT_EQ(j["usage"]["completion_tokens"], golden["greedy_ids"].size());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");

  // The same request through the ZeroMQ client API.
  EXPECT_NE(testing::read_file(log).find("zmq clients on ipc://" + dir + "/client.ipc"), std::string::npos);
  {
    auto zc = ZmqClient::connect("ipc://" + dir + "/client.ipc");
    ASSERT_TRUE(zc.is_ok()) << zc.status().to_string();
    auto id = zc.value()->submit(ZmqRequestKind::kCompletion, req.dump());
    ASSERT_TRUE(id.is_ok());
    std::string ztext;
    for (;;) {
      auto ev = zc.value()->next_event(std::chrono::seconds(60));
      ASSERT_TRUE(ev.is_ok()) << ev.status().to_string();
      ASSERT_NE(ev->kind, ZmqClientEvent::Kind::kError) << ev->error_message;
      if (ev->kind == ZmqClientEvent::Kind::kFinal) break;
      ztext += ev->text;
    }
    EXPECT_EQ(ztext, j["choices"][0]["text"].get<std::string>());
  }

  EXPECT_NE(http(port, "GET", "/health").find("200"), std::string::npos);
  EXPECT_NE(http(port, "GET", "/ready").find("200"), std::string::npos);
  const std::string metrics = testing::http_body(http(port, "GET", "/metrics"));
  EXPECT_NE(metrics.find("tessera:generation_tokens_total"), std::string::npos) << metrics;
  // The ZeroMQ request above is counted beside the HTTP ones.
  EXPECT_NE(metrics.find("tessera:zmq_replies_total{model_name=\"kjv-llama\",code=\"200\"} 1"), std::string::npos)
      << metrics;

  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << testing::read_file(log);
  EXPECT_NE(testing::read_file(log).find("stopped"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
