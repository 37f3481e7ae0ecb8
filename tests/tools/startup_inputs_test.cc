// Whatever file a user or operator hands the real binaries at start-up, they end with one
// line naming the file and what is wrong with it, an exit status below 128 (never a signal:
// no abort, no std::bad_alloc), and within a bound (never a hang on a FIFO or a device):
// tokenizer files with absurd ids or that cannot be used, symlink loops, empty and null
// configurations, a directory, /dev/zero or a FIFO where a file belongs, token ids outside
// the vocabulary, and secret values in configuration errors.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// A model folder in a fresh temp dir: every file of the fixture `model` linked, except the
// ones the test then writes itself.
std::string linked_model(const std::string& model, const std::vector<std::string>& except = {}) {
  const std::string dir = testing::make_temp_dir("tessera-startup") + "/" + model;
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(testing::fixtures_dir() + "/" + model)) {
    const std::string name = e.path().filename().string();
    if (std::find(except.begin(), except.end(), name) == except.end()) fs::create_symlink(e.path(), dir + "/" + name);
  }
  return dir;
}

nlohmann::json fixture_json(const std::string& model, const std::string& file) {
  return nlohmann::json::parse(testing::read_file(testing::fixtures_dir() + "/" + model + "/" + file));
}

// The last line of `text` (without its newline).
std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  return t.substr(t.rfind('\n') == std::string::npos ? 0 : t.rfind('\n') + 1);
}

// Runs `program args` with a 60 s bound and checks it failed as a user deserves: exit status
// 1..127 (not killed, not the bound), and its last stderr line is the program's one-line error
// holding every needle.
void expect_one_line_failure(const std::string& program, const std::string& args,
                             const std::vector<std::string>& needles) {
  const auto r = testing::run_command("timeout -s KILL 60 " + testing::bin_dir() + "/" + program + " " + args);
  SCOPED_TRACE(program + " " + args);
  EXPECT_GT(r.exit_code, 0) << r.err;
  EXPECT_LT(r.exit_code, 124) << "killed by a signal or the time bound; stderr: " << r.err;
  const std::string line = last_line(r.err);
  EXPECT_EQ(line.rfind(program + ": ", 0), 0u) << "stderr: " << r.err;
  for (const std::string& needle : needles) EXPECT_NE(line.find(needle), std::string::npos) << "stderr: " << r.err;
}

// tessera-serve on its own ipc endpoints (no fixed port), one CPU thread.
std::string serve_args(const std::string& rest) {
  const std::string dir = testing::make_temp_dir("tessera-startup-ipc");
  return "--port 0 --backend cpu --threads 1 --set server.control=ipc://" + dir + "/c.ipc --set server.zmq_client= " +
         rest;
}

TEST(StartupInputs, TokenizerIdFarPastTheVocabularyIsOneLineNotBadAlloc) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = linked_model("kjv-llama", {"tokenizer.json"});
  nlohmann::json tok = fixture_json("kjv-llama", "tokenizer.json");
  tok["model"]["vocab"]["hello-absurd"] = 1000000000;
  testing::write_file(model + "/tokenizer.json", tok.dump());
  expect_one_line_failure("tessera-tokenize", "--tokenizer " + model + " --text hi", {"tokenizer.json", "1000000000"});
  expect_one_line_failure("tessera-serve", serve_args("--model " + model), {"tokenizer.json", "1000000000"});
  // An added token's id likewise.
  tok = fixture_json("kjv-llama", "tokenizer.json");
  tok["added_tokens"].push_back({{"id", 2000000000}, {"content", "<absurd>"}, {"special", true}});
  testing::write_file(model + "/tokenizer.json", tok.dump());
  expect_one_line_failure("tessera-tokenize", "--tokenizer " + model + " --text hi", {"<absurd>", "2000000000"});
}

