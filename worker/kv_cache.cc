#include "worker/kv_cache.h"

namespace tessera {

KvCache::KvCache(const ModelConfig& config, int block_size, int num_blocks, Backend& backend)
    : block_size_(block_size), num_blocks_(num_blocks) {
  TESSERA_CHECK_GT(block_size, 0);
  TESSERA_CHECK_GT(num_blocks, 0);
  for (int64_t l = 0; l < config.layers; ++l) {
    k_.push_back(backend.alloc({num_blocks, block_size, config.kv_heads, config.head_dim}, DType::kF32));
    v_.push_back(backend.alloc({num_blocks, block_size, config.kv_heads, config.head_dim}, DType::kF32));
  }
}

int64_t KvCache::bytes_per_block(const ModelConfig& config, int block_size) {
  return 2 * config.layers * block_size * config.kv_heads * config.head_dim * static_cast<int64_t>(sizeof(float));
}

}  // namespace tessera
