#pragma once
// Turns one row of logits into a token id: greedy (temperature 0; ties go to the lowest
// id, as torch.argmax does) or sampling with temperature, top-k and top-p.
#include <cstdint>
#include <random>

#include "common/sampling_params.h"

namespace tessera {

int32_t argmax(const float* logits, int64_t vocab);
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, std::mt19937_64& rng);

}  // namespace tessera
