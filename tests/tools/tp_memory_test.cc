// Each tensor-parallel rank reads only its slices of the checkpoint: loading a generated
// ~500 MB f32 model at TP = 2, every rank's peak resident memory stays under 0.6x the full
// model (the rank's half, plus the mapping pages it passes through; 0.53x measured, 0.63x
// while the weight scan left the rank's half of the embedding table mapped in).
//
// Each rank is a fresh process (this binary re-run for the rank test below), as a worker is,
// so its figure is the loader's alone: a forked copy of the test process would start with
// the parent's pages shared and count whatever it touched of them.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kernels/backend.h"
#include "tests/test_support.h"
#include "worker/shm_communicator.h"
#include "worker/transformer.h"

namespace tessera {
namespace {

constexpr char kRankEnv[] = "TESSERA_TP_MEMORY_RANK";  // "model dir|group|rank|fd"

// Under AddressSanitizer (CI's second pass) resident memory also holds its shadow (an eighth
// of what the process touches), redzones and a quarantine of freed blocks (the loader's freed
// temporaries: 0.67x of the model there against 0.53x in the plain build), so the bound is
// checked in the plain build and only reported here.
#if defined(TESSERA_SANITIZED)
constexpr bool kResidentMemoryIsTheProgramsOwn = false;
#else
constexpr bool kResidentMemoryIsTheProgramsOwn = true;
#endif

int64_t vm_hwm_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// The mappings holding most of this process's resident memory, for a failure's message.
std::string largest_mappings() {
  std::ifstream in("/proc/self/smaps");
  std::string line, name;
  std::vector<std::pair<int64_t, std::string>> rss;
  while (std::getline(in, line)) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) && line.find('-') != std::string::npos &&
        line.find(':') > line.find(' ')) {
      name = line;
    } else if (line.rfind("Rss:", 0) == 0) {
      rss.emplace_back(std::stoll(line.substr(4)), name);
    }
  }
  std::sort(rss.rbegin(), rss.rend());
  std::ostringstream os;
  for (size_t i = 0; i < rss.size() && i < 12; ++i) os << "  " << rss[i].first << " kB  " << rss[i].second << "\n";
  return os.str();
}

// One rank: load its slices, touch every weight byte it holds as serving would, and write the
// growth of its peak resident memory to the pipe. Run only by the test below, in a child.
TEST(TensorParallelMemoryRank, DISABLED_LoadOneRankAndReportItsPeak) {
  const char* spec = std::getenv(kRankEnv);
  if (spec == nullptr) GTEST_SKIP() << kRankEnv << " unset: this is one rank of the test below";
  std::vector<std::string> parts;
  std::stringstream ss(spec);
  for (std::string p; std::getline(ss, p, '|');) parts.push_back(p);
  ASSERT_EQ(parts.size(), 4u) << spec;
  const int rank = std::stoi(parts[2]);
  const int fd = std::stoi(parts[3]);
  alarm(120);  // a stuck rank must not outlive the test

  const int64_t before = vm_hwm_bytes();
  int64_t growth = -1;
  auto comm = make_shm_communicator(parts[1], rank, 2, size_t{1} << 20, 60000);
  auto backend = make_backend("cpu", 1);
  ASSERT_TRUE(comm.is_ok() && backend.is_ok());
  ModelLoadOptions lo;
  lo.comm = comm.value().get();
  auto model = Transformer::load(parts[0], lo, *backend.value());
  if (model.is_ok()) {
    volatile char sink = 0;
    auto touch = [&](const Tensor& t) {
      for (size_t i = 0; i < t.nbytes(); i += 4096) sink = sink + t.data<char>()[i];
    };
    for (const auto& l : model.value()->weights().layers) {
      for (const LinearWeights* w : {&l.qkv, &l.o, &l.mlp.gate_up, &l.mlp.down}) touch(w->w);
    }
    touch(model.value()->weights().embed);
    touch(model.value()->weights().lm_head.w);
    growth = vm_hwm_bytes() - before;
    std::cout << "[ REPORT   ] rank " << rank << " resident mappings at its peak:\n" << largest_mappings();
    EXPECT_TRUE(comm.value()->barrier().is_ok());
  }
  EXPECT_TRUE(model.is_ok()) << model.status().message();
  ASSERT_EQ(write(fd, &growth, sizeof(growth)), static_cast<ssize_t>(sizeof(growth)));
}

// A generated ~100M Llama (seed 3) in dir/m, `flags` added (e.g. --dtype bfloat16); its
// safetensors file's size, 0 (and a failure) if it could not be made.
double make_100m_llama(const std::string& dir, const std::string& flags = "") {
  auto gen = testing::run_command(testing::bin_dir() + "/tessera-make-checkpoint --arch llama --preset 100m --out '" +
                                  dir + "/m' --seed 3 " + flags);
  EXPECT_EQ(gen.exit_code, 0) << gen.err;
  if (gen.exit_code != 0) return 0;
  return static_cast<double>(std::filesystem::file_size(dir + "/m/model.safetensors"));
}

