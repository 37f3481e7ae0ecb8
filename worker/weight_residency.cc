#include "worker/weight_residency.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "common/cgroup_memory.h"
#include "worker/checkpoint_backing.h"
#include "worker/checkpoint_huge_pages.h"
#include "worker/weight_spill.h"
#include "worker/weight_units.h"

namespace tessera {
namespace {

std::string spill_dir_or_default(const std::string& dir) {
  if (!dir.empty()) return dir;
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/var/tmp";
}

// Where the streamed units go: the cache file for `identity` under this budget when
// model.weights_cache_dir is set, else an unnamed spill file.
StatusOr<std::shared_ptr<WeightSpill>> open_weight_store(const WeightResidencyOptions& o, const nlohmann::json* identity,
                                                         int64_t budget_bytes, size_t reserve) {
  if (o.cache_dir.empty()) return WeightSpill::open(spill_dir_or_default(o.spill_dir), reserve, o.streaming);
  if (identity == nullptr) return internal_error("weight cache: no identity to name the cache file by");
  nlohmann::json id = *identity;
  id["layout"]["budget_bytes"] = budget_bytes;
  return WeightSpill::open_cache(o.cache_dir, id, reserve, o.streaming);
}

// Whether the last layer loaded streams (to the spill file or from the checkpoint).
bool last_layer_streams(const WeightSpill& spill) {
  if (spill.layer_ranges.empty()) return false;
  const int last = static_cast<int>(spill.layer_ranges.size()) - 1;
  return spill.layer_ranges.back().second > 0 || spill.checkpoint_layers.contains(last);
}

}  // namespace

Status check_weight_store_options(const WeightResidencyOptions& o) {
  if (!o.spill_dir.empty() && !o.cache_dir.empty()) {
    return invalid_argument("model.weights_spill_dir '" + o.spill_dir + "' and model.weights_cache_dir '" + o.cache_dir +
                            "': set one (the cache folder keeps the streamed weights for the next start, the spill "
                            "folder holds them while this one runs)");
  }
  return check_prefetch_layers(o.prefetch_layers);
}

bool streams_from_checkpoint(const WeightResidencyOptions& o) { return o.spill_dir.empty() && o.cache_dir.empty(); }

bool read_streams_from_spill_under_limit(const WeightResidencyOptions& o, const Checkpoint& checkpoint,
                                         const std::optional<CgroupMemory>& limit) {
  if (o.streaming != WeightStreaming::kRead || !limit) return false;
  int64_t file_bytes = 0;
  std::error_code ec;
  for (const auto& file : checkpoint.files()) {
    const auto size = std::filesystem::file_size(file->path(), ec);
    if (!ec) file_bytes += static_cast<int64_t>(size);
  }
  return file_bytes > limit->limit_bytes;
}

bool streams_layers_from_checkpoint(const WeightResidencyOptions& o, const Checkpoint& checkpoint) {
  if (!streams_from_checkpoint(o)) return false;
  if (o.streaming == WeightStreaming::kDirect) return checkpoint_takes_direct_reads(checkpoint);
  return !read_streams_from_spill_under_limit(o, checkpoint, this_process_cgroup_memory());
}

StatusOr<std::shared_ptr<WeightSpill>> begin_weight_spill(const WeightResidencyOptions& options,
                                                          int64_t estimated_rank_bytes, int64_t estimated_head_bytes,
                                                          const nlohmann::json* cache_identity) {
  if (options.budget.all()) return std::shared_ptr<WeightSpill>();
  TESSERA_RETURN_IF_ERROR(check_weight_store_options(options));
  const int64_t budget = options.budget.bytes_for(estimated_rank_bytes);
  if (budget >= estimated_rank_bytes) return std::shared_ptr<WeightSpill>();
  // Room for the whole estimate twice over: the estimate is of the stored elements only.
  TESSERA_ASSIGN_OR_RETURN(
      std::shared_ptr<WeightSpill> spill,
      open_weight_store(options, cache_identity, budget,
                        static_cast<size_t>(2 * estimated_rank_bytes) + (size_t{1} << 30)));
  spill->budget_bytes = budget;
  spill->room = budget - estimated_head_bytes;  // the LM head comes first by the rule
  return spill;
}

bool spill_streams_next_layer(const WeightSpill& spill) {
  return !spill.reused() && (last_layer_streams(spill) || spill.layer_bytes > spill.room);
}

Status spill_loaded_layer(WeightSpill& spill, int layer, LayerWeights& lw, const Checkpoint* checkpoint) {
  if (spill.reused()) return Status::ok();  // the file decided every layer (streamed ones never loaded)
  const UnitTensors ts = layer_tensors(lw);
  if (static_cast<int>(spill.layer_ranges.size()) != layer) return internal_error("weight spill: layers out of order");
  const int64_t bytes = distinct_bytes(ts);
  spill.layer_bytes = bytes;
  // Layers from the first stay while they fit; from the first that does not, all stream.
  if (!last_layer_streams(spill) && bytes <= spill.room) {
    spill.room -= bytes;
    spill.layer_ranges.emplace_back(0, 0);
    return Status::ok();
  }
  if (checkpoint != nullptr && checkpoint_span(*checkpoint, ts)) {
    spill.checkpoint_layers.insert(layer);  // nothing to write: WeightResidency::make places it
    spill.layer_ranges.emplace_back(0, 0);
    return Status::ok();
  }
  TESSERA_ASSIGN_OR_RETURN(const auto range, spill.append(layer_unit_name(layer), ts, {}, &lw));
  spill.layer_ranges.push_back(range);
  return Status::ok();
}

StatusOr<std::unique_ptr<WeightResidency>> WeightResidency::make(ModelWeights& w, const WeightResidencyOptions& options,
                                                                 std::shared_ptr<WeightSpill> spill,
                                                                 const nlohmann::json* cache_identity,
                                                                 const Checkpoint* checkpoint) {
  if (options.budget.all()) return std::unique_ptr<WeightResidency>();
  TESSERA_RETURN_IF_ERROR(check_weight_store_options(options));
  WeightUnits plan = weight_units(w);
  // Layers already moved while loading keep their place; the budget is the one the load used.
  const bool loaded_spill = spill != nullptr && !spill->layer_ranges.empty();
  std::vector<bool> layer_streamed;
  if (loaded_spill) {
    for (size_t l = 0; l < spill->layer_ranges.size(); ++l)
      layer_streamed.push_back(spill->layer_ranges[l].second > 0 || spill->checkpoint_layers.contains(static_cast<int>(l)));
  }
  TESSERA_RETURN_IF_ERROR(
      decide_streamed_units(plan, options.budget, loaded_spill ? spill->budget_bytes : -1, layer_streamed));
  if (!plan.any_streamed()) return std::unique_ptr<WeightResidency>();  // everything fits
  std::unique_ptr<WeightResidency> r(new WeightResidency());
  r->prefetch_ = options.prefetch_layers;
  r->first_layer_unit_ = plan.first_layer;
  r->head_unit_ = plan.head;
  r->table_unit_ = plan.table;
  r->fixed_bytes_ = plan.fixed_bytes;
  r->budget_bytes_ = plan.budget_bytes;
  r->lists_ = unit_lists(plan);
  r->streamed_bytes_ = plan.streamed_bytes();
  std::vector<UnitTensors> tensors;
  for (const WeightUnit& unit : plan.units) {
    r->units_.push_back({unit.name});
    r->units_.back().bytes = unit.bytes;
    r->units_.back().streamed = unit.streamed;
    tensors.push_back(unit.tensors);
  }
  // The untied table is read a row per token; a tied one is the head's, read whole.
  if (r->table_unit_ >= 0) {
    r->units_[static_cast<size_t>(r->table_unit_)].rows_only = !plan.tied;
    r->units_[static_cast<size_t>(r->table_unit_)].row_bytes = static_cast<int64_t>(w.embed.nbytes()) / w.embed.dim(0);
  }
  r->resident_bytes_ = plan.resident_bytes();
  r->resident_set_bytes_ = r->peak_bytes_ = r->resident_bytes_;

  if (spill == nullptr) {
    size_t bound = 0;
    for (size_t u = 0; u < r->units_.size(); ++u)
      if (r->units_[u].streamed) {
        // (A unit read from the checkpoint takes its page range there, up to a quarter more.)
        const size_t unit_bound = spill_span_bound(tensors[u], spill_unit_alignment(options.streaming));
        bound += unit_bound + unit_bound / 4 + kHugePage;
      }
    TESSERA_ASSIGN_OR_RETURN(spill, open_weight_store(options, cache_identity, plan.budget_bytes, bound));
  }
  if (spill->reused()) {
    // Every unit the file holds is one this start streams, and the other way round.
    std::set<std::string> streamed;
    for (const Unit& unit : r->units_)
      if (unit.streamed) streamed.insert(unit.name);
    if (streamed != spill->unit_keys()) {
      return invalid_argument("model.weights_cache_dir: " + spill->describe() +
                              " holds other units than this start streams; delete it, and it is written anew");
    }
  }
  // Units loaded without a copy stream from the checkpoint's files: mapped (map; the table,
  // read by rows, always) or read into the region (read; direct with O_DIRECT).
  const bool from_checkpoint = checkpoint != nullptr && streams_from_checkpoint(options);
  const bool layers_from_checkpoint = from_checkpoint && streams_layers_from_checkpoint(options, *checkpoint);
  // With read, only a memory limit below the checkpoint's size keeps its layers out of it.
  if (from_checkpoint && !layers_from_checkpoint && options.streaming == WeightStreaming::kRead) {
    if (const auto limit = this_process_cgroup_memory()) {
      r->limit_note_ = "the layers go to the spill file, not read from the checkpoint: its files are larger than the " +
                       weight_mib(limit->limit_bytes) + " memory limit (direct reads them without the page cache)";
    }
  }
  // Read a row per token through the file's mapping: the table and a coded table's side tensor.
  const RowTensors table_rows = {&w.embed, &w.embed_side};
  for (size_t u = 0; u < r->units_.size(); ++u) {
    Unit& unit = r->units_[u];
    if (!unit.streamed) continue;
    const int layer = r->layer_of(static_cast<int>(u));
    std::optional<CheckpointSpan> in_file;
    if (from_checkpoint && (unit.rows_only || layers_from_checkpoint))
      in_file = checkpoint_span(*checkpoint, tensors[u], unit.rows_only);
    if (layer >= 0 && loaded_spill && spill->checkpoint_layers.contains(layer) && !in_file)
      return internal_error("weight streaming: " + unit.name + " no longer lies in the checkpoint file");
    if (in_file && (unit.rows_only || options.streaming == WeightStreaming::kMap)) {
      r->stream_from_checkpoint(unit, *in_file);
      continue;
    }
    if (in_file) {
      TESSERA_RETURN_IF_ERROR(r->read_from_checkpoint(unit, *in_file, tensors[u], *spill));
      continue;
    }
    unit.base = spill->region_base();
    unit.file_base = spill->file_base();
    if (layer >= 0 && (spill->reused() ? spill->restored_at_load(layer) : loaded_spill)) {
      std::tie(unit.offset, unit.span) = spill->layer_ranges[static_cast<size_t>(layer)];
    } else if (spill->reused()) {
      TESSERA_ASSIGN_OR_RETURN(std::tie(unit.offset, unit.span), spill->restore(unit.name, tensors[u], table_rows));
    } else {
      LayerWeights* fields = layer >= 0 ? &w.layers[static_cast<size_t>(layer)] : nullptr;
      TESSERA_ASSIGN_OR_RETURN(std::tie(unit.offset, unit.span),
                               spill->append(unit.name, tensors[u], table_rows, fields));
    }
    if (!unit.rows_only) r->largest_streamed_ = std::max(r->largest_streamed_, static_cast<int64_t>(unit.span));
  }
  r->copy_resident_from_checkpoint(w, tensors);
  if (options.streaming == WeightStreaming::kMap) r->map_checkpoint_layers_on_huge_pages();
  TESSERA_RETURN_IF_ERROR(spill->commit(static_cast<int>(w.layers.size())));
  r->spill_ = spill;
  if (r->prefetch_ > 1) r->helper_ = std::thread([p = r.get()] { p->helper_loop(); });
  return r;
}

void WeightResidency::count_checkpoint_unit(const Unit& unit, const CheckpointSpan& in_file) {
  // Its norms and biases converted at load stay where they are.
  resident_set_bytes_ += in_file.outside_bytes;
  resident_bytes_ += in_file.outside_bytes;
  peak_bytes_ = resident_bytes_;
  if (std::find(checkpoint_files_.begin(), checkpoint_files_.end(), in_file.file) == checkpoint_files_.end())
    checkpoint_files_.push_back(in_file.file);
  if (!unit.rows_only) largest_streamed_ = std::max(largest_streamed_, static_cast<int64_t>(unit.span));
}

void WeightResidency::stream_from_checkpoint(Unit& unit, const CheckpointSpan& in_file) {
  unit.in_checkpoint = true;
  unit.base = unit.file_base = in_file.base();
  unit.offset = in_file.offset;
  unit.span = in_file.span;
  unit.mapping_size = align_up(in_file.file->whole_mapping().size, kSpillPage);
  count_checkpoint_unit(unit, in_file);
}

Status WeightResidency::read_from_checkpoint(Unit& unit, const CheckpointSpan& in_file, const UnitTensors& tensors,
                                             WeightSpill& spill) {
  TESSERA_ASSIGN_OR_RETURN(unit.source_fd,
                           checkpoint_fd(*in_file.file, spill.streaming() == WeightStreaming::kDirect));
  unit.source = in_file.file.get();
  TESSERA_ASSIGN_OR_RETURN(std::tie(unit.offset, unit.span), spill.place_in_region(in_file.span));
  unit.base = spill.region_base();
  unit.file_base = spill.file_base();
  unit.source_offset = in_file.offset;
  unit.source_bytes = std::min(in_file.span, in_file.file->whole_mapping().size - in_file.offset);
  // Each tensor at the same place in the region as in the file's page range.
  const char* from = in_file.base() + in_file.offset;
  for (Tensor* t : tensors) {
    if (t->empty() || !in_file.file->whole_mapping().holds(t->view().data, t->nbytes())) continue;
    TensorView v = t->view();
    v.data = unit.base + unit.offset + (static_cast<const char*>(v.data) - from);
    *t = Tensor::borrowed(v, spill.region());
  }
  count_checkpoint_unit(unit, in_file);
  return Status::ok();
}

StatusOr<int> WeightResidency::checkpoint_fd(const WeightFile& file, bool direct) {
  for (const auto& [f, fd] : checkpoint_fds_)
    if (f == &file) return fd;
  const int fd = ::open(file.path().c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
  if (fd < 0) return invalid_argument(file.path() + ": cannot be opened to read streamed weights: " + std::strerror(errno));
  checkpoint_fds_.emplace_back(&file, fd);
  return fd;
}

void WeightResidency::copy_resident_from_checkpoint(ModelWeights& w, const std::vector<UnitTensors>& tensors) {
  if (checkpoint_files_.empty()) return;
  std::vector<const WeightFile*> files;
  for (const auto& f : checkpoint_files_) files.push_back(f.get());
  std::vector<const Tensor*> streamed;
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].streamed) streamed.insert(streamed.end(), tensors[u].begin(), tensors[u].end());
  copy_resident_from_files(w, files, streamed);
}

