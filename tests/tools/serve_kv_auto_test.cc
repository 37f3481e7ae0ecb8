// cache.num_blocks: auto on a real tessera-serve with its real worker processes: the pool is
// the budget over the per-rank block bytes, the log says where the number came from, and it
// follows the memory the worker reports (capped by worker.memory_limit_bytes, an operator's
// option). Also: the local workers' configuration file is private and holds no API keys.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

std::string get(int port, const std::string& path) { return testing::http(port, "GET", path); }

// tessera-serve on tiny-llama in f32 on one CPU thread per rank, plus `extra` arguments.
std::vector<std::string> tiny_llama_cpu_by_set_keys(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--model", testing::fixtures_dir() + "/tiny-llama", "--set", "model.dtype=float32",
                                   "--set",   "worker.backend=cpu",                     "--set", "worker.threads=1"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

int64_t kv_blocks_total(int port) {
  const std::string metrics = get(port, "/metrics");
  std::smatch m;
  if (!std::regex_search(metrics, m, std::regex(R"(tessera:kv_cache_blocks_total(\{[^}]*\})? (\d+))"))) return -1;
  return std::stoll(m[2]);
}

// tiny-llama (config.json): 3 layers, 2 KV heads, head_dim 32; float32, blocks of 16 tokens:
// K and V = 2 * 3 * 16 * kv_heads_per_rank * 32 * 4 bytes.
int64_t tiny_llama_block_bytes(int tensor_parallel) { return 2 * 3 * 16 * (2 / tensor_parallel) * 32 * 4; }

TEST(ServeKvAuto, PoolIsCpuKvBytesOverEachRanksBlockBytesAndTheLogSaysSo) {
  TESSERA_REQUIRE_FIXTURES();
  const int64_t budget = 24576100;  // 1000 single-rank blocks and a remainder
  for (int tp : {1, 2}) {
    testing::ServeProcess server;
    ASSERT_TRUE(server.start(tiny_llama_cpu_by_set_keys({"--tensor-parallel", std::to_string(tp), "--set", "cache.num_blocks=auto",
                                             "--set", "cache.cpu_kv_bytes=" + std::to_string(budget)})))
        << server.log();
    const int64_t expected = budget / tiny_llama_block_bytes(tp);  // TP 2: each rank caches one KV head
    EXPECT_EQ(expected, 1000 * tp);
    EXPECT_EQ(kv_blocks_total(server.port()), expected) << get(server.port(), "/metrics");
    const std::string log = server.log();
    EXPECT_NE(log.find("cache: " + std::to_string(expected) +
                       " blocks of 16 tokens (auto: cache.cpu_kv_bytes 23.4 MiB of "),
              std::string::npos)
        << log;
    EXPECT_TRUE(std::regex_search(log, std::regex(R"(cpu_kv_bytes 23\.4 MiB of [0-9.]+ [KMGT]iB available reported by rank [01]\))")))
        << log;
  }
}

TEST(ServeKvAuto, PoolFollowsTheMemoryTheWorkerReports) {
  TESSERA_REQUIRE_FIXTURES();
  // The worker offers 40 MiB (worker.memory_limit_bytes caps what it reports); a 1 TiB
  // cache.cpu_kv_bytes is then cut to that, less the weights' estimate (~2.7 MB) and the
  // activations planned for a 512-token step on 2 threads.
  const int64_t limit = int64_t{40} << 20;
  const std::string model = testing::fixtures_dir() + "/tiny-llama";
  const int64_t file = static_cast<int64_t>(std::filesystem::file_size(model + "/model.safetensors"));
  testing::ServeProcess server;
  ASSERT_TRUE(server.start(tiny_llama_cpu_by_set_keys({"--set", "cache.cpu_kv_bytes=1099511627776", "--set",
                                           "worker.memory_limit_bytes=" + std::to_string(limit), "--set",
                                           "scheduler.max_num_batched_tokens=512", "--set", "worker.threads=2"})))
      << server.log();
  const std::string log = server.log();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      log, m,
      std::regex(R"(: the 40\.0 MiB available reported by rank 0 less 2\.6 MiB of weights and ([0-9.]+) MiB of )"
                 R"(activations \(a step of 512 tokens and 512 rows of logits\)\))")))
      << log;
  const int64_t activations = static_cast<int64_t>(std::stod(m[1]) * (1 << 20));
  const int64_t block = tiny_llama_block_bytes(1);
  const int64_t blocks = kv_blocks_total(server.port());
  // The weights' estimate is the parameters' bytes: the file less its header (< 64 KiB); the
  // activations as logged, to 0.05 MiB.
  EXPECT_GE(blocks, (limit - file - activations - 52429) / block);
  EXPECT_LE(blocks, (limit - file - activations + 65536 + 52429) / block);
  EXPECT_NE(log.find("cache: " + std::to_string(blocks) +
                     " blocks of 16 tokens (auto: cache.cpu_kv_bytes 1.0 TiB capped to "),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("offering 41 MB (worker.memory_limit_bytes)"), std::string::npos) << log;
}

TEST(ServeKvAuto, TooSmallAReportedMemoryFailsNamingIt) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess server;
  // 3 MiB offered: the weights leave too little for one 2048-token sequence (128 blocks).
  EXPECT_FALSE(server.start(tiny_llama_cpu_by_set_keys({"--set", "worker.memory_limit_bytes=3145728"})));
  const std::string log = server.log();
  EXPECT_NE(log.find("cache.num_blocks auto: cache.cpu_kv_bytes auto"), std::string::npos) << log;
  EXPECT_NE(log.find("fewer than the 128 one 2048-token sequence needs"), std::string::npos) << log;
}

TEST(ServeKvAuto, LocalWorkersConfigurationIsPrivateAndHoldsNoApiKeys) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess server;
  ASSERT_TRUE(server.start(tiny_llama_cpu_by_set_keys({"--set", "cache.num_blocks=256", "--set",
                                           "server.http.api_keys=[sekrit-key-4711]"})))
      << server.log();
  // The worker's command line names its configuration file.
  std::string config_path;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream stat_in(entry.path() / "stat");
    std::string pid, comm, state;
    pid_t ppid = 0;
    if (!(stat_in >> pid >> comm >> state >> ppid) || ppid != server.pid()) continue;
    std::ifstream cmd_in(entry.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(cmd_in)), std::istreambuf_iterator<char>());
    std::vector<std::string> args;
    for (size_t at = 0; at < cmdline.size();) {
      const size_t end = cmdline.find('\0', at);
      args.push_back(cmdline.substr(at, end - at));
      at = end == std::string::npos ? cmdline.size() : end + 1;
    }
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == "--config") config_path = args[i + 1];
    }
  }
  ASSERT_FALSE(config_path.empty()) << "no tessera-worker child of pid " << server.pid();
  struct stat file_stat {}, dir_stat {};
  ASSERT_EQ(stat(config_path.c_str(), &file_stat), 0) << config_path;
  ASSERT_EQ(stat(std::filesystem::path(config_path).parent_path().c_str(), &dir_stat), 0);
  EXPECT_EQ(file_stat.st_mode & 0777, 0600u) << config_path;
  EXPECT_EQ(dir_stat.st_mode & 0777, 0700u) << config_path;
  const std::string text = testing::read_file(config_path);
  EXPECT_NE(text.find("api_keys"), std::string::npos) << text;  // the key is there, emptied
  EXPECT_EQ(text.find("sekrit-key-4711"), std::string::npos) << text;
  // The server itself still checks the key.
  EXPECT_NE(get(server.port(), "/v1/models").find("401"), std::string::npos);
}

}  // namespace
}  // namespace tessera
