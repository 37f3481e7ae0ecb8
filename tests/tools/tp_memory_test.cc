// Each tensor-parallel rank reads only its slices of the checkpoint: loading a generated
// ~500 MB f32 model at TP = 2, every rank's peak resident memory stays under 0.65x the full
// model (the rank's half, plus the mapping pages it passes through).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "kernels/backend.h"
#include "tests/test_support.h"
#include "worker/shm_communicator.h"
#include "worker/transformer.h"

namespace tessera {
namespace {

int64_t vm_hwm_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

TEST(TensorParallelMemory, EachRankHoldsAboutHalfOfA500MBModel) {
  const std::string dir = testing::make_temp_dir("tessera-tp-mem");
  auto gen = testing::run_command(testing::bin_dir() + "/tessera-make-checkpoint --arch llama --preset 100m --out '" +
                                  dir + "/m' --seed 3");
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  const double file_bytes = static_cast<double>(std::filesystem::file_size(dir + "/m/model.safetensors"));
  ASSERT_GT(file_bytes, 400e6);

  const std::string group = "tp-mem-" + std::to_string(getpid());
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (int rank = 0; rank < 2; ++rank) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      alarm(120);  // a stuck rank must not outlive the test
      close(fds[0]);
      const int64_t before = vm_hwm_bytes();
      int64_t growth = -1;
      auto comm = make_shm_communicator(group, rank, 2, size_t{1} << 20, 60000);
      auto backend = make_backend("cpu", 1);
      if (comm.is_ok() && backend.is_ok()) {
        ModelLoadOptions lo;
        lo.comm = comm.value().get();
        auto model = Transformer::load(dir + "/m", lo, *backend.value());
        // Touch every weight byte this rank holds, as serving would.
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
          comm.value()->barrier();
        }
      }
      (void)!write(fds[1], &growth, sizeof(growth));
      _exit(growth > 0 ? 0 : 1);
    }
    close(fds[1]);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  for (int rank = 0; rank < 2; ++rank) {
    int64_t growth = -1;
    ASSERT_EQ(read(pipes[rank], &growth, sizeof(growth)), static_cast<ssize_t>(sizeof(growth)));
    int status = 0;
    waitpid(pids[rank], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    std::cout << "[ REPORT   ] rank " << rank << " peak RSS growth " << growth / 1e6 << " MB = "
              << growth / file_bytes << " x the " << file_bytes / 1e6 << " MB model" << std::endl;
    EXPECT_LT(growth, 0.65 * file_bytes);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