void WeightResidency::map_checkpoint_layers_on_huge_pages() {
  for (const auto& file : checkpoint_files_) {
    std::vector<std::pair<size_t, size_t>> ranges;
    for (const Unit& unit : units_)
      if (unit.in_checkpoint && !unit.rows_only && unit.base == file->whole_mapping().base)
        ranges.emplace_back(unit.offset, unit.span);
    const std::string note = map_on_huge_pages(*file, ranges).describe(file->path());
    if (!note.empty()) huge_page_note_ += (huge_page_note_.empty() ? "" : "; ") + note;
  }
}

WeightStreaming WeightResidency::streaming() const { return spill_->streaming(); }

bool WeightResidency::cache_reused() const { return spill_->reused(); }

std::vector<std::pair<const char*, size_t>> WeightResidency::streamed_ranges() const {
  std::vector<std::pair<const char*, size_t>> ranges;
  for (const Unit& unit : units_)
    if (unit.streamed) ranges.emplace_back((unit.rows_only ? unit.file_base : unit.base) + unit.offset, unit.span);
  return ranges;
}

int WeightResidency::checkpoint_units() const {
  return static_cast<int>(
      std::count_if(units_.begin(), units_.end(), [](const Unit& u) { return u.in_checkpoint || u.source_fd >= 0; }));
}

