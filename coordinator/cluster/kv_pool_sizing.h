#pragma once
// How many KV blocks every rank's pool holds when cache.num_blocks is "auto": computed from
// what the ranks reported when they registered (wire::Register: backend, free memory), the
// same number on every rank (the scheduler's block ids index every rank's pool). Plain
// arithmetic: the model's numbers (bytes per block, weights per rank) come from the caller,
// since the coordinator library never reads model code.
//
// A rank's budget:
//   cuda: cache.memory_fraction x its free device memory, less its weights and its planned
//         activations;
//   cpu:  cache.cpu_kv_bytes (auto: min(2 GiB, 10% of its available memory)), and at most
//         its available memory less its weights and its planned activations (the largest
//         step's: worker/activation_memory.h).
// The pool is the smallest budget / bytes per block over the ranks, at most what
// scheduler.max_num_seqs sequences of max_model_len tokens need, and at least one such
// sequence (else an error naming the rank and the numbers).
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "common/wire/messages.h"

namespace tessera {

// cache.cpu_kv_bytes "auto": min(kCpuKvAutoCapBytes, kCpuKvAutoShare x available).
inline constexpr int64_t kCpuKvAutoCapBytes = int64_t{2} << 30;
inline constexpr double kCpuKvAutoShare = 0.10;

struct KvPoolModel {
  // Per rank (index = rank): K and V of one block (block_size tokens, every layer, that
  // rank's KV heads after the tensor-parallel split, in the KV dtype).
  std::vector<int64_t> bytes_per_block;
  // Per rank: an estimate of its weights in the model dtype (taken before they are loaded);
  // with model.weights_memory_budget, what it holds resident: the budget and the streamed
  // units in flight.
  std::vector<int64_t> weight_bytes;
  // Per rank: the activations of the largest step (empty: none counted), and that step in
  // words for messages ("a step of 4096 tokens and 256 rows of logits").
  std::vector<int64_t> activation_bytes;
  std::string activation_step;
  int block_size = 16;
  int64_t max_model_len = 0;
  int max_num_seqs = 1;
};

struct KvPoolSize {
  int64_t num_blocks = 0;
  int block_size = 16;
  // Where the number came from, for the log: "auto: cache.cpu_kv_bytes 2.0 GiB of 20.1 GiB
  // available reported by rank 0", or "cache.num_blocks".
  std::string source;
  // "cache: N blocks of B tokens (source)".
  std::string describe() const;
};

// The pool for `ranks` (index = rank; every rank registered). Errors: a rank whose budget
// holds fewer blocks than one max_model_len sequence needs, an unknown backend name.
StatusOr<KvPoolSize> size_kv_pool(const CacheSection& cache, const KvPoolModel& model,
                                  const std::vector<wire::Register>& ranks);

// Whether a rank registering after the pool was sized (a restart) can hold it: a CPU rank
// when its reported memory less its weights and activations holds the pool (not its own share
// of that memory again: a tenth of a report a few MiB smaller than the first refused a
// restarted rank for good), a CUDA rank when its budget does. The error names the rank, the
// pool and the memory.
Status check_rank_fits_kv_pool(const CacheSection& cache, const KvPoolModel& model, const KvPoolSize& pool,
                               const wire::Register& rank);

// "2.0 GiB", "512.0 MiB", "4096 bytes".
std::string format_bytes(int64_t bytes);

// The pool size a cluster settled on, written by the worker group's thread that decides it
// (when every rank has registered) and read by whoever builds the scheduler afterwards.
class KvPoolSetting {
 public:
  void set(KvPoolSize size) {
    std::lock_guard<std::mutex> lock(mu_);
    size_ = std::move(size);
  }
  std::optional<KvPoolSize> get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return size_;
  }

 private:
  mutable std::mutex mu_;
  std::optional<KvPoolSize> size_;
};

}  // namespace tessera
