// ggml_block_element.h, the element-by-element decoder of ggml blocks that CUDA shares: every
// element of random blocks of every type it decodes equals dequantize_ggml's (the reference
// its other tests hold to llama.cpp's files), bit for bit.
#include "common/gguf/ggml_block_element.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/gguf/ggml_dequant.h"
#include "common/gguf/gguf_file.h"

namespace tessera::ggml_block_element_test {

TEST(GgmlBlockElement, EveryElementOfEveryTypeIsDequantizeGgmls) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-2.0f, 2.0f);
  int types = 0;
  for (uint32_t type = 0; type < 40; ++type) {
    ASSERT_EQ(ggml_element::decodes(type), ggml_type_dequantizable(type) && ggml_type_traits(type)->block_elems > 1)
        << ggml_type_name(type);
    if (!ggml_element::decodes(type)) continue;
    ++types;
    const GgmlTypeTraits* traits = ggml_type_traits(type);
    ASSERT_EQ(ggml_element::block_elems(type), traits->block_elems) << traits->name;
    ASSERT_EQ(ggml_element::block_bytes(type), traits->block_bytes) << traits->name;
    const int64_t blocks = 24, n = blocks * traits->block_elems;
    std::vector<uint8_t> row(static_cast<size_t>(blocks * traits->block_bytes));
    for (uint8_t& b : row) b = static_cast<uint8_t>(byte(rng));
    // Finite halves where the scales are (random bytes there would make inf and NaN), some of
    // them subnormal: the fields' offsets per type.
    const std::vector<int> halves = type == ggml_element::kQ6_K ? std::vector<int>{208}
                                    : type == ggml_element::kQ4_0 || type == ggml_element::kQ5_0 || type == ggml_element::kQ8_0
                                        ? std::vector<int>{0}
                                        : std::vector<int>{0, 2};
    for (int64_t b = 0; b < blocks; ++b) {
      for (int at : halves) {
        const float v = b % 5 == 0 ? scale(rng) * 1e-6f : scale(rng);
        const uint16_t h = f32_to_f16(v);
        std::memcpy(&row[static_cast<size_t>(b * traits->block_bytes + at)], &h, 2);
      }
    }
    std::vector<float> want(static_cast<size_t>(n));
    ASSERT_TRUE(dequantize_ggml(type, row.data(), n, want.data()).is_ok()) << traits->name;
    int wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float got = ggml_element::row_element(type, row.data(), i);
      uint32_t a, w;
      std::memcpy(&a, &got, 4);
      std::memcpy(&w, &want[static_cast<size_t>(i)], 4);
      if (a != w && wrong++ < 5) ADD_FAILURE() << traits->name << " element " << i << ": " << got << " vs " << want[i];
    }
    EXPECT_EQ(wrong, 0) << traits->name;
  }
  EXPECT_EQ(types, 8);
}

}  // namespace tessera::ggml_block_element_test