WeightResidency::~WeightResidency() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (helper_.joinable()) helper_.join();
  for (const auto& [file, fd] : checkpoint_fds_) ::close(fd);
}

void WeightResidency::populate(const Unit& unit) const {
  if (unit.source_fd >= 0) {
    read_streamed_range(unit.source_fd, unit.base + unit.offset, unit.source_offset, unit.source_bytes,
                        streaming() == WeightStreaming::kDirect, "the checkpoint file " + unit.source->path());
    return;
  }
  if (streaming() != WeightStreaming::kMap && !unit.in_checkpoint) {
    spill_->read_in(unit.offset, unit.span);
    return;
  }
#ifdef MADV_POPULATE_READ
  if (::madvise(unit.base + unit.offset, unit.span, MADV_POPULATE_READ) == 0) return;
#endif
  ::madvise(unit.base + unit.offset, unit.span, MADV_WILLNEED);  // an older kernel: read ahead, fault in
}

void WeightResidency::helper_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const int u = queue_.front();
    queue_.pop_front();
    Unit& unit = units_[static_cast<size_t>(u)];
    if (unit.pages == Unit::Pages::kQueued) map_in(unit, lock);
  }
}

void WeightResidency::map_in(Unit& unit, std::unique_lock<std::mutex>& lock) {
  unit.pages = Unit::Pages::kMapping;
  lock.unlock();
  populate(unit);
  lock.lock();
  unit.pages = Unit::Pages::kIn;
  cv_.notify_all();
}

