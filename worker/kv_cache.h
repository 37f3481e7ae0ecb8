#pragma once
// The paged KV cache of one rank: per layer, K and V pools of fixed-size blocks,
// [num_blocks, block_size, kv_heads, head_dim] in the cache dtype (f32, f16 or bf16). Which
// sequence owns which block is decided outside (the block manager); this only holds the
// memory.
#include <memory>
#include <vector>

#include "common/tensor.h"
#include "kernels/backend.h"
#include "worker/kv_prefaulter.h"
#include "worker/model_config.h"

namespace tessera {

class KvCache {
 public:
  KvCache(const ModelConfig& config, int block_size, int num_blocks, DType dtype, Backend& backend);

  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }
  const TensorView& k(int layer) const { return k_[layer].view(); }
  const TensorView& v(int layer) const { return v_[layer].view(); }
  DType dtype() const { return dtype_; }
  // Copy-on-write support: block `dst` becomes a copy of block `src` in every layer.
  void copy_block(int src, int dst, Backend& backend);
  // A step is about to write blocks below `end`: on the CPU, the pages of those and of the
  // next few blocks are faulted in ahead of use (KvPrefaulter); elsewhere nothing.
  void in_use_below(int end) {
    if (prefaulter_) prefaulter_->in_use_below(end);
  }
  // Bytes one block takes across all layers (K and V), for sizing the pool.
  static int64_t bytes_per_block(const ModelConfig& config, int block_size, DType dtype);

 private:
  int block_size_;
  int num_blocks_;
  DType dtype_;
  std::vector<Tensor> k_, v_;
  std::unique_ptr<KvPrefaulter> prefaulter_;  // CPU only; stopped before the pools go
};

}  // namespace tessera
