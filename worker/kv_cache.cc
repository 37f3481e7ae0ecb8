#include "worker/kv_cache.h"

namespace tessera {

KvCache::KvCache(const ModelConfig& config, int block_size, int num_blocks, DType dtype, Backend& backend)
    : block_size_(block_size), num_blocks_(num_blocks), dtype_(dtype) {
  TESSERA_CHECK_GT(block_size, 0);
  TESSERA_CHECK_GT(num_blocks, 0);
  for (int64_t l = 0; l < config.layers; ++l) {
    k_.push_back(backend.alloc_persistent({num_blocks, block_size, config.kv_heads, config.head_dim}, dtype));
    v_.push_back(backend.alloc_persistent({num_blocks, block_size, config.kv_heads, config.head_dim}, dtype));
  }
  if (backend.kind() == BackendKind::kCpu) {
    std::vector<KvPrefaulter::Region> regions;
    const size_t block_bytes = static_cast<size_t>(block_size * config.kv_heads * config.head_dim) * dtype_size(dtype);
    for (size_t l = 0; l < k_.size(); ++l) {
      regions.push_back({k_[l].data<char>(), block_bytes});
      regions.push_back({v_[l].data<char>(), block_bytes});
    }
    prefaulter_ = std::make_unique<KvPrefaulter>(std::move(regions), num_blocks);
  }
}

void KvCache::copy_block(int src, int dst, Backend& backend) {
  for (size_t l = 0; l < k_.size(); ++l) {
    backend.copy_block(k_[l].view(), src, dst);
    backend.copy_block(v_[l].view(), src, dst);
  }
}

int64_t KvCache::bytes_per_block(const ModelConfig& config, int block_size, DType dtype) {
  return 2 * config.layers * block_size * config.kv_heads * config.head_dim * static_cast<int64_t>(dtype_size(dtype));
}

}  // namespace tessera