bool WeightResidency::use_or_drop_spare(int u, bool whole) {
  if (spare_ < 0) return false;
  Unit& unit = units_[static_cast<size_t>(u)];
  Unit& spare = units_[static_cast<size_t>(spare_)];
  const bool same = spare_ == u, valid = spare_valid_;
  spare_ = -1;
  resident_bytes_ -= static_cast<int64_t>(spare.span);
  if (whole && same && valid) return true;  // its pages still hold it
  // Moved, not copied: the page tables of the spare's range go to the unit's (both start on a
  // huge page), and the spare's range is left empty. Else (another size; a kernel before
  // 5.7) the spare's pages go and the read faults fresh ones in.
  if (whole && !same && spare.span == unit.span &&
      !unit.in_checkpoint &&
      ::mremap(spare.base + spare.offset, spare.span, unit.span, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP,
               unit.base + unit.offset) != MAP_FAILED)
    return false;
  ::madvise(spare.base + spare.offset, spare.span, MADV_DONTNEED);
  return false;
}

void WeightResidency::fetch(int u, int64_t bytes) {
  Unit& unit = units_[static_cast<size_t>(u)];
  if (!unit.streamed || unit.in_flight > 0) return;
  const bool whole = bytes >= unit.bytes;
  const bool still_in = use_or_drop_spare(u, whole);
  unit.in_flight = whole ? static_cast<int64_t>(unit.span) : bytes;  // whole: its pages, padding too
  resident_bytes_ += unit.in_flight;
  peak_bytes_ = std::max(peak_bytes_, resident_bytes_);
  if (!whole) return;  // a few rows: they come by faults
  std::lock_guard<std::mutex> lock(mu_);
  if (still_in) {
    unit.pages = Unit::Pages::kIn;
    return;
  }
  unit.pages = Unit::Pages::kQueued;
  if (!helper_.joinable()) return;  // one in flight: wait_in maps it
  queue_.push_back(u);
  cv_.notify_all();
}

