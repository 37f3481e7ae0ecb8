#pragma once
// ZeRO-Inference's lever on the CPU backend (docs/configuration.md, model.weights_memory_budget):
// a rank keeps only part of its weights in its own memory and streams the rest from a backing
// store as each step reaches them. The parts that do not fit are written, in the compute
// layout they were loaded in (converted dtypes, int8 or 4-bit panels), to a file mapped back
// read-only, and their tensors point into that mapping (worker/weight_spill.h): an unnamed
// spill file in model.weights_spill_dir, written at each start, or a cache file in
// model.weights_cache_dir, written by the first start and read back by the next ones (whose
// streamed layers are then never loaded from the checkpoint). Where neither folder is named,
// units that lie in the checkpoint as the kernels read them are mapped from the checkpoint
// file itself instead, and only the others go to a spill file (worker/checkpoint_backing.h).
//
// The units streamed are the embedding table, each layer and the LM head (a tied head is the
// table). A step reads them in that order; before a streamed unit runs it and the units after
// it, model.weights_prefetch_layers in flight in all, are brought in by a helper thread,
// overlapping the current unit's compute, in one of two ways (model.weights_streaming):
//   - map: the unit's tensors point into the file's mapping and the helper maps its pages in
//     (madvise MADV_POPULATE_READ, which reads what the page cache lacks and fills the page
//     tables in one call, instead of a fault per 4 KiB page while the kernels run). The pages
//     are the page cache's: under a memory limit the kernel can take back a unit read ahead
//     before it runs, and it is read again by faults.
//   - read / direct: the unit's tensors point into an anonymous region at the same offsets,
//     and the helper preads the unit into it (direct: with O_DIRECT, no page-cache copy). Those
//     pages are the process's own, so what was read ahead is there when the unit runs.
// After a unit ran its pages leave the process (MADV_DONTNEED; in map mode the page cache may
// keep them). The embedding table is read a row per token, always through the mapping: it is
// never brought in whole, and only the pages of the step's rows count while it is in use.
//
// Which units stay resident and the budget's accounting: worker/weight_units.h (the same rule
// where a device streams from host memory: worker/staged_weights.h). The budget bounds that
// resident set: the units in flight come on top, at most prefetch_layers times the largest
// streamed unit (mapped from a checkpoint file, the kernel may map up to a page-cache folio,
// at most 2 MiB, beyond each end of a unit in flight; they go with the unit).
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/cgroup_memory.h"
#include "common/status.h"
#include "common/weights_budget.h"
#include "worker/model_weights.h"
#include "worker/weight_units.h"

namespace tessera {

class Checkpoint;
struct CheckpointSpan;
class WeightFile;
class WeightSpill;

struct WeightResidencyOptions {
  WeightsBudget budget;     // all: every weight resident (no streaming)
  std::string spill_dir;    // where the spill file goes; empty: $TMPDIR, else /var/tmp
  int prefetch_layers = 2;  // streamed units in flight: the one running and those read ahead
  WeightStreaming streaming = WeightStreaming::kRead;  // how a unit is brought in
  // Into device slots from host memory (worker/staged_weights.h): what a device backend
  // always does; on the CPU backend only where a test runs that path without a device.
  bool device_slots = false;
  // Where the streamed units are kept for the next start (worker/weight_cache.h); empty: an
  // unnamed spill file in spill_dir instead. At most one of the two is set.
  std::string cache_dir;
};

// Whether units loaded without a copy may stream from the checkpoint's own files
// (worker/checkpoint_backing.h): unless a folder is named for the streamed weights
// (spill_dir, say on a local disk where the checkpoint is on a network volume; cache_dir).
bool streams_from_checkpoint(const WeightResidencyOptions& options);
// Whether its layers may too: as above, with direct only where every file of `checkpoint`
// opens for O_DIRECT, and with read not under a memory limit below the checkpoint's size
// (read_streams_from_spill_under_limit); else they go to the spill file. The load asks before
// loading a layer as stored, WeightResidency::make before placing it.
bool streams_layers_from_checkpoint(const WeightResidencyOptions& options, const Checkpoint& checkpoint);
// With read, whether the layers go to the spill file instead because the worker's memory group
// (`limit`, this process's: common/cgroup_memory.h) is smaller than the checkpoint's files.
// The page cache cannot keep such a file in the group, and reading the checkpoint through it
// is the slower: ~1.1B bf16 (2.2 GB), a 1.1 GB group, batch 128, the file read in that group
// before (by an earlier run, or cat): 53.6-53.7 s against 44.3-49.3 s from the spill file,
// the group hitting its limit 15x as often. direct reads it without the page cache.
bool read_streams_from_spill_under_limit(const WeightResidencyOptions& options, const Checkpoint& checkpoint,
                                         const std::optional<CgroupMemory>& limit);

// Both a spill and a cache folder, or no unit in flight, are refused naming the keys.
Status check_weight_store_options(const WeightResidencyOptions& options);

class WeightResidency {
 public:
  // Streams what `options.budget` leaves out of `weights` (host memory: the CPU backend);
  // null when every weight fits. Errors name the key: a budget below the tensors that always
  // stay resident, a folder that cannot take the file, a cache file that is not this model's.
  // `spill`: the one begin_weight_spill made before loading, holding the layers moved while
  // they loaded or rebuilt from a cache file (null: everything is decided and moved here).
  // `cache_identity` (worker/weight_cache.h): what names a cache file, with options.cache_dir.
  // `checkpoint` (may be null): the one the weights were loaded from, whose files units
  // loaded without a copy stream from (worker/checkpoint_backing.h) instead of the spill file.
  static StatusOr<std::unique_ptr<WeightResidency>> make(ModelWeights& weights, const WeightResidencyOptions& options,
                                                         std::shared_ptr<WeightSpill> spill = nullptr,
                                                         const nlohmann::json* cache_identity = nullptr,
                                                         const Checkpoint* checkpoint = nullptr);
  ~WeightResidency();
  WeightResidency(const WeightResidency&) = delete;
  WeightResidency& operator=(const WeightResidency&) = delete;