TEST(StartupInputs, SymlinkLoopsAreNamedAsLoops) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = linked_model("tiny-llama", {"config.json"});
  fs::create_symlink(model + "/config.json", model + "/config.json");  // config.json -> itself
  expect_one_line_failure("tessera-serve", serve_args("--model " + model), {"config.json", "symbolic link loop"});
  expect_one_line_failure("tessera-generate", "--model " + model + " --prompt-ids 1,2 --max-new-tokens 1",
                          {"config.json", "symbolic link loop"});
  const std::string dir = testing::make_temp_dir("tessera-startup-loop");
  fs::create_symlink(dir + "/a", dir + "/b");
  fs::create_symlink(dir + "/b", dir + "/a");
  expect_one_line_failure("tessera-serve", serve_args("--model " + dir + "/a"), {dir + "/a", "symbolic link loop"});
  expect_one_line_failure("tessera-serve", serve_args("--config " + dir + "/a"), {dir + "/a", "symbolic link loop"});
}

TEST(StartupInputs, EmptyAndNullConfigurationsMeanDefaultsAndADirectoryIsRefused) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-startup-yaml");
  testing::write_file(dir + "/empty.yaml", "");
  testing::write_file(dir + "/null.yaml", "model: null\n");
  testing::write_file(dir + "/comment.yaml", "# nothing set\n");
  // All defaults: model.path has none, so that is the one thing named.
  for (const char* f : {"empty.yaml", "null.yaml", "comment.yaml"}) {
    expect_one_line_failure("tessera-serve", serve_args("--config " + dir + "/" + f), {"model.path", "required"});
  }
  expect_one_line_failure("tessera-serve", serve_args("--config " + dir), {dir, "is a directory"});
  // With the model given on the command line, the empty file serves.
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--config", dir + "/empty.yaml", "--model", testing::fixtures_dir() + "/tiny-llama",
                            "--backend", "cpu", "--threads", "1", "--set", "cache.num_blocks=32"}))
      << server.log();
  EXPECT_EQ(testing::http_status(testing::http(server.port(), "GET", "/health")), 200);
}

TEST(StartupInputs, DevicesAndFifosAreRefusedWithoutReadingThem) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-startup-dev");
  const std::string fifo = dir + "/fifo.yaml";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  expect_one_line_failure("tessera-serve", serve_args("--config /dev/zero"), {"/dev/zero", "character device"});
  expect_one_line_failure("tessera-serve", serve_args("--config " + fifo), {fifo, "FIFO"});
  // config.json as a device or a FIFO, and a chat template that is one.
  const std::string model = linked_model("tiny-llama", {"config.json"});
  fs::create_symlink("/dev/zero", model + "/config.json");
  expect_one_line_failure("tessera-serve", serve_args("--model " + model), {"config.json", "character device"});
  fs::remove(model + "/config.json");
  ASSERT_EQ(mkfifo((model + "/config.json").c_str(), 0600), 0);
  expect_one_line_failure("tessera-serve", serve_args("--model " + model), {"config.json", "FIFO"});
  const std::string kjv = linked_model("kjv-llama");
  expect_one_line_failure("tessera-serve", serve_args("--model " + kjv + " --set server.chat_template=" + fifo),
                          {"server.chat_template", "FIFO"});
}

TEST(StartupInputs, ATokenizerThatIsPresentButUnusableStopsStartUp) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = linked_model("kjv-llama", {"tokenizer.json"});
  const std::string text = testing::read_file(testing::fixtures_dir() + "/kjv-llama/tokenizer.json");
  testing::write_file(model + "/tokenizer.json", text.substr(0, text.size() / 2));  // truncated
  expect_one_line_failure("tessera-serve", serve_args("--model " + model), {"tokenizer.json", "invalid JSON"});
  nlohmann::json tok = nlohmann::json::parse(text);
  tok["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"},
                          {"invert", false}};
  testing::write_file(model + "/tokenizer.json", tok.dump());
  expect_one_line_failure("tessera-serve", serve_args("--model " + model), {"tokenizer.json", "pre_tokenizer"});
}