void WeightResidency::fetch_whole(int u) { fetch(u, units_[static_cast<size_t>(u)].bytes); }

void WeightResidency::release(int u, bool rows) {
  Unit& unit = units_[static_cast<size_t>(u)];
  if (unit.in_flight == 0) return;
  bool was_in = false;
  {
    // Not while the helper maps it in (it was asked for ahead and not used since).
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return unit.pages != Unit::Pages::kMapping; });
    was_in = unit.pages == Unit::Pages::kIn;
    unit.pages = Unit::Pages::kOut;
  }
  // Read into the process's own pages, a whole unit keeps them as the spare for the next
  // fetch (still counted), which reads into them instead of into fresh pages the kernel must
  // zero first (~1.6 GB a step on the ~1.1B model at 25%, CPU time beside the kernels).
  if (streaming() != WeightStreaming::kMap && !unit.in_checkpoint && !rows &&
      unit.in_flight == static_cast<int64_t>(unit.span) && spare_ < 0) {
    spare_ = u;
    spare_valid_ = was_in;
    unit.in_flight = 0;  // its bytes stay in resident_bytes_, as the spare's
    return;
  }
  const auto [begin, end] = release_range(unit);
  if (begin < end) ::madvise(unit.base + begin, end - begin, MADV_DONTNEED);
  if (rows && unit.file_base != unit.base) ::madvise(unit.file_base + unit.offset, unit.span, MADV_DONTNEED);
  resident_bytes_ -= unit.in_flight;
  unit.in_flight = 0;
}

