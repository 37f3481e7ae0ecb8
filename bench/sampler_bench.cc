// Single-thread cost of choosing one token from one row of logits (worker/sampler.h,
// sample_token: the draw and the sampled token's logprob) at the settings requests use: plain
// temperature 1 (the OpenAI API's defaults: top_p 1, no top-k), top-p 0.9, top-k 40 and
// min-p 0.05, on vocabularies of Llama 2 (32000) and Llama 3 (128256) size. The logits are
// seeded Gaussian rows of two spreads: "peaked" (standard deviation 4: a few ids hold most
// of the mass, as in confident text) and "flat" (standard deviation 1: top-p 0.9 then keeps
// most of the vocabulary). The `kept` counter is how many candidates top-p / top-k / min-p
// left (the whole vocabulary for plain sampling).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "common/sampling_params.h"
#include "worker/sampler.h"

namespace {

using tessera::SamplingParams;

enum class Mode { kPlain, kTopP, kTopK, kMinP };

SamplingParams params_for(Mode mode) {
  SamplingParams p;
  p.temperature = 1.0f;
  if (mode == Mode::kTopP) p.top_p = 0.9f;
  if (mode == Mode::kTopK) p.top_k = 40;
  if (mode == Mode::kMinP) p.min_p = 0.05f;
  return p;
}

// Eight rows, so that successive draws do not all read one row from cache.
std::vector<std::vector<float>> logit_rows(int64_t vocab, float spread) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<std::vector<float>> rows(8, std::vector<float>(static_cast<size_t>(vocab)));
  for (auto& row : rows)
    for (float& x : row) x = normal(rng);
  return rows;
}

void BM_SampleToken(benchmark::State& state, Mode mode, float spread) {
  const int64_t vocab = state.range(0);
  const auto rows = logit_rows(vocab, spread);
  const SamplingParams params = params_for(mode);
  tessera::SampleRequest request;
  request.vocab = vocab;
  request.params = &params;
  request.seed = 11;
  int64_t draws = 0;
  for (auto _ : state) {
    request.logits = rows[static_cast<size_t>(draws % 8)].data();
    request.token_index = static_cast<int32_t>(draws);
    benchmark::DoNotOptimize(tessera::sample_token(request));
    ++draws;
  }
  request.logits = rows[0].data();
  const size_t kept = tessera::token_distribution(request).size();
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(draws), benchmark::Counter::kIsRate);
  state.counters["kept"] = static_cast<double>(kept);
}

#define SAMPLER_BENCH(name, mode, spread) \
  BENCHMARK_CAPTURE(BM_SampleToken, name, mode, spread)->Arg(32000)->Arg(128256)->Unit(benchmark::kMicrosecond)

SAMPLER_BENCH(plain_peaked, Mode::kPlain, 4.0f);
SAMPLER_BENCH(plain_flat, Mode::kPlain, 1.0f);
SAMPLER_BENCH(top_p_peaked, Mode::kTopP, 4.0f);
SAMPLER_BENCH(top_p_flat, Mode::kTopP, 1.0f);
SAMPLER_BENCH(top_k_peaked, Mode::kTopK, 4.0f);
SAMPLER_BENCH(min_p_peaked, Mode::kMinP, 4.0f);

}  // namespace

BENCHMARK_MAIN();
