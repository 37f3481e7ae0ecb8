#include "worker/weight_residency.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <unordered_map>

namespace tessera {
namespace {

constexpr size_t kSpillPage = 4096;

size_t page_up(size_t n) { return (n + kSpillPage - 1) / kSpillPage * kSpillPage; }

std::string spill_mib(int64_t bytes) {
  if (bytes < (int64_t{1} << 20)) return std::to_string((bytes + 1023) >> 10) + " KiB";
  const int64_t tenths = (bytes * 10 + (1 << 19)) >> 20;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " MiB";
}

std::string layers_text(int n) { return std::to_string(n) + (n == 1 ? " layer" : " layers"); }

// The tensors of one streamed unit, each distinct buffer once (a tied head and table, or
// views that share a buffer, count and move together).
using UnitTensors = std::vector<Tensor*>;

int64_t distinct_bytes(const UnitTensors& ts) {
  std::unordered_map<const void*, size_t> seen;
  int64_t total = 0;
  for (Tensor* t : ts)
    if (!t->empty() && seen.emplace(t->view().data, t->nbytes()).second) total += static_cast<int64_t>(t->nbytes());
  return total;
}

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

int64_t tensor_bytes(const Tensor& t) { return t.empty() ? 0 : static_cast<int64_t>(t.nbytes()); }

}  // namespace

StatusOr<std::unique_ptr<WeightResidency>> WeightResidency::make(ModelWeights& w, const WeightResidencyOptions& options) {
  if (options.budget.all()) return std::unique_ptr<WeightResidency>();
  if (options.prefetch_layers < 1) {
    return invalid_argument("model.weights_prefetch_layers: at least 1 (the layer running), got " +
                            std::to_string(options.prefetch_layers));
  }
  std::unique_ptr<WeightResidency> r(new WeightResidency());
  r->prefetch_ = options.prefetch_layers;
  const bool tied = !w.embed.empty() && w.lm_head.w.view().data == w.embed.view().data;
  // The units in a step's order, and what each holds.
  std::vector<UnitTensors> tensors;
  if (!tied && !w.embed.empty()) {
    r->table_unit_ = 0;
    r->units_.push_back({"embedding table"});
    r->units_.back().rows_only = true;
    r->units_.back().row_bytes = static_cast<int64_t>(w.embed.nbytes()) / w.embed.dim(0);
    tensors.push_back({&w.embed});
  }
  r->first_layer_unit_ = static_cast<int>(r->units_.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    r->units_.push_back({"layer " + std::to_string(l)});
    tensors.emplace_back();
    for_each_layer_tensor(w.layers[l], [&](Tensor& t) { tensors.back().push_back(&t); });
  }
  if (tied || !w.lm_head.w.empty()) {
    r->head_unit_ = static_cast<int>(r->units_.size());
    r->units_.push_back({tied ? "LM head (the embedding table)" : "LM head"});
    tensors.push_back({&w.lm_head.w, &w.lm_head.scales});
    if (tied) {
      tensors.back().push_back(&w.embed);
      r->table_unit_ = r->head_unit_;
      r->units_.back().row_bytes = static_cast<int64_t>(w.embed.nbytes()) / w.embed.dim(0);
    }
  }
  int64_t all = 0;
  for (size_t u = 0; u < r->units_.size(); ++u) all += r->units_[u].bytes = distinct_bytes(tensors[u]);
  for (const Tensor* t : {&w.pos_embed, &w.embed_norm_w, &w.embed_norm_b, &w.final_norm_w, &w.final_norm_b, &w.lm_head.b})
    r->fixed_bytes_ += tensor_bytes(*t);
  all += r->fixed_bytes_;
  r->budget_bytes_ = options.budget.bytes_for(all);
  if (r->budget_bytes_ >= all) return std::unique_ptr<WeightResidency>();  // everything fits
  if (r->budget_bytes_ < r->fixed_bytes_) {
    return invalid_argument("model.weights_memory_budget " + options.budget.to_string() + " (" +
                            spill_mib(r->budget_bytes_) + " of this rank's " + spill_mib(all) +
                            " of weights) is below the norms and biases every step reads, which stay resident (" +
                            spill_mib(r->fixed_bytes_) + ")");
  }
  // Resident by the rule: the head, the layers from the first, the table; the rest streams.
  std::vector<int> order;
  if (r->head_unit_ >= 0) order.push_back(r->head_unit_);
  for (size_t l = 0; l < w.layers.size(); ++l) order.push_back(r->layer_unit(static_cast<int>(l)));
  if (!tied && r->table_unit_ >= 0) order.push_back(r->table_unit_);
  int64_t room = r->budget_bytes_ - r->fixed_bytes_;
  bool full = false;
  for (int u : order) {
    Unit& unit = r->units_[static_cast<size_t>(u)];
    full = full || unit.bytes > room;  // resident units are a prefix of the order
    unit.streamed = full;
    if (!full) room -= unit.bytes;
  }
  r->resident_bytes_ = r->fixed_bytes_;
  for (const Unit& unit : r->units_)
    if (!unit.streamed) r->resident_bytes_ += unit.bytes;
  r->resident_set_bytes_ = r->peak_bytes_ = r->resident_bytes_;

  r->spill_dir_ = options.spill_dir;
  if (r->spill_dir_.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    r->spill_dir_ = tmp != nullptr && *tmp != '\0' ? tmp : "/var/tmp";
  }
  TESSERA_ASSIGN_OR_RETURN(const int fd, open_spill_file(r->spill_dir_));
  // Each streamed unit page-aligned, its distinct buffers 64-byte aligned within.
  std::vector<std::pair<Tensor*, size_t>> placements;
  size_t end = 0;
  Status written = Status::ok();
  for (size_t u = 0; u < r->units_.size() && written.is_ok(); ++u) {
    Unit& unit = r->units_[u];
    if (!unit.streamed) continue;
    unit.offset = end;
    std::unordered_map<const void*, size_t> at;  // buffer -> its offset
    for (Tensor* t : tensors[u]) {
      if (t->empty() || !written.is_ok()) continue;
      auto [it, fresh] = at.emplace(t->view().data, 0);
      if (fresh) {
        end = (end + 63) / 64 * 64;
        it->second = end;
        written = write_all(fd, t->view().data, t->nbytes(), end, r->spill_dir_);
        end += t->nbytes();
      }
      placements.emplace_back(t, it->second);
    }
    end = page_up(end);
    unit.span = end - unit.offset;
    r->largest_streamed_ = std::max(r->largest_streamed_, static_cast<int64_t>(unit.span));
  }
  if (!written.is_ok()) {
    ::close(fd);
    return written;
  }
  void* base = ::mmap(nullptr, end, PROT_READ, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file
  if (base == MAP_FAILED) {
    return resource_exhausted(std::string("model.weights_spill_dir: cannot map the spill file: ") +
                              std::strerror(map_errno));
  }
  r->mapped_ = end;
  r->base_ = static_cast<char*>(base);
  r->mapping_ = std::shared_ptr<const void>(base, [end](const void* p) { ::munmap(const_cast<void*>(p), end); });
  // The tensors now read the mapping; their host copies go as the last reference drops.
  for (const auto& [tensor, offset] : placements) {
    TensorView v = tensor->view();
    v.data = r->base_ + offset;
    *tensor = Tensor::borrowed(v, r->mapping_);
  }
  ::madvise(base, end, MADV_DONTNEED);  // none of it resident until a step asks
  if (r->prefetch_ > 1) r->helper_ = std::thread([p = r.get()] { p->helper_loop(); });
  return r;
}

WeightResidency::~WeightResidency() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (helper_.joinable()) helper_.join();
}

void WeightResidency::populate(const Unit& unit) const {
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

int64_t WeightResidency::streamed_bytes() const {
  int64_t n = 0;
  for (const Unit& u : units_)
    if (u.streamed) n += u.bytes;
  return n;
}

void WeightResidency::fetch(int u, int64_t bytes) {
  Unit& unit = units_[static_cast<size_t>(u)];
  if (!unit.streamed || unit.in_flight > 0) return;
  unit.in_flight = bytes >= unit.bytes ? static_cast<int64_t>(unit.span) : bytes;  // whole: its pages, padding too
  resident_bytes_ += unit.in_flight;
  peak_bytes_ = std::max(peak_bytes_, resident_bytes_);
  if (bytes < unit.bytes) return;  // a few rows: they come by faults
  std::lock_guard<std::mutex> lock(mu_);
  unit.pages = Unit::Pages::kQueued;
  if (!helper_.joinable()) return;  // one in flight: wait_in maps it
  queue_.push_back(u);
  cv_.notify_all();
}

void WeightResidency::release(int u) {
  Unit& unit = units_[static_cast<size_t>(u)];
  if (unit.in_flight == 0) return;
  {
    // Not while the helper maps it in (it was asked for ahead and not used since).
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return unit.pages != Unit::Pages::kMapping; });
    unit.pages = Unit::Pages::kOut;
  }
  ::madvise(base_ + unit.offset, unit.span, MADV_DONTNEED);
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
    fetch(v, units_[static_cast<size_t>(v)].bytes);
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
  if (table_unit_ >= 0) release(table_unit_);
}

