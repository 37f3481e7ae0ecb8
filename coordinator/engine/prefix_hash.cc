#include "coordinator/engine/prefix_hash.h"

namespace tessera {
namespace {

// splitmix64 finaliser: FNV-style accumulation alone avalanches poorly on small ids.
uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

uint64_t hash_block_tokens(uint64_t parent_hash, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent_hash ^ (0xcbf29ce484222325ULL + tokens.size()));
  for (int32_t t : tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 0x100000001b3ULL;  // FNV-1a prime, one 32-bit word at a time
  }
  return mix64(h);
}

uint64_t prefix_root(std::string_view lora) {
  if (lora.empty()) return kRootPrefixHash;
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char ch : lora) {
    h ^= static_cast<unsigned char>(ch);
    h *= 0x100000001b3ULL;
  }
  return mix64(kRootPrefixHash ^ mix64(h ^ lora.size()));
}

}  // namespace tessera
