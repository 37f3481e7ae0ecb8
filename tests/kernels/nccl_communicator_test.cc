// The NCCL Communicator on the device it is given. One GPU is enough for what is checked
// here (a world of one, and a world of two whose second rank never comes, which must end
// in a clear timeout instead of a hang); the two-rank data path runs in the fixture parity
// tests on machines with two GPUs. Without CUDA or a device every test says SKIPPED.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "common/communicator.h"
#include "kernels/backend.h"
#ifdef TESSERA_WITH_CUDA
#include "kernels/cuda/nccl_communicator.h"
#endif

namespace tessera {
namespace {

#ifdef TESSERA_WITH_CUDA

TEST(NcclCommunicator, IdOfTheWrongSizeIsRejectedBeforeTouchingADevice) {
  auto comm = make_nccl_communicator("not an id", 0, 2, 0, 1000);
  ASSERT_FALSE(comm.is_ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(comm.status().message().find("9 bytes"), std::string::npos) << comm.status().to_string();
}

class NcclOnDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = make_backend("cuda");
    if (!b.is_ok()) GTEST_SKIP() << "SKIPPED: no CUDA device (" << b.status().message() << ")";
    backend_ = std::move(b).value();
  }
  std::unique_ptr<Backend> backend_;
};

TEST_F(NcclOnDevice, WorldOfOneCollectivesKeepTheData) {
  auto id = make_nccl_unique_id();
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  auto comm = make_nccl_communicator(*id, 0, 1, 0, 20000);
  ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
  EXPECT_EQ((*comm)->name(), "nccl");
  std::vector<float> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f - 3.0f;
  Tensor a = backend_->alloc({1000}, DType::kF32);
  Tensor g = backend_->alloc({1000}, DType::kF32);
  backend_->copy_from_host(host.data(), a.view());
  ASSERT_TRUE((*comm)->all_reduce_sum(a.view().data, 1000, DType::kF32).is_ok());
  ASSERT_TRUE((*comm)->all_gather(a.view().data, g.view().data, 1000, DType::kF32).is_ok());
  ASSERT_TRUE((*comm)->broadcast(a.view().data, 1000, DType::kF32, 0).is_ok());
  ASSERT_TRUE((*comm)->barrier().is_ok());
  std::vector<float> back(1000), gathered(1000);
  backend_->copy_to_host(a.view(), back.data());
  backend_->copy_to_host(g.view(), gathered.data());
  EXPECT_EQ(back, host);
  EXPECT_EQ(gathered, host);
  EXPECT_FALSE((*comm)->broadcast(a.view().data, 1000, DType::kF32, 3).is_ok());
}

TEST_F(NcclOnDevice, AMissingPeerIsATimeoutNotAHang) {
  auto id = make_nccl_unique_id();
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  const auto t0 = std::chrono::steady_clock::now();
  auto comm = make_nccl_communicator(*id, 0, 2, 0, 1500);  // rank 1 never joins
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(comm.is_ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(comm.status().message().find("not every rank joined"), std::string::npos) << comm.status().to_string();
  EXPECT_LT(waited, std::chrono::seconds(30));
}

#else

TEST(NcclCommunicator, NeedsCuda) { GTEST_SKIP() << "SKIPPED: this build has no CUDA (NCCL) support"; }

#endif

}  // namespace
}  // namespace tessera