TEST(StartupInputs, SpecialTokenIdsOutsideTheVocabularyAreRefused) {
  TESSERA_REQUIRE_FIXTURES();
  for (const char* key : {"eos_token_id", "bos_token_id"}) {
    const std::string model = linked_model("tiny-llama", {"config.json"});
    nlohmann::json config = fixture_json("tiny-llama", "config.json");
    config[key] = 5000;  // the vocabulary has 512 ids
    testing::write_file(model + "/config.json", config.dump());
    expect_one_line_failure("tessera-serve", serve_args("--model " + model), {key, "5000", "outside the vocabulary"});
    config[key] = nlohmann::json::array({2, 70000});
    testing::write_file(model + "/config.json", config.dump());
    expect_one_line_failure("tessera-generate", "--model " + model + " --prompt-ids 1,2 --max-new-tokens 1",
                            {std::string(key) + "[1]", "70000"});
  }
  // The tokenizer's own end-of-sequence token past the model's vocabulary (1024 ids): an
  // added token the model has no row for.
  const std::string model = linked_model("kjv-llama", {"tokenizer.json", "tokenizer_config.json"});
  nlohmann::json tok = fixture_json("kjv-llama", "tokenizer.json");
  tok["added_tokens"].push_back({{"id", 1030}, {"content", "<end-x>"}, {"special", true}});
  testing::write_file(model + "/tokenizer.json", tok.dump());
  nlohmann::json tc = fixture_json("kjv-llama", "tokenizer_config.json");
  tc["eos_token"] = "<end-x>";
  testing::write_file(model + "/tokenizer_config.json", tc.dump());
  expect_one_line_failure("tessera-serve", serve_args("--model " + model), {"eos_token", "<end-x>", "1030"});
}

TEST(StartupInputs, SecretValuesAreNeverPrintedInConfigurationErrors) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-startup-secret");
  const std::vector<std::string> secrets = {"sk-live-SECRET1", "sk-live-SECRET2", "sk-live-SECRET3",
                                            "sk-live-SECRET4", "sk-live-SECRET5", "sk-live-SECRET6"};
  testing::write_file(dir + "/scalar.yaml", "server:\n  http:\n    api_keys: sk-live-SECRET2\n");
  testing::write_file(dir + "/typo.yaml", "server:\n  http:\n    api_key: [sk-live-SECRET5]\n");
  testing::write_file(dir + "/nested.yaml", "server:\n  http:\n    api_keys: [[sk-live-SECRET6]]\n");
  const std::string model = "--model " + testing::fixtures_dir() + "/tiny-llama ";
  const std::vector<std::string> runs = {
      serve_args(model + "--set server.http.api_keys=sk-live-SECRET1"),
      serve_args(model + "--config " + dir + "/scalar.yaml"),
      serve_args(model + "--set server.http.api_key=sk-live-SECRET3"),
      serve_args(model + "--set sk-live-SECRET4"),
      serve_args(model + "--config " + dir + "/typo.yaml"),
      serve_args(model + "--config " + dir + "/nested.yaml"),
  };
  for (const std::string& args : runs) {
    const auto r = testing::run_command("timeout -s KILL 60 " + testing::bin_dir() + "/tessera-serve " + args);
    EXPECT_GT(r.exit_code, 0) << args;
    EXPECT_LT(r.exit_code, 124) << args << ": " << r.err;
    for (const std::string& s : secrets) {
      EXPECT_EQ(r.out.find(s), std::string::npos) << args << " printed " << s << " on stdout: " << r.out;
      EXPECT_EQ(r.err.find(s), std::string::npos) << args << " printed " << s << " on stderr: " << r.err;
    }
  }
}

