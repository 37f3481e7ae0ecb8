// First-run behaviour of a real tessera-serve: --dtype and --threads set model.dtype and
// worker.threads (as the workers' configuration shows), the weights go onto 2 MiB pages
// after start, the automatic backend's CPU fallback
// is one plain log line, and a large CPU KV pool costs neither set-up work nor resident memory
// until its blocks are used.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// The worker configuration tessera-serve wrote under `tmp` (its private folder).
std::string workers_config(const std::string& tmp) {
  for (const auto& e : fs::recursive_directory_iterator(tmp)) {
    if (e.path().filename() == "config.yaml") return testing::read_file(e.path().string());
  }
  return "";
}

// VmRSS of `pid` in bytes (-1 when unknown).
int64_t resident_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "VmRSS:  1234 kB"
  }
  return -1;
}


TEST(ServeFirstRun, DtypeAndThreadsFlagsReachTheWorkers) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string tmp = testing::make_temp_dir("tessera-first-run-tmp");
  testing::ServeProcess server;
  server.set_env("TMPDIR", tmp);
  ASSERT_TRUE(server.start({"--model", testing::fixtures_dir() + "/tiny-llama", "--dtype", "bfloat16", "--threads",
                            "2", "--backend", "cpu", "--set", "cache.num_blocks=64"}))
      << server.log();
  const std::string config = workers_config(tmp);
  EXPECT_NE(config.find("dtype: bfloat16"), std::string::npos) << config;
  EXPECT_NE(config.find("threads: 2"), std::string::npos) << config;
  // A server's first answer does not wait for its weights' 2 MiB pages: model.weights_huge_pages
  // auto reaches the workers as after_start, and each moves its weights once loaded.
  EXPECT_NE(config.find("weights_huge_pages: after_start"), std::string::npos) << config;
  for (int i = 0; i < 200 && server.log().find("weights on huge pages after start") == std::string::npos; ++i) {
    usleep(50000);
  }
  EXPECT_NE(server.log().find("rank 0/1: weights on huge pages after start"), std::string::npos) << server.log();
  server.stop();
  fs::remove_all(tmp);
}

TEST(ServeFirstRun, AFlagOutOfRangeIsRefusedNamingIt) {
  const testing::CommandResult r =
      testing::run_command(testing::bin_dir() + "/tessera-serve --threads -1 --dtype float32");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.out + r.err).find("--threads"), std::string::npos) << r.out << r.err;
  const testing::CommandResult d = testing::run_command(testing::bin_dir() + "/tessera-serve --dtype float8");
  EXPECT_NE(d.exit_code, 0);
  EXPECT_NE((d.out + d.err).find("--dtype"), std::string::npos) << d.out << d.err;
}

TEST(ServeFirstRun, TheAutomaticBackendSaysPlainlyWhenItFallsBackToTheCpu) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", testing::fixtures_dir() + "/tiny-llama", "--dtype", "float32", "--threads", "1",
                            "--set", "cache.num_blocks=64"}))
      << server.log();
  const std::string log = server.log();
  EXPECT_EQ(log.find("driver version is insufficient"), std::string::npos) << log;
  const bool cpu = log.find("backend auto: no GPU, using the CPU backend") != std::string::npos ||
                   log.find("backend auto: this build has no CUDA support, using the CPU backend") != std::string::npos ||
                   log.find("backend auto: a GPU is present but CUDA cannot use it") != std::string::npos;
  const bool cuda = log.find("backend auto: CUDA on device") != std::string::npos;
  EXPECT_TRUE(cpu || cuda) << log;
}

TEST(ServeFirstRun, ALargeCpuKvPoolTakesNoMemoryUntilUsed) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess server;
  // 65,536 blocks of tiny-llama in float32 (24,576 bytes each): a 1.5 GiB pool.
  ASSERT_TRUE(server.start({"--model", testing::fixtures_dir() + "/tiny-llama", "--dtype", "float32", "--backend",
                            "cpu", "--threads", "1", "--set", "cache.num_blocks=65536"}))
      << server.log();
  const std::vector<pid_t> workers = testing::children_of(server.pid());
  ASSERT_EQ(workers.size(), 1u);
  const int64_t rss = resident_bytes(workers[0]);
  ASSERT_GT(rss, 0);
  EXPECT_LT(rss, int64_t{256} << 20) << "the worker holds " << rss << " bytes resident for an untouched pool";
  // The pool works: a request runs in it.
  const std::string r = testing::http(server.port(), "POST", "/v1/completions", R"({"prompt": [1, 2, 3], "max_tokens": 4})");
  EXPECT_NE(r.find("200 OK"), std::string::npos) << r;
}

}  // namespace
}  // namespace tessera
