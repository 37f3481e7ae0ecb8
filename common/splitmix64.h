#pragma once
// splitmix64 (Steele, Lea, Flood 2014): a fast, statistically good 64-bit mix, used as a
// counter-based generator (seeds, sampling draws, generated weights, load-generator
// workloads) wherever a value must be a pure function of its inputs.
#include <cstdint>

namespace tessera {

inline constexpr uint64_t kSplitmix64Gamma = 0x9e3779b97f4a7c15ULL;

// The mix of x + gamma: element x of the splitmix64 sequence started at 0.
inline constexpr uint64_t splitmix64(uint64_t x) {
  x += kSplitmix64Gamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace tessera