// The thread count each rank logs ("rank R: N CPU thread(s): ..."), by rank.
std::map<int, int> logged_threads(const std::string& log) {
  std::map<int, int> out;
  const std::regex line("rank (\\d+): (\\d+) CPU thread\\(s\\)");
  for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it)
    out[std::stoi((*it)[1])] = std::stoi((*it)[2]);
  return out;
}

TEST(StartupInputs, DefaultThreadsShareTheCoresAmongTheRanksAndOversubscriptionIsWarned) {
  TESSERA_REQUIRE_FIXTURES();
  cpu_set_t mask;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  const int cores = CPU_COUNT(&mask);
  if (cores < 2) GTEST_SKIP() << "SKIPPED: needs 2 cores to share, this process may use " << cores;
  // Before, each rank started a thread per core of the host: 2 ranks x `cores` threads.
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", testing::fixtures_dir() + "/tiny-llama", "--tensor-parallel", "2", "--backend",
                            "cpu", "--set", "cache.num_blocks=32", "--set", "server.warm_up=false"}))
      << server.log();
  const std::map<int, int> threads = logged_threads(server.log());
  ASSERT_EQ(threads.size(), 2u) << server.log();
  EXPECT_GE(threads.at(0), 1);
  EXPECT_GE(threads.at(1), 1);
  EXPECT_LE(threads.at(0) + threads.at(1), cores) << server.log();
  EXPECT_EQ(server.log().find("more than the cores"), std::string::npos) << server.log();
  server.stop();
  // Asked for explicitly, more threads than a rank's share is served, with a warning.
  testing::ServeProcess asked;
  ASSERT_TRUE(asked.start({"--model", testing::fixtures_dir() + "/tiny-llama", "--tensor-parallel", "2", "--backend",
                           "cpu", "--threads", std::to_string(cores), "--set", "cache.num_blocks=32", "--set",
                           "server.warm_up=false"}))
      << asked.log();
  EXPECT_EQ(logged_threads(asked.log()).at(0), cores) << asked.log();
  EXPECT_NE(asked.log().find("more than the cores this rank has"), std::string::npos) << asked.log();
}

// A copy of `model`'s model.safetensors with the first element of `tensor` set to NaN.
void poison_first_element(const std::string& model, const std::string& tensor) {
  std::string bytes = testing::read_file(testing::fixtures_dir() + "/tiny-llama/model.safetensors");
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len));
  const nlohmann::json& t = header.at(tensor);
  const size_t at = 8 + header_len + t.at("data_offsets")[0].get<size_t>();
  const std::string dtype = t.at("dtype");
  if (dtype == "F32") {
    const uint32_t nan = 0x7fc00000;
    std::memcpy(&bytes[at], &nan, 4);
  } else {
    const uint16_t nan = dtype == "F16" ? 0x7e00 : 0x7fc0;
    std::memcpy(&bytes[at], &nan, 2);
  }
  fs::remove(model + "/model.safetensors");
  testing::write_file(model + "/model.safetensors", bytes);
}

TEST(StartupInputs, NonFiniteWeightsAreRefusedNamingTheTensorUnlessTheCheckIsOff) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string tensor = "model.layers.1.mlp.down_proj.weight";
  const std::string model = linked_model("tiny-llama", {"model.safetensors"});
  poison_first_element(model, tensor);
  // Before, such a model loaded and served empty text.
  expect_one_line_failure("tessera-serve", serve_args("--model " + model), {tensor, "non-finite"});
  expect_one_line_failure("tessera-serve", serve_args("--model " + model + " --tensor-parallel 2"), {tensor, "non-finite"});
  expect_one_line_failure("tessera-generate", "--model " + model + " --prompt-ids 1,2 --max-new-tokens 1",
                          {tensor, "non-finite"});
  // Turned off, it loads (and is the operator's business).
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", model, "--backend", "cpu", "--threads", "1", "--check-weights", "false", "--set",
                            "cache.num_blocks=32", "--set", "server.warm_up=false"}))
      << server.log();
}

}  // namespace
}  // namespace tessera