  // Around each part of a step, in order: the embedding lookup of `rows` tokens, each layer,
  // the LM head.
  void before_embedding(int64_t rows);
  void after_embedding();
  void before_layer(int layer);
  void after_layer(int layer);
  void before_lm_head();
  void after_lm_head();

  // Bytes of weights resident now by this accounting (the resident set and the streamed units
  // in flight), and the most so far.
  int64_t resident_bytes() const { return resident_bytes_; }
  // The part of it that is streamed units asked for and not yet released.
  int64_t in_flight_bytes() const { return resident_bytes_ - resident_set_bytes_; }
  int64_t peak_resident_bytes() const { return peak_bytes_; }
  int64_t budget_bytes() const { return budget_bytes_; }
  // The largest unit streamed whole: its pages (its bytes rounded up to whole pages). The
  // embedding table read by rows adds only the pages of a step's rows while it is looked up.
  int64_t largest_streamed_bytes() const { return largest_streamed_; }
  // Bytes of the units streamed: what a step reads from the spill file (the embedding table's
  // counted whole, though a step reads only its rows).
  int64_t streamed_bytes() const { return streamed_bytes_; }
  int prefetch_layers() const { return prefetch_; }
  // Where each streamed unit lies ([begin, begin + bytes), whole pages: where its tensors, or
  // a table's rows, are read), for a test counting the process's pages there.
  std::vector<std::pair<const char*, size_t>> streamed_ranges() const;
  // How many units stream from the checkpoint's files (worker/checkpoint_backing.h).
  int checkpoint_units() const;
  WeightStreaming streaming() const;
  // One line for the start-up log: resident and streamed bytes and units, the file.
  std::string plan() const;
  // The cache file this rank's streamed units were read back from (not written at this start).
  bool cache_reused() const;

