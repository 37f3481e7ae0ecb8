#pragma once
// FNV-1a, 64 bits (Fowler, Noll, Vo): a short, stable hash of bytes, for names and checksums
// that must not change between builds or hosts (a generated tensor's seed, a weight cache
// file's name and trailer). Not for anything an adversary chooses.
#include <cstdint>
#include <string_view>

namespace tessera {

inline constexpr uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

}  // namespace tessera
