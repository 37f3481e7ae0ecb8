#pragma once
// Backend::rejection_sample_rows on the CPU, one row at a time: speculative sampling's check of
// one proposal against the target's and the draft's sampling weights (kernels/backend.h has
// the contract; kernels/cuda/rejection_sample.cu is its device twin).
#include <cstdint>

namespace tessera::cpu {

struct RowVerdict {
  int32_t token = 0;
  bool accepted = false;
};

// p and q: the row's `vocab` weights; u and v: the acceptance and residual draws in [0, 1).
RowVerdict rejection_sample_row(const float* p, const float* q, int64_t vocab, int32_t proposal, double u, double v);

}  // namespace tessera::cpu
