// tessera-serve on a GGUF file alone: the vocabulary and chat template come from the file.
// kjv-llama-F16.gguf holds the same float16 weights as the Hugging Face folder served at
// --dtype float16, so a chat request and a text completion must come back the same from both
// servers (the same rendered prompt, token for token, and the same greedy answer); the Q8_0
// file serves chat with the same prompt token count.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <iostream>
#include <regex>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

nlohmann::json post_json(int port, const std::string& path, const nlohmann::json& body) {
  const std::string r = testing::http_body(testing::http(port, "POST", path, body.dump()));
  return nlohmann::json::parse(r, nullptr, /*allow_exceptions=*/false);
}

const nlohmann::json kGgufChat = {{"messages", {{{"role", "system"}, {"content", "Thus saith the LORD"}},
                                                {{"role", "user"}, {"content", "And God said"}}}},
                                  {"max_tokens", 16}, {"temperature", 0}};
const nlohmann::json kGgufCompletion = {{"prompt", "In the beginning God created"}, {"max_tokens", 16},
                                        {"temperature", 0}, {"echo", true}, {"logprobs", 0}};

TEST(ServeGguf, VocabularyAndChatTemplateFromTheFileMatchTheHuggingFaceFolder) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string fixtures = testing::fixtures_dir();
  testing::ServeProcess folder, gguf;
  ASSERT_TRUE(folder.start({"--model", fixtures + "/kjv-llama", "--dtype", "float16"})) << folder.log();
  ASSERT_TRUE(gguf.start({"--model", fixtures + "/gguf/kjv-llama-F16.gguf", "--dtype", "float16"})) << gguf.log();
  EXPECT_NE(gguf.log().find("tokenizer: the vocabulary in"), std::string::npos) << gguf.log();
  EXPECT_NE(gguf.log().find("chat template: the model's"), std::string::npos) << gguf.log();

  const nlohmann::json a = post_json(folder.port(), "/v1/chat/completions", kGgufChat);
  const nlohmann::json b = post_json(gguf.port(), "/v1/chat/completions", kGgufChat);
  ASSERT_TRUE(a.contains("choices")) << a.dump();
  ASSERT_TRUE(b.contains("choices")) << b.dump();
  EXPECT_EQ(a["usage"], b["usage"]);
  EXPECT_EQ(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"]);

  // The prompt's tokens one by one (echo), and the answer.
  const nlohmann::json c = post_json(folder.port(), "/v1/completions", kGgufCompletion);
  const nlohmann::json d = post_json(gguf.port(), "/v1/completions", kGgufCompletion);
  ASSERT_TRUE(c.contains("choices")) << c.dump();
  ASSERT_TRUE(d.contains("choices")) << d.dump();
  EXPECT_EQ(c["choices"][0]["logprobs"]["tokens"], d["choices"][0]["logprobs"]["tokens"]);
  EXPECT_EQ(c["choices"][0]["text"], d["choices"][0]["text"]);
  EXPECT_EQ(c["usage"], d["usage"]);
}

TEST(ServeGguf, Q8FileServesChatWithItsOwnTemplate) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string fixtures = testing::fixtures_dir();
  testing::ServeProcess folder, gguf;
  ASSERT_TRUE(folder.start({"--model", fixtures + "/kjv-llama"})) << folder.log();
  ASSERT_TRUE(gguf.start({"--model", fixtures + "/gguf/kjv-llama-Q8_0.gguf"})) << gguf.log();
  const nlohmann::json a = post_json(folder.port(), "/v1/chat/completions", kGgufChat);
  const nlohmann::json b = post_json(gguf.port(), "/v1/chat/completions", kGgufChat);
  ASSERT_TRUE(b.contains("choices")) << b.dump();
  EXPECT_EQ(a["usage"]["prompt_tokens"], b["usage"]["prompt_tokens"]);
  EXPECT_EQ(b["usage"]["completion_tokens"], 16);
  EXPECT_FALSE(b["choices"][0]["message"]["content"].get<std::string>().empty());
  EXPECT_EQ(b["model"], "kjv-llama-Q8_0.gguf");
}

// The KV pool is sized with the weights' estimate before they load: int8 (what auto makes of
// a quantized file) counts a byte a matrix weight, so a Q8_0 file leaves the pool more room
// than the same file decoded to float32.
TEST(ServeGguf, KvPoolCountsInt8WeightsAtAByteEach) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string gguf = testing::fixtures_dir() + "/gguf/kjv-llama-Q8_0.gguf";
  auto estimate_mib = [&](const std::string& quantize) -> double {
    testing::ServeProcess server;
    EXPECT_TRUE(server.start({"--model", gguf, "--dtype", "float32", "--quantize", quantize, "--set",
                              "cache.cpu_kv_bytes=1099511627776", "--set", "worker.memory_limit_bytes=41943040",
                              // steps small enough for the activations to leave the pool room
                              "--set", "scheduler.max_num_batched_tokens=512", "--set", "worker.threads=2"}))
        << server.log();
    std::smatch m;
    const std::string log = server.log();
    if (!std::regex_search(log, m, std::regex(R"(less ([0-9.]+) MiB of weights)"))) {
      ADD_FAILURE() << "no weights' estimate in: " << log;
      return -1;
    }
    return std::stod(m[1]);
  };
  const double auto_mib = estimate_mib("auto"), none_mib = estimate_mib("none");
  std::cout << "[ REPORT   ] weights' estimate: auto (int8) " << auto_mib << " MiB, none (float32) " << none_mib
            << " MiB" << std::endl;
  EXPECT_GT(auto_mib, 0);
  EXPECT_LT(auto_mib, 0.6 * none_mib);
}

}  // namespace
}  // namespace tessera
