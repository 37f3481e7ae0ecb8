#pragma once
// Internal to the CPU attention (attention_cpu.cc): the inner loops of the tiled kernel over
// one block of keys already widened to f32, per instruction-set flavour (AVX2 + FMA in
// attention_tile_avx2.cc, portable scalar below).
#include <cstdint>

namespace tessera::cpu::detail {

// Keys per block (a multiple of 8); a block's K is stored transposed, [head_dim][kKeyBlock].
inline constexpr int64_t kKeyBlock = 64;

struct AttentionTileOps {
  // s[j] = sum_d q[d] * kt[d * kKeyBlock + j] for j < n (n <= kKeyBlock).
  void (*scores)(const float* q, const float* kt, int64_t head_dim, int64_t n, float* s);
  // s[j] = exp(s[j] - max) for j < n (-inf gives exactly 0); returns the sum.
  float (*exp_shifted)(float* s, int64_t n, float max);
  // acc[d] = acc[d] * rescale + sum_j p[j] * v[j * head_dim + d].
  void (*accumulate)(const float* p, const float* v, int64_t n, int64_t head_dim, float rescale, float* acc);
};

AttentionTileOps attention_tile_ops_scalar();
AttentionTileOps attention_tile_ops_avx2();  // needs AVX2 + FMA

}  // namespace tessera::cpu::detail
