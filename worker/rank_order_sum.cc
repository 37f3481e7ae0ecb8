#include "worker/rank_order_sum.h"

#include <algorithm>

#include "common/dtype.h"

namespace tessera {

void sum_in_rank_order(const float* const* src, int n_src, int64_t n, float* out) {
  {
    const float* __restrict a = src[0];
    const float* __restrict b = src[1];
    float* o = out;  // may alias src[0] (shared memory's large path reduces into slot 0)
    for (int64_t i = 0; i < n; ++i) o[i] = a[i] + b[i];
  }
  for (int k = 2; k < n_src; ++k) {
    const float* __restrict s = src[k];
    float* __restrict o = out;
    for (int64_t i = 0; i < n; ++i) o[i] += s[i];
  }
}

void sum_in_rank_order(const uint16_t* const* src, int n_src, int64_t n, uint16_t* out) {
  constexpr int64_t kBlock = 512;  // f32 accumulator stays in L1
  float acc[kBlock];
  for (int64_t base = 0; base < n; base += kBlock) {
    const int64_t m = std::min(kBlock, n - base);
    for (int64_t i = 0; i < m; ++i) acc[i] = bf16_to_f32(src[0][base + i]);
    for (int k = 1; k < n_src; ++k) {
      const uint16_t* s = src[k] + base;
      for (int64_t i = 0; i < m; ++i) acc[i] += bf16_to_f32(s[i]);
    }
    for (int64_t i = 0; i < m; ++i) out[base + i] = f32_to_bf16(acc[i]);
  }
}

}  // namespace tessera
