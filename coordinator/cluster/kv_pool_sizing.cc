#include "coordinator/cluster/kv_pool_sizing.h"

#include <algorithm>
#include <climits>
#include <cstdio>

namespace tessera {
namespace {

struct RankBudget {
  int64_t blocks = 0;  // what the budget holds
  std::string why;     // how the budget was formed, for messages
  // The most the rank could hold, for a rank registering after the pool was sized: a CPU
  // rank's memory less its weights and activations (the auto share, a tenth of what it reports,
  // moves with that report and would refuse a restarted rank over a few MiB); a CUDA rank's
  // budget as above.
  int64_t capacity = 0;
  std::string capacity_why;
};

int64_t clamp_to_i64(uint64_t v) { return v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v); }

StatusOr<RankBudget> rank_budget(const CacheSection& cache, const KvPoolModel& model, const wire::Register& reg) {
  const int r = reg.rank;
  if (r < 0 || r >= static_cast<int>(model.bytes_per_block.size()) ||
      r >= static_cast<int>(model.weight_bytes.size())) {
    return internal_error("KV pool sizing has no model numbers for rank " + std::to_string(r));
  }
  const int64_t free = clamp_to_i64(reg.free_memory_bytes);
  const int64_t activations =
      r < static_cast<int>(model.activation_bytes.size()) ? model.activation_bytes[r] : 0;
  // What a rank's other memory takes: its weights, and the largest step's activations.
  const int64_t taken = model.weight_bytes[r] + activations;
  const std::string less = format_bytes(model.weight_bytes[r]) + " of weights" +
                           (activations > 0 ? " and " + format_bytes(activations) + " of activations (" +
                                                  model.activation_step + ")"
                                            : std::string());
  const int64_t per_block = model.bytes_per_block[r];
  if (per_block <= 0) return internal_error("KV pool sizing: rank " + std::to_string(r) + " has no KV bytes per block");
  const std::string who = "reported by rank " + std::to_string(r);
  RankBudget b;
  int64_t budget = 0;
  if (reg.backend == "cuda") {
    budget = static_cast<int64_t>(cache.memory_fraction * static_cast<double>(free)) - taken;
    char fraction[32];
    std::snprintf(fraction, sizeof(fraction), "%g", cache.memory_fraction);
    b.why = std::string("cache.memory_fraction ") + fraction + " of the " + format_bytes(free) + " free " + who +
            " (cuda) less " + less;
    b.capacity = std::max<int64_t>(budget, 0) / per_block;
    b.capacity_why = b.why;
  } else if (reg.backend == "cpu") {
    const int64_t room = free - taken;
    b.capacity = std::max<int64_t>(room, 0) / per_block;
    b.capacity_why = "the " + format_bytes(free) + " available " + who + " less " + less;
    int64_t wanted = 0;
    std::string what;
    if (cache.cpu_kv_bytes) {
      wanted = *cache.cpu_kv_bytes;
      what = "cache.cpu_kv_bytes " + format_bytes(wanted);
    } else {
      wanted = std::min(kCpuKvAutoCapBytes, static_cast<int64_t>(kCpuKvAutoShare * static_cast<double>(free)));
      what = "cache.cpu_kv_bytes auto (min(2 GiB, 10% of available)) " + format_bytes(wanted);
    }
    if (wanted <= room) {
      b.why = what + " of " + format_bytes(free) + " available " + who;
      budget = wanted;
    } else {
      b.why = what + " capped to " + format_bytes(std::max<int64_t>(room, 0)) + ": the " + format_bytes(free) +
              " available " + who + " less " + less;
      budget = room;
    }
  } else {
    return invalid_argument("rank " + std::to_string(r) + " registered with backend '" + reg.backend +
                            "'; cache.num_blocks auto knows cpu and cuda");
  }
  b.blocks = std::max<int64_t>(budget, 0) / per_block;
  return b;
}

int64_t blocks_per_sequence(const KvPoolModel& model) {
  return (model.max_model_len + model.block_size - 1) / model.block_size;
}

}  // namespace

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024 && bytes > -1024) return std::to_string(bytes) + " bytes";
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while ((v >= 1024 || v <= -1024) && u < 3) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.1f %s", v, units[u]);
  return buf;
}

std::string KvPoolSize::describe() const {
  return "cache: " + std::to_string(num_blocks) + " blocks of " + std::to_string(block_size) + " tokens (" + source +
         ")";
}

StatusOr<KvPoolSize> size_kv_pool(const CacheSection& cache, const KvPoolModel& model,
                                  const std::vector<wire::Register>& ranks) {
  if (ranks.empty()) return internal_error("KV pool sizing without any rank");
  const int64_t per_seq = blocks_per_sequence(model);
  KvPoolSize pool;
  pool.block_size = model.block_size;
  int64_t smallest = INT64_MAX;
  std::string why;
  int limiting = 0;
  for (const wire::Register& reg : ranks) {
    TESSERA_ASSIGN_OR_RETURN(RankBudget b, rank_budget(cache, model, reg));
    if (b.blocks < smallest) {
      smallest = b.blocks;
      why = b.why;
      limiting = reg.rank;
    }
  }
  if (smallest < per_seq) {
    return resource_exhausted("cache.num_blocks auto: " + why + " holds " + std::to_string(smallest) + " blocks of " +
                              format_bytes(model.bytes_per_block[limiting]) + ", fewer than the " +
                              std::to_string(per_seq) + " one " + std::to_string(model.max_model_len) +
                              "-token sequence needs; lower scheduler.max_model_len (or "
                              "scheduler.max_num_batched_tokens, which sets the activations), give the rank more "
                              "memory (cache.cpu_kv_bytes, cache.memory_fraction, worker.memory_limit_bytes) or "
                              "set cache.num_blocks");
  }
  pool.num_blocks = smallest;
  pool.source = "auto: " + why;
  const int64_t wanted = per_seq * model.max_num_seqs;
  if (pool.num_blocks > wanted) {
    pool.num_blocks = wanted;
    pool.source += "; capped at the " + std::to_string(wanted) + " blocks scheduler.max_num_seqs " +
                   std::to_string(model.max_num_seqs) + " sequences of " + std::to_string(model.max_model_len) +
                   " tokens need";
  }
  if (pool.num_blocks > INT32_MAX) {  // block ids are i32 on the wire
    pool.num_blocks = INT32_MAX;
    pool.source += "; capped at 2^31 - 1 blocks";
  }
  return pool;
}

Status check_rank_fits_kv_pool(const CacheSection& cache, const KvPoolModel& model, const KvPoolSize& pool,
                               const wire::Register& reg) {
  TESSERA_ASSIGN_OR_RETURN(RankBudget b, rank_budget(cache, model, reg));
  if (b.capacity >= pool.num_blocks) return Status::ok();
  return resource_exhausted("rank " + std::to_string(reg.rank) + " (host " + reg.host + ", pid " +
                            std::to_string(reg.pid) + "): " + b.capacity_why + " holds " + std::to_string(b.capacity) +
                            " KV blocks, fewer than the " + std::to_string(pool.num_blocks) +
                            " of the pool the group was sized with; free memory on that rank or restart the "
                            "coordinator to size the pool again");
}

}  // namespace tessera
