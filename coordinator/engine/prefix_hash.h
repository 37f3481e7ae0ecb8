#pragma once
// Content hash of one full KV block for prefix caching. The hash is chained: it mixes the
// previous block's hash with this block's tokens, so equal hashes stand for equal *whole
// prefixes* (up to collisions, which the block manager rules out by comparing tokens).
#include <cstdint>
#include <span>
#include <string_view>

namespace tessera {

// The "previous hash" of a sequence's first block.
inline constexpr uint64_t kRootPrefixHash = 0x9e3779b97f4a7c15ULL;

uint64_t hash_block_tokens(uint64_t parent_hash, std::span<const int32_t> tokens);

// The "previous hash" of the first block of a sequence computed with the LoRA adapter `lora`
// (kRootPrefixHash for the base model): the same tokens under different adapters have
// different KV, so their blocks are different prefixes.
uint64_t prefix_root(std::string_view lora);

}  // namespace tessera
