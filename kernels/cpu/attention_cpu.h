#pragma once
// Internal to the CPU backend: the two paged-attention kernels behind
// CpuBackend::attention_impl (arguments as Backend::attention, GQA group filled in).
//  - attention_tiled (the default): one work item per (sequence, KV head, tile of up to
//    kQueryTile new tokens) holds every query row of the tile for every query head that
//    reads that KV head, and walks the keys in blocks of kKeyBlock: each block of K and V
//    is read from the cache and widened once per tile (not once per query row), scores
//    go through an online softmax (running max and sum per row, FlashAttention style), so
//    memory traffic grows with tokens × keys / kQueryTile and nothing of size keys is
//    kept per row.
//  - attention_reference: the plain two-pass form, one (token, head) at a time; kept as
//    the reference the tiled kernel is tested against (and for A/B runs: the backend's
//    CpuKernelOptions::attention picks it).
#include "common/kernel_options.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention_tile.h"

namespace tessera::cpu::detail {

inline constexpr int32_t kQueryTile = 16;

void attention_reference(const float* q, int64_t q_row_stride, int64_t q_heads, const AttentionBatch& batch,
                         const TensorView& k_cache, const TensorView& v_cache, const AttentionParams& params,
                         const TensorView& out, const GqaLayout& gqa);

void attention_tiled(const AttentionTileOps& ops, const float* q, int64_t q_row_stride, int64_t q_heads,
                     const AttentionBatch& batch, const TensorView& k_cache, const TensorView& v_cache,
                     const AttentionParams& params, const TensorView& out, const GqaLayout& gqa);

// The inner loops of flavour `isa` (usable_cpu_isa: never above what the CPU supports).
AttentionTileOps attention_tile_ops_for(CpuIsa isa);

}  // namespace tessera::cpu::detail
