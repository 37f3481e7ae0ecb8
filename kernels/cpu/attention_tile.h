#pragma once
// Internal to the CPU attention (attention_cpu.cc): the inner loops of the tiled kernel over
// one block of keys already widened to f32, per instruction-set flavour (AVX-512 in
// attention_tile_avx512.cc, AVX2 + FMA in attention_tile_avx2.cc, portable scalar below).
#include <cstdint>

#include "common/dtype.h"

namespace tessera::cpu::detail {

// Keys per block (a multiple of 8); a block's K is stored transposed, [head_dim][kKeyBlock].
inline constexpr int64_t kKeyBlock = 64;

struct AttentionTileOps {
  // Widens one block of n <= kKeyBlock cached keys and values (row i of K at k_rows[i], of
  // V at v_rows[i], head_dim elements of `dtype`: f32, f16 or bf16) to f32: kt[d * kKeyBlock
  // + i] = K[i][d] (columns n up to the next multiple of 8 zero), vb[i * head_dim + d] =
  // V[i][d]. Vectorized, because at decode a block serves only the few query heads of one KV
  // head and its widening and transposition, done an element at a time, cost more than the
  // scores and the value update together (perf, batch-32 decode).
  void (*gather)(const void* const* k_rows, const void* const* v_rows, DType dtype, int64_t head_dim, int32_t n,
                 float* kt, float* vb);
  // s[j] = sum_d q[d] * kt[d * kKeyBlock + j] for j < n (n <= kKeyBlock).
  void (*scores)(const float* q, const float* kt, int64_t head_dim, int64_t n, float* s);
  // s[j] = exp(s[j] - max) for j < n (-inf gives exactly 0); returns the sum.
  float (*exp_shifted)(float* s, int64_t n, float max);
  // acc[d] = acc[d] * rescale + sum_j p[j] * v[j * head_dim + d].
  void (*accumulate)(const float* p, const float* v, int64_t n, int64_t head_dim, float rescale, float* acc);

  // The key-rows form, for tiles of few query rows (kKeyRowsMaxRows): a decode step's tile
  // is one token times the query heads of one KV head, too few rows to pay for transposing
  // the keys (the transposing gather was 5x the scores and value updates together in perf
  // of ~100M batch-1 decode). Widens n <= kKeyBlock keys and values as rows, for `groups`
  // consecutive KV heads of each cached row (row i's head g at k_rows[i] + g * head_dim):
  // kr[g * group_stride + i * head_dim + d] = K[i][g][d], and V alike into vb. A row's heads
  // are read together, in one pass over its bytes: at long context a decode step reads the
  // whole KV cache from memory, and one head's slice of each row at a time ran at half the
  // speed of whole rows (a one-thread widening loop over 22 layers x 2048 keys: 6.6 against
  // 3.6 ms).
  void (*gather_rows)(const void* const* k_rows, const void* const* v_rows, DType dtype, int64_t head_dim, int32_t n,
                      int64_t groups, int64_t group_stride, float* kr, float* vb);
  // s[j] = sum_d q[d] * kr[j * head_dim + d] for j < n (n <= kKeyBlock): one vector of
  // products per key, summed across lanes 16 (8) keys at a time by a shuffle tree. kr is
  // read for kKeyBlock rows whatever n (the rows past n may hold anything: not used).
  void (*scores_rows)(const float* q, const float* kr, int64_t head_dim, int64_t n, float* s);
};

// Tiles of at most this many query rows (tokens x query heads of the KV head) take the
// key-rows form. Per key and row it costs ~11 vector operations against ~5 for the
// transposed form's scores, but it saves the ~80 per key of transposing: it wins up to
// ~16 rows; 8 leaves the larger GQA groups and prefill on the transposed form.
inline constexpr int64_t kKeyRowsMaxRows = 8;

AttentionTileOps attention_tile_ops_scalar();
AttentionTileOps attention_tile_ops_avx2();    // needs AVX2 + FMA + F16C
AttentionTileOps attention_tile_ops_avx512();  // needs AVX-512 F/BW/VL/DQ (and what AVX2 needs)

}  // namespace tessera::cpu::detail
