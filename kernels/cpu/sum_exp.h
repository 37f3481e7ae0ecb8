#pragma once
// The normaliser of a softmax over a row of logits, for the sampler's log-probabilities: run
// once per generated token and per scored prompt token over the whole vocabulary (128k-262k
// entries on modern tokenizers), where a scalar double exp per entry cost more than the
// rest of sampling.
#include <cstdint>

namespace tessera::cpu {

// sum_i exp(x[i] - max), accumulated in double. Each term is a float exp (vector polynomial
// on AVX2 CPUs, |relative error| < 2e-7; std::exp otherwise); max must be >= every x[i],
// so the terms are at most 1 and the sum of n terms loses nothing a log-probability shows.
double sum_exp_shifted(const float* x, int64_t n, float max);

// out[i] = exp((x[i] - max) / temperature), the same float exp, and their sum in double: the
// sampler's unnormalised weights of a row of candidates. temperature > 0; max >= every x[i].
// Each weight is within 3e-7 relative plus the float rounding of its argument (2^-24 of
// |x[i] - max| / temperature): 1e-6 of a weight of e^-16, which no draw can tell.
double exp_shifted(const float* x, int64_t n, float max, float temperature, float* out);

}  // namespace tessera::cpu
