// model.weights_memory_budget through the real server (tessera-serve, worker processes, kjv-llama
// at TP 2): with a quarter of the weights resident each rank logs its streaming plan, the KV pool
// is sized beside the resident share, and greedy completions (tokens and logprobs) are those of
// the server holding every weight.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

using nlohmann::json;

json complete(int port, const json& body) {
  const std::string r = testing::http(port, "POST", "/v1/completions", body.dump());
  EXPECT_EQ(testing::http_status(r), 200) << r;
  return json::parse(testing::http_body(r), nullptr, false);
}

TEST(ServeStreamedWeights, AQuarterResidentAnswersAsEveryWeightResident) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = testing::fixtures_dir() + "/kjv-llama";
  const std::string spill = testing::make_temp_dir("tessera-serve-spill");
  testing::ServeProcess plain, streamed;
  ASSERT_TRUE(plain.start({"--model", model, "--backend", "cpu", "--threads", "1", "--tensor-parallel", "2",
                           "--dtype", "float32"}))
      << plain.log();
  ASSERT_TRUE(streamed.start({"--model", model, "--backend", "cpu", "--threads", "1", "--tensor-parallel", "2",
                              "--dtype", "float32", "--set", "model.weights_memory_budget=25%", "--set",
                              "model.weights_spill_dir=" + spill}))
      << streamed.log();
  const json body = {{"prompt", "And God said, Let there be light"}, {"max_tokens", 24}, {"temperature", 0},
                     {"logprobs", 2}, {"ignore_eos", true}};
  const json a = complete(plain.port(), body), b = complete(streamed.port(), body);
  ASSERT_TRUE(a.is_object() && b.is_object());
  EXPECT_EQ(b["choices"][0]["text"], a["choices"][0]["text"]);
  EXPECT_EQ(b["choices"][0]["logprobs"]["tokens"], a["choices"][0]["logprobs"]["tokens"]);
  const json& la = a["choices"][0]["logprobs"]["token_logprobs"];
  const json& lb = b["choices"][0]["logprobs"]["token_logprobs"];
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(lb[i].get<double>(), la[i].get<double>(), 1e-5) << i;
  const std::string log = streamed.log();
  EXPECT_NE(log.find("rank 0/2 weights: budget"), std::string::npos) << log;
  EXPECT_NE(log.find("rank 1/2 weights: budget"), std::string::npos) << log;
  EXPECT_NE(log.find("held resident (model.weights_memory_budget 25%"), std::string::npos) << log;
  EXPECT_EQ(plain.log().find("weights: budget"), std::string::npos);
}

TEST(ServeStreamedWeights, ABadBudgetStopsStartUpNamingTheKey) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess server;
  EXPECT_FALSE(server.start({"--model", testing::fixtures_dir() + "/kjv-llama", "--backend", "cpu", "--threads", "1",
                             "--set", "model.weights_memory_budget=lots"},
                            std::chrono::seconds(30)));
  EXPECT_NE(server.log().find("model.weights_memory_budget"), std::string::npos) << server.log();
  EXPECT_NE(server.log().find("'lots'"), std::string::npos) << server.log();
}

}  // namespace
}  // namespace tessera
