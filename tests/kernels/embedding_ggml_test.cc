// Backend::embedding_ggml on the CPU: rows of a table kept in ggml blocks (an untied GGUF
// embedding) come out as dequantize_ggml decodes them, for every block type it takes, over
// the whole vocabulary and as a vocabulary-parallel rank's rows (zeros for other ranks' ids).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "common/gguf/ggml_dequant.h"
#include "kernels/backend.h"
#include "tests/kernels/int4_test_blocks.h"

namespace tessera {
namespace {

TEST(EmbeddingGgml, RowsAreDequantizeGgmlsForEveryBlockType) {
  auto backend = make_backend("cpu");
  ASSERT_TRUE(backend.is_ok());
  std::mt19937 rng(5);
  const int64_t V = 40, H = 512;
  for (const GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                              GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    const uint32_t id = static_cast<uint32_t>(type);
    const Tensor table = random_ggml_table(type, V, H, rng);
    Tensor ids = Tensor::zeros({4}, DType::kI32);
    const int32_t picked[] = {0, 39, 7, 23};
    std::memcpy(ids.data<int32_t>(), picked, sizeof picked);
    Tensor out = Tensor::zeros({4, H}, DType::kF32);
    backend.value()->embedding_ggml(ids.view(), table.view(), id, out.view());
    std::vector<float> want(static_cast<size_t>(H));
    for (int t = 0; t < 4; ++t) {
      ASSERT_TRUE(dequantize_ggml(id, table.data<uint8_t>() + picked[t] * table.dim(1), H, want.data()).is_ok());
      EXPECT_EQ(std::memcmp(out.data<float>() + t * H, want.data(), H * sizeof(float)), 0)
          << ggml_type_name(id) << " id " << picked[t];
    }
    // Rank 1 of 2 holds rows [20, 40): ids 0 and 7 are the other rank's, zeros here.
    const Tensor half = Tensor::borrowed(table.view().rows(20, 20), nullptr);
    backend.value()->embedding_ggml(ids.view(), half.view(), id, out.view(), 20);
    ASSERT_TRUE(dequantize_ggml(id, table.data<uint8_t>() + 39 * table.dim(1), H, want.data()).is_ok());
    EXPECT_EQ(std::memcmp(out.data<float>() + H, want.data(), H * sizeof(float)), 0) << ggml_type_name(id);
    for (int64_t i = 0; i < H; ++i) {
      ASSERT_EQ(out.data<float>()[i], 0.0f) << ggml_type_name(id);
      ASSERT_EQ(out.data<float>()[2 * H + i], 0.0f) << ggml_type_name(id);
    }
  }
}

}  // namespace
}  // namespace tessera
