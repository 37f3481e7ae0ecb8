#pragma once
// The backing store of the CPU's streamed weights (worker/weight_residency.h): one file holding
// the streamed units in their compute layout, mapped read-only and reserved up front (the file
// grows as units are appended; nothing past its end is ever read). A unit's tensors point into
// that mapping (map, and the embedding table read by rows) or into an anonymous region of the
// same size at the same offsets, where read and direct bring it in (their host copies go as
// the last reference drops).
//
// The file is either
//   - a spill file (model.weights_spill_dir): unnamed (O_TMPFILE, or unlinked at once), written
//     at every start and gone with the process; or
//   - a cache file (model.weights_cache_dir, worker/weight_cache.h): named after the model, the
//     rank and the options that decide the layout, written once (unnamed until its trailer is
//     written, then linked under its name, so a start cut short leaves nothing behind) and read
//     back by later starts, whose streamed layers then come from it instead of the checkpoint.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/weights_budget.h"
#include "worker/model_weights.h"
#include "worker/weight_units.h"

namespace tessera {

inline constexpr size_t kSpillPage = 4096;
// Where units are read into the process's own pages (read, direct), each starts on a huge
// page: faulting in 4 KiB anonymous pages ran at ~350 MB/s on a 2-core VM (a fault each),
// 2 MiB ones at ~10 GB/s, and a unit released whole gives back whole huge pages.
inline constexpr size_t kHugePage = size_t{2} << 20;

inline size_t align_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
inline size_t spill_unit_alignment(WeightStreaming s) { return s == WeightStreaming::kMap ? kSpillPage : kHugePage; }
// Bytes a unit takes in the file at most: its distinct buffers, each 64-byte aligned, the
// unit aligned to `alignment`.
size_t spill_span_bound(const UnitTensors& tensors, size_t alignment);

// [offset, offset + span) of a unit in the file.
using SpillRange = std::pair<size_t, size_t>;

// Reads [offset, offset + bytes) of `fd` into `to` (read and direct bring streamed units in so,
// from the spill file or a checkpoint's). With O_DIRECT (`whole_pages`) `to` and `offset`
// start on a page and the last read asks for the rest of that page past the bytes: the file
// may end there, and `to` must have room to the page's end. An I/O error here is the disk
// failing under a running step: the worker stops, naming `what` (the coordinator restarts it),
// as a fault on a mapping would.
void read_streamed_range(int fd, char* to, size_t offset, size_t bytes, bool whole_pages, const std::string& what);

// The tensors of a unit read a row per token, through the file's mapping.
using RowTensors = std::vector<const Tensor*>;

class WeightSpill {
 public:
  // An unnamed spill file in `dir` with room for `reserve` bytes of units.
  static StatusOr<std::shared_ptr<WeightSpill>> open(const std::string& dir, size_t reserve, WeightStreaming streaming);
  // The cache file for `identity` (worker/weight_cache.h) in `dir`: read back (reused()) when
  // it is there and was written for this identity; else a new one, with room for `reserve`
  // bytes, named by commit(). One written for another identity, or damaged, is refused naming
  // the file and what differs.
  static StatusOr<std::shared_ptr<WeightSpill>> open_cache(const std::string& dir, const nlohmann::json& identity,
                                                           size_t reserve, WeightStreaming streaming);
  ~WeightSpill();
  WeightSpill(const WeightSpill&) = delete;
  WeightSpill& operator=(const WeightSpill&) = delete;

  // Writes the unit's distinct buffers and re-points its tensors, those in `by_rows` (the
  // embedding table, read a row per token, and a coded table's side tensor; a tied head's
  // views of the same buffers are not) into the mapping; records their places under `key` (a
  // unit's name), with `layer`'s fields when the unit is a layer.
  StatusOr<SpillRange> append(const std::string& key, const UnitTensors& tensors, const RowTensors& by_rows = {},
                              LayerWeights* layer = nullptr);
  // A cache file's trailer, then its name (the file is complete: every streamed unit was
  // appended). `layers`: the model's layer count.
  Status commit(int layers);

