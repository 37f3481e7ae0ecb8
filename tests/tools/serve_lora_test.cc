// LoRA adapters over real HTTP (docs/lora.md): kjv-llama served on two worker processes with
// three adapters of different ranks and targets. /v1/models lists them with the model as
// parent; requests for the base and every adapter, sent all at once so they share batches, each
// answer exactly what a lone tessera-generate run with that adapter answers; an unknown model is
// a 404; and a bad adapter stops start-up with one line naming the file and field.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

using nlohmann::json;

constexpr int kNewTokens = 12;

struct Adapter {
  std::string name;
  std::string flags;  // for tessera-make-checkpoint
};

const std::vector<Adapter>& adapters() {
  static const std::vector<Adapter> a = {
      // Scales large enough (8, 8 and 4) that random factors change a trained model's greedy text.
      {"psalms", "--lora-rank 8 --lora-alpha 64 --seed 1"},
      {"proverbs", "--lora-rank 16 --lora-alpha 128 --lora-targets q_proj,v_proj --seed 2"},
      {"job", "--lora-rank 64 --lora-alpha 32 --lora-rslora --seed 3"},
  };
  return a;
}

std::string make_adapter(const std::string& dir, const Adapter& a) {
  const std::string out = dir + "/" + a.name;
  const testing::CommandResult r = testing::run_command(testing::bin_dir() + "/tessera-make-checkpoint --lora-of " +
                                                        testing::fixtures_dir() + "/kjv-llama --out " + out + " " +
                                                        a.flags + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return out;
}

// What one tessera-generate process answers for `prompt` with `adapter` ("" = the base): the
// prompt and its continuation decoded as one text (as the server's text follows its prompt).
std::string generate_alone(const std::string& prompt, const std::string& adapter, const std::string& adapter_dir,
                           int new_tokens = kNewTokens) {
  std::string cmd = testing::bin_dir() + "/tessera-generate --model " + testing::fixtures_dir() +
                    "/kjv-llama --threads 1 --max-new-tokens " + std::to_string(new_tokens) + " --prompt '" + prompt +
                    "'";
  if (!adapter.empty()) cmd += " --lora " + adapter + "=" + adapter_dir + " --prompt-lora " + adapter;
  const testing::CommandResult r = testing::run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.out.empty() ? r.out : r.out.substr(0, r.out.size() - 1);  // less the newline
}

TEST(ServeLora, AdaptersAreServedByNameAndMixedInOneBatch) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-serve-lora");
  std::map<std::string, std::string> folders;
  for (const Adapter& a : adapters()) folders[a.name] = make_adapter(dir, a);

  testing::ServeProcess server;
  std::vector<std::string> args = {"--model", testing::fixtures_dir() + "/kjv-llama", "--dtype", "float32",
                                   "--threads", "1", "--tensor-parallel", "2", "--set", "cache.num_blocks=256",
                                   "--set", "cache.block_size=4", "--set", "lora.max_loras=2"};
  for (const auto& [name, folder] : folders) args.insert(args.end(), {"--set", "lora.adapters." + name + "=" + folder});
  ASSERT_TRUE(server.start(args)) << server.log();

  const json models = json::parse(testing::http_body(testing::http(server.port(), "GET", "/v1/models")));
  ASSERT_EQ(models["data"].size(), 1 + folders.size()) << models.dump();
  EXPECT_EQ(models["data"][0]["id"], "kjv-llama");
  for (size_t i = 1; i < models["data"].size(); ++i) {
    const json& m = models["data"][i];
    ASSERT_TRUE(folders.count(m["id"].get<std::string>())) << m.dump();
    EXPECT_EQ(m["parent"], "kjv-llama");
    EXPECT_EQ(m["root"], folders[m["id"].get<std::string>()]);
  }

  // Every (prompt, model) pair at once: the base's and the adapters' rows in the same steps, two
  // adapters at most (lora.max_loras), the third waiting in host memory for its turn.
  const std::vector<std::string> prompts = {"In the beginning God", "And the LORD said unto Moses",
                                            "Blessed is the man that"};
  std::vector<std::string> models_asked = {"kjv-llama"};
  for (const Adapter& a : adapters()) models_asked.push_back(a.name);
  struct Case {
    std::string prompt, model, text, served_model;
    int status = 0;
  };
  std::vector<Case> cases;
  for (const std::string& p : prompts)
    for (const std::string& m : models_asked) cases.push_back({p, m, "", "", 0});
  std::vector<std::thread> threads;
  for (Case& c : cases) {
    threads.emplace_back([&c, &server] {
      const json body = {{"model", c.model}, {"prompt", c.prompt}, {"max_tokens", kNewTokens}, {"temperature", 0}};
      const std::string r = testing::http(server.port(), "POST", "/v1/completions", body.dump());
      c.status = testing::http_status(r);
      const json j = json::parse(testing::http_body(r), nullptr, false);
      if (c.status == 200 && j.is_object()) {
        c.text = j["choices"][0]["text"];
        c.served_model = j["model"];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::map<std::string, std::string> texts_of_first_prompt;
  for (const Case& c : cases) {
    ASSERT_EQ(c.status, 200) << c.model;
    EXPECT_EQ(c.served_model, c.model);
    const std::string alone = generate_alone(c.prompt, c.model == "kjv-llama" ? "" : c.model,
                                             c.model == "kjv-llama" ? "" : folders[c.model]);
    EXPECT_EQ(c.prompt + c.text, alone) << c.model;
    if (c.prompt == prompts[0]) texts_of_first_prompt[c.model] = c.text;
  }
  // The adapters change the answers, or the comparison could not tell one from another.
  EXPECT_EQ(texts_of_first_prompt.size(), models_asked.size());
  EXPECT_NE(texts_of_first_prompt["psalms"], texts_of_first_prompt["kjv-llama"]);
  EXPECT_NE(texts_of_first_prompt["job"], texts_of_first_prompt["psalms"]);

  // The ZeroMQ client API picks the adapter by "model" too (tessera-cli --zmq).
  for (const Case& c : cases) {
    if (c.prompt != prompts[0]) continue;
    const testing::CommandResult zmq = testing::run_command(
        testing::bin_dir() + "/tessera-cli --zmq " + testing::shell_quote(server.zmq_endpoint()) +
        " --timeout 30 complete --no-stream --temperature 0 --max-tokens " + std::to_string(kNewTokens) +
        " --model " + c.model + " " + testing::shell_quote(c.prompt));
    ASSERT_EQ(zmq.exit_code, 0) << zmq.err;
    EXPECT_EQ(zmq.out, c.text + "\n") << c.model;
  }
  // The adapters in /metrics: vLLM's info gauge (max_lora: lora.max_loras) and a counter per adapter.
  const std::string metrics = testing::http_body(testing::http(server.port(), "GET", "/metrics"));
  EXPECT_NE(metrics.find("vllm:lora_requests_info{model_name=\"kjv-llama\",max_lora=\"2\",running_lora_adapters=\"\","
                         "waiting_lora_adapters=\"\"}"),
            std::string::npos)
      << metrics;
  // Two ranks of one host reduce through shared memory (worker.collectives auto).
  EXPECT_NE(metrics.find("tessera:collectives_info{model_name=\"kjv-llama\",kind=\"shm\"} 1"), std::string::npos) << metrics;
  for (const Adapter& a : adapters())
    EXPECT_NE(metrics.find("tessera:lora_requests_total{model_name=\"kjv-llama\",lora_name=\"" + a.name + "\"} " +
                           std::to_string(prompts.size() + 1)),
              std::string::npos)
        << a.name << "\n" << metrics;
  const std::string unknown = testing::http(server.port(), "POST", "/v1/completions",
                                            json{{"model", "lamentations"}, {"prompt", "x"}}.dump());
  EXPECT_EQ(testing::http_status(unknown), 404) << unknown;
  EXPECT_NE(unknown.find("model_not_found"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("'psalms'"), std::string::npos) << unknown;
  // Run-time loading is off unless lora.runtime_updates says otherwise.
  const std::string off = testing::http(server.port(), "POST", "/v1/load_lora_adapter",
                                        json{{"lora_name", "x"}, {"lora_path", folders["psalms"]}}.dump());
  EXPECT_EQ(testing::http_status(off), 404) << off;
  EXPECT_NE(off.find("lora.runtime_updates"), std::string::npos) << off;
  const std::string card = testing::http(server.port(), "GET", "/v1/models/psalms");
  EXPECT_EQ(testing::http_status(card), 200) << card;
  EXPECT_NE(card.find("\"parent\":\"kjv-llama\""), std::string::npos) << card;
}

// lora.runtime_updates: adapters loaded and unloaded while base requests stream. Every request
// answers what a lone run with its adapter answers (the base ones never change); a request
// running with an adapter when it is unloaded finishes with it, and new ones get 404; a bad
// load is a 400 naming the file and field, and the server goes on serving.
TEST(ServeLora, AdaptersLoadAndUnloadWhileRequestsRun) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-serve-lora-runtime");
  const std::string psalms = make_adapter(dir, adapters()[0]);
  const std::string job = make_adapter(dir, adapters()[2]);  // rank 64
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", testing::fixtures_dir() + "/kjv-llama", "--dtype", "float32", "--threads", "1",
                            "--tensor-parallel", "2", "--set", "cache.num_blocks=256", "--set", "cache.block_size=4",
                            "--set", "lora.runtime_updates=true"}))
      << server.log();
  const std::string prompt = "In the beginning God";
  auto complete = [&](const std::string& model, int max_tokens = kNewTokens) {
    const json body = {{"model", model}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
    const std::string r = testing::http(server.port(), "POST", "/v1/completions", body.dump());
    const json j = json::parse(testing::http_body(r), nullptr, false);
    return std::make_pair(testing::http_status(r),
                          testing::http_status(r) == 200 ? j["choices"][0]["text"].get<std::string>() : r);
  };
  auto post = [&](const char* route, const json& body) {
    return testing::http(server.port(), "POST", route, body.dump());
  };
  const std::string base_alone = generate_alone(prompt, "", "");
  // Base requests, one after another, for as long as the adapters change.
  std::atomic<bool> stop{false};
  std::vector<std::pair<int, std::string>> base_answers;
  std::thread base([&] {
    while (!stop.load()) base_answers.push_back(complete("kjv-llama"));
  });

  const std::string loaded = post("/v1/load_lora_adapter", {{"lora_name", "psalms"}, {"lora_path", psalms}});
  EXPECT_EQ(testing::http_status(loaded), 200) << loaded;
  EXPECT_NE(loaded.find("Success: LoRA adapter 'psalms' added successfully."), std::string::npos) << loaded;
  EXPECT_NE(testing::http(server.port(), "GET", "/v1/models").find("\"psalms\""), std::string::npos);
  const auto with_psalms = complete("psalms");
  EXPECT_EQ(with_psalms.first, 200) << with_psalms.second;
  EXPECT_EQ(prompt + with_psalms.second, generate_alone(prompt, "psalms", psalms));
  EXPECT_EQ(testing::http_status(post("/v1/load_lora_adapter", {{"lora_name", "psalms"}, {"lora_path", psalms}})), 400);

  // A request with job, still running when job is unloaded: it finishes with job.
  ASSERT_EQ(testing::http_status(post("/v1/load_lora_adapter", {{"lora_name", "job"}, {"lora_path", job}})), 200);
  std::pair<int, std::string> during;
  std::thread running([&] { during = complete("job", 96); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::string unloaded = post("/v1/unload_lora_adapter", {{"lora_name", "job"}});
  running.join();
  EXPECT_EQ(testing::http_status(unloaded), 200) << unloaded;
  EXPECT_EQ(during.first, 200) << during.second;
  EXPECT_EQ(prompt + during.second, generate_alone(prompt, "job", job, 96));
  EXPECT_EQ(complete("job").first, 404);
  EXPECT_EQ(testing::http_status(post("/v1/unload_lora_adapter", {{"lora_name", "job"}})), 404);

  // Bad loads: the client's 400, naming the file and field; nothing else changes.
  const std::string missing = post("/v1/load_lora_adapter", {{"lora_name", "nope"}, {"lora_path", dir + "/nope"}});
  EXPECT_EQ(testing::http_status(missing), 400) << missing;
  EXPECT_NE(missing.find("nope/adapter_config.json: cannot be read"), std::string::npos) << missing;
  EXPECT_EQ(testing::http_status(post("/v1/load_lora_adapter", {{"lora_name", "bad name!"}, {"lora_path", psalms}})), 400);
  EXPECT_EQ(testing::http_status(post("/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", psalms}, {"extra", 1}})),
            400);
  EXPECT_EQ(complete("psalms").second, with_psalms.second);  // still served, still the same

  stop = true;
  base.join();
  ASSERT_FALSE(base_answers.empty());
  for (const auto& [status, text] : base_answers) {
    EXPECT_EQ(status, 200) << text;
    EXPECT_EQ(prompt + text, base_alone);
  }
}

TEST(ServeLora, ABadAdapterStopsStartUpNamingTheFileAndField) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-serve-lora-bad");
  const std::string folder = make_adapter(dir, adapters()[0]);  // rank 8
  testing::ServeProcess server;
  EXPECT_FALSE(server.start({"--model", testing::fixtures_dir() + "/kjv-llama", "--threads", "1", "--set",
                             "lora.adapters.psalms=" + folder, "--set", "lora.max_rank=4"}));
  EXPECT_NE(server.log().find(folder + "/adapter_config.json: r: 8 is above lora.max_rank 4"), std::string::npos)
      << server.log();
}

}  // namespace
}  // namespace tessera