std::pair<size_t, size_t> WeightResidency::release_range(const Unit& unit) const {
  if (!unit.in_checkpoint) return {unit.offset, unit.offset + unit.span};
  size_t begin = 0, end = unit.mapping_size;
  for (const Unit& o : units_) {
    if (&o == &unit || !o.in_checkpoint || o.base != unit.base || o.in_flight == 0) continue;
    if (o.offset + o.span <= unit.offset + kSpillPage) begin = std::max(begin, o.offset + o.span);  // below it
    if (o.offset + kSpillPage >= unit.offset + unit.span) end = std::min(end, o.offset);            // above it
  }
  return {begin, end};
}

void WeightResidency::wait_in(int u) {
  Unit& unit = units_[static_cast<size_t>(u)];
  if (!unit.streamed || unit.rows_only) return;
  std::unique_lock<std::mutex> lock(mu_);
  if (unit.pages == Unit::Pages::kQueued) {
    map_in(unit, lock);  // not taken by the helper yet (or there is none): here, now
    return;
  }
  cv_.wait(lock, [&] { return unit.pages != Unit::Pages::kMapping; });
}

void WeightResidency::read_ahead_from(int u) {
  const int n = static_cast<int>(units_.size());
  for (int d = 1, v = u; d < prefetch_; ++d) {
    v = (v + 1) % n;
    if (units_[static_cast<size_t>(v)].rows_only) v = (v + 1) % n;  // the table is read by rows, not ahead
    fetch_whole(v);
  }
}

void WeightResidency::before_embedding(int64_t rows) {
  if (table_unit_ < 0) return;
  const Unit& table = units_[static_cast<size_t>(table_unit_)];
  // The pages the step's rows touch, at most: each row's bytes rounded up, one page more for
  // a row that straddles two.
  const int64_t per_row = static_cast<int64_t>(align_up(static_cast<size_t>(table.row_bytes), kSpillPage) + kSpillPage);
  fetch(table_unit_, std::min(table.bytes, rows * per_row));
}

void WeightResidency::after_embedding() {
  if (table_unit_ >= 0) release(table_unit_, /*rows=*/true);
}

void WeightResidency::before_layer(int layer) {
  const int u = layer_unit(layer);
  fetch_whole(u);
  read_ahead_from(u);
  wait_in(u);
}

void WeightResidency::after_layer(int layer) { release(layer_unit(layer)); }

void WeightResidency::before_lm_head() {
  if (head_unit_ < 0) return;
  fetch_whole(head_unit_);
  read_ahead_from(head_unit_);
  wait_in(head_unit_);
}

void WeightResidency::after_lm_head() {
  if (head_unit_ >= 0) release(head_unit_);
}

std::string WeightResidency::plan() const {
  return "weights: budget " + weight_mib(budget_bytes_) + "; resident " + weight_mib(resident_set_bytes_) + " (" +
         lists_.resident + "); streamed " + weight_mib(streamed_bytes()) + " per step (" + lists_.streamed +
         "; the largest " + weight_mib(largest_streamed_) + ") from " + streamed_from() + "; " +
         std::to_string(prefetch_) + " in flight, brought in by " +
         weight_streaming_name(streaming()) + (streaming() == WeightStreaming::kMap ? " (madvise)" : " (pread)") +
         (huge_page_note_.empty() ? "" : "; " + huge_page_note_) + (limit_note_.empty() ? "" : "; " + limit_note_);
}

std::string WeightResidency::streamed_from() const {
  const int in_checkpoint = checkpoint_units();
  if (in_checkpoint == 0) return spill_->describe();
  std::string files;
  for (const auto& file : checkpoint_files_) files += (files.empty() ? "" : ", ") + file->path();
  const int streamed = static_cast<int>(std::count_if(units_.begin(), units_.end(), [](const Unit& u) { return u.streamed; }));
  std::string from = (checkpoint_files_.size() > 1 ? "the checkpoint's files " : "the checkpoint file ") + files;
  if (in_checkpoint == streamed) return from + " (as stored)";
  return from + " (" + std::to_string(in_checkpoint) + " of the " + std::to_string(streamed) + " units, as stored) and " +
         spill_->describe();
}

}  // namespace tessera