  // A cache file read back: whether it holds a unit, the units it holds, and the layers
  // rebuilt from it while loading.
  bool reused() const { return reused_; }
  bool holds(const std::string& key) const { return units_.contains(key); }
  std::set<std::string> unit_keys() const;
  bool restored_at_load(int layer) const { return restored_layers_.count(layer) > 0; }
  // Rebuilds layer `layer` (its fields and its tensors) from a cache file read back; false
  // when the file does not hold it (the layer stays resident and is loaded).
  StatusOr<bool> restore_layer(int layer, LayerWeights* lw);
  // Points a loaded unit's tensors at their places in a cache file read back; the file must
  // record the same dtypes and shapes.
  StatusOr<SpillRange> restore(const std::string& key, const UnitTensors& tensors, const RowTensors& by_rows = {});

  // A place of `span` bytes in the anonymous region (read) for a unit read from another file
  // (a checkpoint's, worker/checkpoint_backing.h): nothing is written to this file there.
  StatusOr<SpillRange> place_in_region(size_t span);
  // Reads [offset, offset + span) of the file into the anonymous region (read, direct). An
  // I/O error here is the disk failing under a running step: the worker stops, naming it
  // (the coordinator restarts it), as a fault on the mapping would.
  void read_in(size_t offset, size_t span) const;
  char* file_base() const { return static_cast<char*>(const_cast<void*>(mapping_.get())); }
  char* region_base() const { return static_cast<char*>(const_cast<void*>(region_.get())); }
  // What keeps the region mapped: the owner of tensors pointing into it.
  const std::shared_ptr<const void>& region() const { return region_; }
  WeightStreaming streaming() const { return streaming_; }
  // For the start-up plan: "an unlinked spill file in /var/tmp", "the cache file PATH (read back)".
  std::string describe() const;

  // Layers decided while loading: their ranges ({0, 0}: resident); and the budget the load
  // decided by.
  std::vector<SpillRange> layer_ranges;
  // Layers decided while loading to stream from the checkpoint file they were loaded from
  // (worker/checkpoint_backing.h): not in this file, their layer_ranges {0, 0}.
  std::set<int> checkpoint_layers;
  int64_t budget_bytes = 0;
  int64_t room = 0;  // budget left for more resident layers while loading
  // The last layer's bytes as loaded; before the first, an estimate (layers are alike).
  int64_t layer_bytes = 0;

 private:
  WeightSpill() = default;
  // Maps the file (and the anonymous region for read and direct) for `reserve` bytes.
  Status map(size_t reserve);
  StatusOr<SpillRange> unit_range(const std::string& key) const;
  // Errors naming the key, and the folder (a file cannot be made there) or the cache file.
  Status folder_error(const std::string& what) const;
  Status file_error(const std::string& what) const;

  int fd_ = -1, direct_fd_ = -1;
  std::string dir_;
  std::string key_ = "model.weights_spill_dir";  // the key errors name
  std::string cache_path_;                        // a cache file's name ("" for a spill file)
  std::string partial_path_;  // where a cache file is written under a name of its own until commit()
  bool reused_ = false, committed_ = false;
  WeightStreaming streaming_ = WeightStreaming::kRead;
  size_t reserve_ = 0, end_ = 0, alignment_ = kSpillPage;  // units start on alignment_
  nlohmann::json identity_;  // a cache file's
  nlohmann::json units_ = nlohmann::json::object();  // key -> {"offset", "span", "tensors", "fields"}
  std::set<int> restored_layers_;
  std::shared_ptr<const void> mapping_;  // the file's, read-only
  std::shared_ptr<const void> region_;   // the anonymous region (read, direct), else mapping_
};

}  // namespace tessera
