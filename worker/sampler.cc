#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace tessera {

int32_t argmax(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, std::mt19937_64& rng) {
  if (params.temperature <= 0.0f) return argmax(logits, vocab);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  int64_t keep = vocab;
  if (params.top_k > 0 && params.top_k < vocab) keep = params.top_k;
  // Highest logits first; stable so equal logits keep id order (deterministic for a seed).
  std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  order.resize(keep);
  std::vector<double> p(keep);
  const double mx = logits[order[0]];
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += p[i] = std::exp((logits[order[i]] - mx) / params.temperature);
  if (params.top_p < 1.0f) {
    double mass = 0;
    int64_t n = 0;
    while (n < keep && mass < params.top_p * sum) mass += p[n++];
    keep = std::max<int64_t>(n, 1);
    p.resize(keep);
    sum = mass > 0 ? mass : p[0];
  }
  std::uniform_real_distribution<double> u(0.0, sum);
  double r = u(rng), acc = 0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (r < acc) return order[i];
  }
  return order[keep - 1];
}

}  // namespace tessera