TEST(TensorParallelMemory, EachRankHoldsAboutHalfOfA500MBModel) {
  const std::string dir = testing::make_temp_dir("tessera-tp-mem");
  const double file_bytes = make_100m_llama(dir);
  ASSERT_GT(file_bytes, 400e6);

  const std::string group = "tp-mem-" + std::to_string(getpid());
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (int rank = 0; rank < 2; ++rank) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const std::string spec = dir + "/m|" + group + "|" + std::to_string(rank) + "|" + std::to_string(fds[1]);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      setenv(kRankEnv, spec.c_str(), 1);
      execl("/proc/self/exe", "tessera_tools_tests",
            "--gtest_filter=TensorParallelMemoryRank.DISABLED_LoadOneRankAndReportItsPeak",
            "--gtest_also_run_disabled_tests", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  for (int rank = 0; rank < 2; ++rank) {
    int64_t growth = -1;
    EXPECT_EQ(read(pipes[rank], &growth, sizeof(growth)), static_cast<ssize_t>(sizeof(growth)));
    close(pipes[rank]);
    int status = 0;
    waitpid(pids[rank], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << rank << " status " << status;
    std::cout << "[ REPORT   ] rank " << rank << " peak RSS growth " << growth / 1e6 << " MB = "
              << growth / file_bytes << " x the " << file_bytes / 1e6 << " MB model" << std::endl;
    EXPECT_GT(growth, 0);
    if (kResidentMemoryIsTheProgramsOwn) {
      EXPECT_LT(growth, 0.6 * file_bytes);
    }
  }
  std::filesystem::remove_all(dir);
}

// Quantizing at load holds one layer's float copies at a time (each layer is quantized as
// soon as it has loaded): tessera-generate --quantize int8 on the same ~500 MB f32 model peaks
// at 0.68x the file (the int8 matrices, the f32 LM head, a layer in flight, the embedding's
// rows in use); quantized only once every layer had loaded it peaked at 1.2x, and 0.87x while
// the weight scan left the whole embedding table mapped in.
// The peak resident memory of `tessera-generate --model MODEL FLAGS... --threads 1 --prompt-ids
// 1,2,3 --max-new-tokens 1 --kv-blocks 8` run as a child (its rusage), in bytes.
double generate_peak_rss(const std::string& model, const std::vector<std::string>& flags) {
  const std::string bin = testing::bin_dir() + "/tessera-generate";
  std::vector<std::string> args = {bin, "--model", model};
  args.insert(args.end(), flags.begin(), flags.end());
  for (const char* a : {"--threads", "1", "--prompt-ids", "1,2,3", "--max-new-tokens", "1", "--kv-blocks", "8"})
    args.emplace_back(a);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    const int null_fd = open("/dev/null", O_WRONLY);
    dup2(null_fd, STDOUT_FILENO);
    dup2(null_fd, STDERR_FILENO);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  rusage usage{};
  if (pid < 0 || wait4(pid, &status, 0, &usage) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ADD_FAILURE() << "tessera-generate failed, status " << status;
    return 0;
  }
  return static_cast<double>(usage.ru_maxrss) * 1024;  // kB
}

TEST(QuantizedLoadMemory, Int8AtLoadPeaksBelowTheFloatModel) {
  const std::string dir = testing::make_temp_dir("tessera-quant-mem");
  const double file_bytes = make_100m_llama(dir);
  ASSERT_GT(file_bytes, 0);
  const double peak = generate_peak_rss(dir + "/m", {"--quantize", "int8"});
  std::cout << "[ REPORT   ] --quantize int8 peak RSS " << peak / 1e6 << " MB = " << peak / file_bytes << " x the "
            << file_bytes / 1e6 << " MB f32 model" << std::endl;
  if (kResidentMemoryIsTheProgramsOwn) {
    EXPECT_LT(peak, 0.8 * file_bytes);
  }
  std::filesystem::remove_all(dir);
}

// Coded bf16 reads each matrix it codes in place from the checkpoint (no own copy first) and
// lets its pages go once coded, so the load peaks below the bf16 file and below 16-bit bf16's
// load (here 241 against 269 MB: the peak is at the end, the untied LM head's mapped pages
// beside its coded copy and the coded layers, plus the process's ~40 MB).
TEST(QuantizedLoadMemory, CodedBf16AtLoadPeaksBelowTheBf16Model) {
  const std::string dir = testing::make_temp_dir("tessera-coded-mem");
  const double file_bytes = make_100m_llama(dir, "--dtype bfloat16");
  ASSERT_GT(file_bytes, 0);
  const double coded = generate_peak_rss(dir + "/m", {"--dtype", "bfloat16", "--bf16-coding", "on"});
  const double plain = generate_peak_rss(dir + "/m", {"--dtype", "bfloat16", "--bf16-coding", "off"});
  std::cout << "[ REPORT   ] coded bf16 peak RSS " << coded / 1e6 << " MB = " << coded / file_bytes << " x the "
            << file_bytes / 1e6 << " MB bf16 model; 16-bit bf16 " << plain / 1e6 << " MB" << std::endl;
  if (kResidentMemoryIsTheProgramsOwn) {
    EXPECT_LT(coded, file_bytes);
    EXPECT_LT(coded, 0.95 * plain);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
