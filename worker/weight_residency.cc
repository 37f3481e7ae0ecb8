#include "worker/weight_residency.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <tuple>
#include <unordered_map>

#include "common/check.h"
#include "worker/weight_units.h"

namespace tessera {
namespace {

constexpr size_t kSpillPage = 4096;
// Where units are read into the process's own pages (read, direct), each starts on a huge
// page: faulting in 4 KiB anonymous pages ran at ~350 MB/s on a 2-core VM (a fault each),
// 2 MiB ones at ~10 GB/s, and a unit released whole gives back whole huge pages.
constexpr size_t kHugePage = size_t{2} << 20;

size_t align_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
size_t page_up(size_t n) { return align_up(n, kSpillPage); }
size_t unit_alignment(WeightStreaming s) { return s == WeightStreaming::kMap ? kSpillPage : kHugePage; }

Status write_all(int fd, const void* data, size_t bytes, size_t offset, const std::string& dir) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, std::min<size_t>(bytes, size_t{1} << 30), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return resource_exhausted("model.weights_spill_dir: cannot write the spill file in '" + dir +
                                "': " + std::strerror(n < 0 ? errno : ENOSPC));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<size_t>(n);
  }
  return Status::ok();
}

// An unnamed file in `dir` (O_TMPFILE; else a named one unlinked at once).
StatusOr<int> open_spill_file(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    std::string name = dir + "/tessera-weights-XXXXXX";
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0) ::unlink(name.c_str());
  }
  if (fd < 0) {
    return invalid_argument("model.weights_spill_dir: cannot create the spill file in '" + dir +
                            "': " + std::strerror(errno));
  }
  return fd;
}


// Bytes a unit takes in the spill file at most: its distinct buffers, each 64-byte aligned,
// the unit page-aligned.
size_t spill_span_bound(const UnitTensors& ts, size_t alignment) {
  return align_up(static_cast<size_t>(distinct_bytes(ts)) + 64 * ts.size(), alignment);
}

// A region of `bytes` reserved in the address space (no memory until written), unmapped when
// the last owner goes; null on failure (errno set).
std::shared_ptr<const void> reserve_region(size_t bytes, int prot, int flags, int fd) {
  void* p = ::mmap(nullptr, bytes, prot, flags | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) return nullptr;
  return std::shared_ptr<const void>(p, [bytes](const void* q) { ::munmap(const_cast<void*>(q), bytes); });
}

// A second descriptor of the same (perhaps unnamed) file that reads with O_DIRECT.
StatusOr<int> open_direct(int fd, const std::string& dir) {
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  const int direct = ::open(self.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (direct < 0) {
    return invalid_argument("model.weights_streaming direct: the spill folder '" + dir +
                            "' does not take O_DIRECT reads (" + std::strerror(errno) +
                            "); choose read, or a model.weights_spill_dir on a disk");
  }
  return direct;
}

}  // namespace