 private:
  struct Unit {
    std::string name;
    int64_t bytes = 0;
    bool streamed = false;
    bool rows_only = false;  // the untied embedding table: read a row per token
    int64_t row_bytes = 0;   // the table's (untied or tied): what one token's lookup reads
    // Where its tensors point when streamed: the spill's region (or a checkpoint file's
    // mapping), and the mapping a table read by rows is read through.
    char* base = nullptr;
    char* file_base = nullptr;
    bool in_checkpoint = false;   // streamed from a checkpoint file's mapping, not the spill file
    // Read (pread) from a checkpoint file into its place in the spill's region, where the
    // file's mapping is not used (read): the file, where the unit's pages start there, and
    // how many bytes to read (the file may end inside its last page).
    int source_fd = -1;                    // opened with O_DIRECT for direct
    const WeightFile* source = nullptr;    // named by the error that stops the worker when a read fails
    size_t source_offset = 0, source_bytes = 0;
    size_t mapping_size = 0;  // of the checkpoint file's mapping it lies in
    size_t offset = 0, span = 0;  // page-aligned region of that mapping when streamed
    int64_t in_flight = 0;        // bytes counted while asked for
    // Its pages: not asked for, queued for the helper, being mapped in, in the process.
    enum class Pages : uint8_t { kOut, kQueued, kMapping, kIn } pages = Pages::kOut;
  };
  WeightResidency() = default;
  // Unit indexes in a step's order: the table (when untied), the layers, the head.
  int layer_unit(int layer) const { return first_layer_unit_ + layer; }
  // The layer a unit is, or -1 for the table and the head.
  int layer_of(int unit) const {
    return unit >= first_layer_unit_ && unit != head_unit_ ? unit - first_layer_unit_ : -1;
  }
  // Places a streamed unit in the checkpoint file it lies in (worker/checkpoint_backing.h).
  void stream_from_checkpoint(Unit& unit, const CheckpointSpan& in_file);
  // What both ways of streaming a unit from the checkpoint count: its converted tensors
  // resident, its file, its size.
  void count_checkpoint_unit(const Unit& unit, const CheckpointSpan& in_file);
  // With read and direct: gives the unit a place in the spill's region, points its tensors
  // there, and reads it from the checkpoint file into it each time it is fetched.
  Status read_from_checkpoint(Unit& unit, const CheckpointSpan& in_file, const UnitTensors& tensors, WeightSpill& spill);
  // The checkpoint files' descriptors for read_from_checkpoint, opened once each.
  StatusOr<int> checkpoint_fd(const WeightFile& file, bool direct);
  // Once every unit is placed: copies of the resident tensors left in those files
  // (copy_resident_from_files); `tensors`: each unit's.
  void copy_resident_from_checkpoint(ModelWeights& weights, const std::vector<UnitTensors>& tensors);
  // Once every unit is placed, with map: the layers streamed from the checkpoint mapped once,
  // and read again onto 2 MiB pages where the page cache held them on small ones
  // (worker/checkpoint_huge_pages.h); what was done goes to huge_page_note_ for plan().
  void map_checkpoint_layers_on_huge_pages();
  void fetch(int unit, int64_t bytes);
  // Read and direct keep the pages of the last unit released (the spare; at most one, counted
  // as in flight) for the next fetch: moved to that unit when it is whole and the same size,
  // else let go. True when the unit fetched is the spare itself, its pages still valid.
  bool use_or_drop_spare(int unit, bool whole);
  void fetch_whole(int unit);
  // Lets a unit's pages go (where its tensors point; `rows`: the table's rows in the file's
  // mapping too).
  void release(int unit, bool rows = false);
  void read_ahead_from(int unit);
  // [begin, end) of its mapping that a released unit gives back: its own range, and for a
  // unit in a checkpoint file everything beside it up to the units there still in flight. The
  // kernel maps page-cache pages around a fault (whole large folios, on filesystems that keep
  // them), which may reach past a unit's ends into units already released; and two units'
  // tensors may meet inside a page, which stays while the other is in flight.
  std::pair<size_t, size_t> release_range(const Unit& unit) const;
  // Returns once a unit asked for whole is in the process (mapping it here if the helper has
  // not started on it).
  void wait_in(int unit);
  // Brings a whole unit into the process: maps its pages (MADV_POPULATE_READ, else they come
  // by faults) or reads it into the anonymous region.
  void populate(const Unit& unit) const;
  void helper_loop();
  // For plan(): the checkpoint's files and the spill or cache file, as far as units stream from them.
  std::string streamed_from() const;
  // Marks a queued unit as being mapped, maps it with `lock` released, marks it in.
  void map_in(Unit& unit, std::unique_lock<std::mutex>& lock);

  std::vector<Unit> units_;
  int first_layer_unit_ = 0, head_unit_ = -1, table_unit_ = -1;
  int64_t resident_bytes_ = 0, resident_set_bytes_ = 0, peak_bytes_ = 0, budget_bytes_ = 0, largest_streamed_ = 0, fixed_bytes_ = 0;
  int prefetch_ = 2;
  UnitLists lists_;  // for plan()
  int64_t streamed_bytes_ = 0;
  int spare_ = -1;            // the unit whose pages are kept for the next fetch, or -1
  bool spare_valid_ = false;  // whether they hold it (it was read in before its release)
  std::shared_ptr<WeightSpill> spill_;  // the file and its mapping (the tensors keep the mapping too)
  std::vector<std::shared_ptr<const WeightFile>> checkpoint_files_;  // those units stream from
  std::vector<std::pair<const WeightFile*, int>> checkpoint_fds_;   // closed with the residency
  std::string huge_page_note_;  // for plan(): layers read again onto 2 MiB pages at load
  std::string limit_note_;      // for plan(): read took the spill file under a memory limit
  // The helper that brings units ahead in; Unit::pages is guarded by mu_.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> queue_;
  bool stop_ = false;
  std::thread helper_;
};

// Streaming decided while loading, so that loading never holds more than the resident share
// and the layer being loaded: before the weights load, a spill file (with room reserved from
// `estimated_rank_bytes`, the rank's weights as stored) and the budget; then each layer as it
// is loaded stays (layers from the first while they fit beside `estimated_head_bytes` for the
// LM head, which the rule keeps first) or moves to the file at once. Null when the budget
// holds everything. With a cache file read back, the file decided every layer: the streamed
// ones are rebuilt from it (WeightSpill::restore_layer) instead of being loaded.
StatusOr<std::shared_ptr<WeightSpill>> begin_weight_spill(const WeightResidencyOptions& options,
                                                          int64_t estimated_rank_bytes, int64_t estimated_head_bytes,
                                                          const nlohmann::json* cache_identity = nullptr);
// `checkpoint` (null: none): the layer, when it streams and was loaded without a copy, streams
// from the checkpoint file instead of being written to the spill file.
Status spill_loaded_layer(WeightSpill& spill, int layer, LayerWeights& layer_weights,
                          const Checkpoint* checkpoint = nullptr);
// Whether the next layer to load will stream (the last one did, or one like it does not fit
// what is left of the budget): asked before loading it as stored (worker/checkpoint_backing.h).
bool spill_streams_next_layer(const WeightSpill& spill);

}  // namespace tessera
