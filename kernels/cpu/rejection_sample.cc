#include "kernels/cpu/rejection_sample.h"

#include <algorithm>

namespace tessera::cpu {
namespace {

double row_sum(const float* w, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += w[i];
  return s;
}

}  // namespace

RowVerdict rejection_sample_row(const float* p, const float* q, int64_t vocab, int32_t proposal, double u, double v) {
  const double sum_p = row_sum(p, vocab), sum_q = row_sum(q, vocab);
  const double inv_p = sum_p > 0 ? 1.0 / sum_p : 0.0, inv_q = sum_q > 0 ? 1.0 / sum_q : 0.0;
  if (proposal >= 0 && proposal < vocab) {
    const double p_x = p[proposal] * inv_p, q_x = q[proposal] * inv_q;
    if (q_x > 0 && u * q_x < p_x) return {proposal, true};
  }
  // Rejected: the residual max(0, p - q); when rounding leaves none (p equal to q), p itself.
  auto residual = [&](int64_t i) { return std::max(0.0, p[i] * inv_p - q[i] * inv_q); };
  double total = 0;
  for (int64_t i = 0; i < vocab; ++i) total += residual(i);
  const bool from_p = !(total > 0);
  auto weight = [&](int64_t i) { return from_p ? p[i] * inv_p : residual(i); };
  if (from_p) {
    total = 0;
    for (int64_t i = 0; i < vocab; ++i) total += weight(i);
  }
  const double target = v * total;
  double acc = 0;
  int64_t last = 0;  // the last id with weight: where a draw past the end (rounding) lands
  for (int64_t i = 0; i < vocab; ++i) {
    const double w = weight(i);
    if (!(w > 0)) continue;
    acc += w;
    last = i;
    if (target < acc) return {static_cast<int32_t>(i), false};
  }
  return {static_cast<int32_t>(last), false};
}

}  // namespace tessera::cpu