// The spill file and its read-only mapping, reserved up front (the file grows as units are
// appended; nothing past its end is ever read). A unit appended is written, and its tensors
// point from then on into the mapping (map, and the embedding table read by rows) or into an
// anonymous region of the same size at the same offset, where read and direct bring it (their
// host copies go as the last reference drops).
class WeightSpill {
 public:
  static StatusOr<std::shared_ptr<WeightSpill>> open(const std::string& dir, size_t reserve, WeightStreaming streaming) {
    TESSERA_ASSIGN_OR_RETURN(const int fd, open_spill_file(dir));
    auto s = std::shared_ptr<WeightSpill>(new WeightSpill());
    s->fd_ = fd;
    s->dir_ = dir;
    s->streaming_ = streaming;
    s->alignment_ = unit_alignment(streaming);
    s->reserve_ = align_up(std::max<size_t>(reserve, kSpillPage), s->alignment_);
    s->mapping_ = reserve_region(s->reserve_, PROT_READ, MAP_SHARED, fd);
    if (s->mapping_ != nullptr && streaming != WeightStreaming::kMap) {
      // One huge page more, to start the region on one.
      std::shared_ptr<const void> whole =
          reserve_region(s->reserve_ + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1);
      if (whole != nullptr) {
        const auto at = reinterpret_cast<uintptr_t>(whole.get());
        char* start = static_cast<char*>(const_cast<void*>(whole.get())) + (align_up(at, kHugePage) - at);
        ::madvise(start, s->reserve_, MADV_HUGEPAGE);  // (where THP is "madvise"; a hint)
        s->region_ = std::shared_ptr<const void>(whole, start);
      }
    } else {
      s->region_ = s->mapping_;
    }
    if (s->region_ == nullptr) {
      return resource_exhausted(std::string("model.weights_spill_dir: cannot map the spill file: ") +
                                std::strerror(errno));
    }
    if (streaming == WeightStreaming::kDirect) {
      TESSERA_ASSIGN_OR_RETURN(s->direct_fd_, open_direct(fd, dir));
    }
    return s;
  }
  ~WeightSpill() {
    if (fd_ >= 0) ::close(fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
  }
  // Writes the unit's distinct buffers and re-points its tensors, `by_rows` (the embedding
  // table, read a row per token; a tied head's view of the same buffer is not) into the
  // mapping; returns its page-aligned [offset, offset + span).
  StatusOr<std::pair<size_t, size_t>> append(const UnitTensors& ts, const Tensor* by_rows = nullptr) {
    const size_t offset = end_;
    if (end_ + spill_span_bound(ts, alignment_) > reserve_) {
      return internal_error("weight spill: the file outgrew its reserved mapping (" + std::to_string(reserve_) +
                            " bytes)");
    }
    std::unordered_map<const void*, size_t> at;  // buffer -> its offset
    std::vector<std::pair<Tensor*, size_t>> placements;
    for (Tensor* t : ts) {
      if (t->empty()) continue;
      auto [it, fresh] = at.emplace(t->view().data, 0);
      if (fresh) {
        end_ = (end_ + 63) / 64 * 64;
        it->second = end_;
        TESSERA_RETURN_IF_ERROR(write_all(fd_, t->view().data, t->nbytes(), end_, dir_));
        end_ += t->nbytes();
      }
      placements.emplace_back(t, it->second);
    }
    end_ = align_up(end_, alignment_);
    // The padding is in the file too: a unit is read whole, to its aligned end.
    if (::ftruncate(fd_, static_cast<off_t>(end_)) != 0) {
      return resource_exhausted("model.weights_spill_dir: cannot write the spill file in '" + dir_ +
                                "': " + std::strerror(errno));
    }
    for (const auto& [tensor, at_offset] : placements) {
      const std::shared_ptr<const void>& owner = tensor == by_rows ? mapping_ : region_;
      TensorView v = tensor->view();
      v.data = static_cast<char*>(const_cast<void*>(owner.get())) + at_offset;
      *tensor = Tensor::borrowed(v, owner);
    }
    ::madvise(file_base() + offset, end_ - offset, MADV_DONTNEED);  // not resident until a step asks
    // Direct reads must not find the file's pages dirty in the page cache (they would be
    // written back first, at the step's expense), nor keep the cache holding them.
    if (direct_fd_ >= 0) {
      ::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(end_ - offset),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      ::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(end_ - offset), POSIX_FADV_DONTNEED);
    }
    return std::make_pair(offset, end_ - offset);
  }
  // Reads [offset, offset + span) of the file into the anonymous region (read, direct). An
  // I/O error here is the disk failing under a running step: the worker stops, naming it
  // (the coordinator restarts it), as a fault on the mapping would.
  void read_in(size_t offset, size_t span) const {
    const int fd = direct_fd_ >= 0 ? direct_fd_ : fd_;
    char* to = region_base() + offset;
    while (span > 0) {
      const ssize_t n = ::pread(fd, to, std::min<size_t>(span, size_t{1} << 30), static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      TESSERA_CHECK(n > 0) << "cannot read streamed weights from the spill file in '" << dir_
                           << "': " << (n < 0 ? std::strerror(errno) : "it ended early");
      to += n;
      offset += static_cast<size_t>(n);
      span -= static_cast<size_t>(n);
    }
  }
  char* file_base() const { return static_cast<char*>(const_cast<void*>(mapping_.get())); }
  char* region_base() const { return static_cast<char*>(const_cast<void*>(region_.get())); }
  WeightStreaming streaming() const { return streaming_; }
  size_t end() const { return end_; }
  const std::string& dir() const { return dir_; }
  // Layers moved while loading: their ranges; and the budget the load decided by.
  std::vector<std::pair<size_t, size_t>> layer_ranges;
  int64_t budget_bytes = 0;
  int64_t room = 0;  // budget left for more resident layers while loading

 private:
  WeightSpill() = default;
  int fd_ = -1, direct_fd_ = -1;
  std::string dir_;
  WeightStreaming streaming_ = WeightStreaming::kRead;
  size_t reserve_ = 0, end_ = 0, alignment_ = kSpillPage;  // units start on alignment_
  std::shared_ptr<const void> mapping_;  // the file's, read-only
  std::shared_ptr<const void> region_;   // the anonymous region (read, direct), else mapping_
};

namespace {

std::string spill_dir_or_default(const std::string& dir) {
  if (!dir.empty()) return dir;
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/var/tmp";
}

}  // namespace

StatusOr<std::shared_ptr<WeightSpill>> begin_weight_spill(const WeightResidencyOptions& options,
                                                          int64_t estimated_rank_bytes, int64_t estimated_head_bytes) {
  if (options.budget.all()) return std::shared_ptr<WeightSpill>();
  TESSERA_RETURN_IF_ERROR(check_prefetch_layers(options.prefetch_layers));
  const int64_t budget = options.budget.bytes_for(estimated_rank_bytes);
  if (budget >= estimated_rank_bytes) return std::shared_ptr<WeightSpill>();
  // Room for the whole estimate twice over: the estimate is of the stored elements only.
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<WeightSpill> spill,
                           WeightSpill::open(spill_dir_or_default(options.spill_dir),
                                             static_cast<size_t>(2 * estimated_rank_bytes) + (size_t{1} << 30),
                                             options.streaming));
  spill->budget_bytes = budget;
  spill->room = budget - estimated_head_bytes;  // the LM head comes first by the rule
  return spill;
}

