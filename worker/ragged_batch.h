#pragma once
// Lays sequences out as one ragged AttentionBatch (kernels/backend.h): where each new
// token's K/V goes in the paged cache, each sequence's context length and its block table
// row. The executor's target step and the draft model's steps build their batches with it.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/backend.h"

namespace tessera {

class RaggedBatchBuilder {
 public:
  // Every table added must have at most `max_blocks_per_seq` entries (rows are padded to it).
  RaggedBatchBuilder(int block_size, int max_blocks_per_seq) : block_size_(block_size) {
    batch_.max_blocks_per_seq = max_blocks_per_seq;
    batch_.query_start.push_back(0);
  }
  // One sequence's `count` new tokens at positions first .. first + count - 1.
  void add(const std::vector<int32_t>& table, int32_t first, int32_t count) {
    for (int32_t pos = first; pos < first + count; ++pos)
      batch_.slot_mapping.push_back(table[static_cast<size_t>(pos / block_size_)] * block_size_ + pos % block_size_);
    batch_.query_start.push_back(batch_.query_start.back() + count);
    batch_.context_lens.push_back(first + count);
    batch_.block_tables.insert(batch_.block_tables.end(), table.begin(), table.end());
    batch_.block_tables.insert(batch_.block_tables.end(), batch_.max_blocks_per_seq - table.size(), -1);
  }
  int32_t num_rows() const { return batch_.query_start.back(); }
  const AttentionBatch& batch() const { return batch_; }

 private:
  int block_size_;
  AttentionBatch batch_;
};

}  // namespace tessera
