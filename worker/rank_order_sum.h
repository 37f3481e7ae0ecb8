#pragma once
// The element-wise sum every CPU communicator's all-reduce ends with: the ranks' parts added in
// rank order 0..N-1 (bf16 summed in f32 and rounded once), whoever computes it, so every rank
// holds the same bytes and shared memory and Gloo give the same results.
#include <cstdint>

namespace tessera {

// out[i] = src[0][i] + src[1][i] + ... + src[n_src - 1][i]; n_src >= 2. `out` may alias src[0].
void sum_in_rank_order(const float* const* src, int n_src, int64_t n, float* out);
void sum_in_rank_order(const uint16_t* const* src, int n_src, int64_t n, uint16_t* out);

}  // namespace tessera