Status spill_loaded_layer(WeightSpill& spill, int layer, LayerWeights& lw) {
  UnitTensors ts;
  for_each_layer_tensor(lw, [&](Tensor& t) { ts.push_back(&t); });
  if (static_cast<int>(spill.layer_ranges.size()) != layer) return internal_error("weight spill: layers out of order");
  const int64_t bytes = distinct_bytes(ts);
  // Layers from the first stay while they fit; from the first that does not, all stream.
  const bool streaming = !spill.layer_ranges.empty() && spill.layer_ranges.back().second > 0;
  if (!streaming && bytes <= spill.room) {
    spill.room -= bytes;
    spill.layer_ranges.emplace_back(0, 0);
    return Status::ok();
  }
  TESSERA_ASSIGN_OR_RETURN(const auto range, spill.append(ts));
  spill.layer_ranges.push_back(range);
  return Status::ok();
}

StatusOr<std::unique_ptr<WeightResidency>> WeightResidency::make(ModelWeights& w, const WeightResidencyOptions& options,
                                                                 std::shared_ptr<WeightSpill> spill) {
  if (options.budget.all()) return std::unique_ptr<WeightResidency>();
  TESSERA_RETURN_IF_ERROR(check_prefetch_layers(options.prefetch_layers));
  WeightUnits plan = weight_units(w);
  // Layers already moved while loading keep their place; the budget is the one the load used.
  const bool loaded_spill = spill != nullptr && !spill->layer_ranges.empty();
  std::vector<bool> layer_streamed;
  if (loaded_spill)
    for (const auto& range : spill->layer_ranges) layer_streamed.push_back(range.second > 0);
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
      if (r->units_[u].streamed) bound += spill_span_bound(tensors[u], unit_alignment(options.streaming));
    TESSERA_ASSIGN_OR_RETURN(spill, WeightSpill::open(spill_dir_or_default(options.spill_dir), bound, options.streaming));
  }
  for (size_t u = 0; u < r->units_.size(); ++u) {
    Unit& unit = r->units_[u];
    if (!unit.streamed) continue;
    const int layer = r->layer_of(static_cast<int>(u));
    if (loaded_spill && layer >= 0) {
      std::tie(unit.offset, unit.span) = spill->layer_ranges[static_cast<size_t>(layer)];
    } else {
      TESSERA_ASSIGN_OR_RETURN(const auto range, spill->append(tensors[u], &w.embed));
      std::tie(unit.offset, unit.span) = range;
    }
    if (!unit.rows_only) r->largest_streamed_ = std::max(r->largest_streamed_, static_cast<int64_t>(unit.span));
  }
  r->spill_ = spill;
  r->base_ = spill->region_base();
  r->file_base_ = spill->file_base();
  if (r->prefetch_ > 1) r->helper_ = std::thread([p = r.get()] { p->helper_loop(); });
  return r;
}

WeightStreaming WeightResidency::streaming() const { return spill_->streaming(); }

WeightResidency::~WeightResidency() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (helper_.joinable()) helper_.join();
}

void WeightResidency::populate(const Unit& unit) const {
  if (streaming() != WeightStreaming::kMap) {
    spill_->read_in(unit.offset, unit.span);
    return;
  }
#ifdef MADV_POPULATE_READ
  if (::madvise(base_ + unit.offset, unit.span, MADV_POPULATE_READ) == 0) return;
#endif
  ::madvise(base_ + unit.offset, unit.span, MADV_WILLNEED);  // an older kernel: read ahead, fault in
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
      ::mremap(base_ + spare.offset, spare.span, unit.span, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP,
               base_ + unit.offset) != MAP_FAILED)
    return false;
  ::madvise(base_ + spare.offset, spare.span, MADV_DONTNEED);
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
  if (streaming() != WeightStreaming::kMap && !rows && unit.in_flight == static_cast<int64_t>(unit.span) && spare_ < 0) {
    spare_ = u;
    spare_valid_ = was_in;
    unit.in_flight = 0;  // its bytes stay in resident_bytes_, as the spare's
    return;
  }
  ::madvise(base_ + unit.offset, unit.span, MADV_DONTNEED);
  if (rows && file_base_ != base_) ::madvise(file_base_ + unit.offset, unit.span, MADV_DONTNEED);
  resident_bytes_ -= unit.in_flight;
  unit.in_flight = 0;
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
  const int64_t per_row = static_cast<int64_t>(page_up(static_cast<size_t>(table.row_bytes)) + kSpillPage);
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
         "; the largest " + weight_mib(largest_streamed_) + ") from an unlinked spill file in " + spill_->dir() + "; " +
         std::to_string(prefetch_) + " in flight, brought in by " +
         weight_streaming_name(streaming()) + (streaming() == WeightStreaming::kMap ? " (madvise)" : " (pread)");
}

}  // namespace tessera