void WeightResidency::before_layer(int layer) {
  fetch(layer_unit(layer), units_[static_cast<size_t>(layer_unit(layer))].bytes);
  read_ahead_from(layer_unit(layer));
  wait_in(layer_unit(layer));
}

void WeightResidency::after_layer(int layer) { release(layer_unit(layer)); }

void WeightResidency::before_lm_head() {
  if (head_unit_ < 0) return;
  fetch(head_unit_, units_[static_cast<size_t>(head_unit_)].bytes);
  read_ahead_from(head_unit_);
  wait_in(head_unit_);
}

void WeightResidency::after_lm_head() {
  if (head_unit_ >= 0) release(head_unit_);
}

std::string WeightResidency::plan() const {
  int64_t streamed = 0;
  int resident_layers = 0, streamed_layers = 0;
  std::string resident_units = "norms", streamed_units;
  for (size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = units_[u];
    if (unit.streamed) streamed += unit.bytes;
    const bool layer = static_cast<int>(u) >= first_layer_unit_ && static_cast<int>(u) != head_unit_;
    if (layer) {
      ++(unit.streamed ? streamed_layers : resident_layers);
    } else {
      std::string& list = unit.streamed ? streamed_units : resident_units;
      list += (list.empty() ? "" : ", ") + unit.name;
    }
  }
  if (resident_layers > 0) resident_units += ", " + layers_text(resident_layers);
  if (streamed_layers > 0) streamed_units += (streamed_units.empty() ? "" : ", ") + layers_text(streamed_layers);
  return "weights: budget " + spill_mib(budget_bytes_) + "; resident " + spill_mib(resident_bytes_) + " (" +
         resident_units + "); streamed " + spill_mib(streamed) + " per step (" + streamed_units + "; the largest " +
         spill_mib(largest_streamed_) + ") from an unlinked spill file in " + spill_dir_ + "; " +
         std::to_string(prefetch_) + " in flight";
}

}  // namespace tessera
