#include "worker/weight_spill.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include "common/check.h"
#include "worker/weight_cache.h"

namespace tessera {
namespace {

bool read_by_rows(const Tensor* t, const RowTensors& by_rows) {
  return std::find(by_rows.begin(), by_rows.end(), t) != by_rows.end();
}

Status write_all(int fd, const void* data, size_t bytes, size_t offset, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, std::min<size_t>(bytes, size_t{1} << 30), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return resource_exhausted(what + std::strerror(n < 0 ? errno : ENOSPC));
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<size_t>(n);
  }
  return Status::ok();
}

// An unnamed file in `dir` (O_TMPFILE); where the filesystem has none, a file named `name`
// with six characters made unique (left in *named).
int open_unnamed(const std::string& dir, const std::string& name, std::string* named) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    std::string path = dir + "/" + name + "XXXXXX";
    fd = ::mkostemp(path.data(), O_CLOEXEC);
    if (fd >= 0) *named = path;
  }
  return fd;
}

// A region of `bytes` reserved in the address space (no memory until written), unmapped when
// the last owner goes; null on failure (errno set).
std::shared_ptr<const void> reserve_region(size_t bytes, int prot, int flags, int fd) {
  void* p = ::mmap(nullptr, bytes, prot, flags | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) return nullptr;
  return std::shared_ptr<const void>(p, [bytes](const void* q) { ::munmap(const_cast<void*>(q), bytes); });
}

bool same_view(const TensorView& a, const TensorView& b) {
  if (a.dtype != b.dtype || a.ndim != b.ndim || a.row_stride() != b.row_stride()) return false;
  for (int d = 0; d < a.ndim; ++d)
    if (a.shape[static_cast<size_t>(d)] != b.shape[static_cast<size_t>(d)]) return false;
  return true;
}

}  // namespace

size_t spill_span_bound(const UnitTensors& ts, size_t alignment) {
  return align_up(static_cast<size_t>(distinct_bytes(ts)) + 64 * ts.size(), alignment);
}

StatusOr<std::shared_ptr<WeightSpill>> WeightSpill::open(const std::string& dir, size_t reserve,
                                                         WeightStreaming streaming) {
  auto s = std::shared_ptr<WeightSpill>(new WeightSpill());
  s->dir_ = dir;
  s->streaming_ = streaming;
  std::string named;
  s->fd_ = open_unnamed(dir, "tessera-weights-", &named);
  if (s->fd_ < 0) return s->folder_error(std::string("cannot create the spill file: ") + std::strerror(errno));
  if (!named.empty()) ::unlink(named.c_str());  // goes with the process all the same
  TESSERA_RETURN_IF_ERROR(s->map(reserve));
  return s;
}

StatusOr<std::shared_ptr<WeightSpill>> WeightSpill::open_cache(const std::string& dir, const nlohmann::json& identity,
                                                               size_t reserve, WeightStreaming streaming) {
  auto s = std::shared_ptr<WeightSpill>(new WeightSpill());
  s->dir_ = dir;
  s->key_ = "model.weights_cache_dir";
  s->streaming_ = streaming;
  s->identity_ = identity;
  // A folder that is not there yet is made (as for a download folder); one that cannot be is refused.
  std::error_code made;
  std::filesystem::create_directories(dir, made);
  if (made) return s->folder_error("cannot create the cache file: cannot make the folder: " + made.message());
  const std::string name = weight_cache_file_name(identity);
  s->cache_path_ = dir + "/" + name;
  s->fd_ = ::open(s->cache_path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (s->fd_ < 0 && errno != ENOENT) {
    return s->file_error(std::string("cannot be opened: ") + std::strerror(errno));
  }
  if (s->fd_ < 0) {  // not written yet: written now
    s->fd_ = open_unnamed(dir, name + ".partial-", &s->partial_path_);
    if (s->fd_ < 0) return s->folder_error(std::string("cannot create the cache file: ") + std::strerror(errno));
    TESSERA_RETURN_IF_ERROR(s->map(reserve));
    return s;
  }
  struct stat st {};
  if (::fstat(s->fd_, &st) != 0) return s->file_error(std::string("cannot be read: ") + std::strerror(errno));
  auto trailer = read_weight_cache_trailer(s->fd_, static_cast<size_t>(st.st_size));
  if (!trailer.is_ok()) return s->file_error(trailer.status().message() + "; delete it, and it is written anew");
  const nlohmann::json& contents = trailer.value().contents;
  const std::string differs = weight_cache_difference(contents["identity"], identity);
  if (!differs.empty()) return s->file_error("was " + differs + "; delete it, and it is written anew");
  s->reused_ = true;
  s->units_ = contents["units"];
  s->end_ = trailer.value().data_end;
  s->budget_bytes = identity["layout"].value("budget_bytes", int64_t{0});
  const int layers = contents["layers"].get<int>();
  if (layers < 0 || layers > (1 << 20)) return s->file_error("is damaged (its layer count is not one)");
  // Each unit in a place of its own.
  std::vector<SpillRange> places;
  for (const auto& [key, unit] : s->units_.items()) {
    auto range = s->unit_range(key);
    if (!range.is_ok()) return range.status();
    places.push_back(range.value());
  }
  std::sort(places.begin(), places.end());
  for (size_t i = 1; i < places.size(); ++i) {
    if (places[i - 1].first + places[i - 1].second > places[i].first)
      return s->file_error("is damaged (two units overlap)");
  }
  for (int l = 0; l < layers; ++l) {
    const std::string key = layer_unit_name(l);
    if (!s->holds(key)) {
      s->layer_ranges.emplace_back(0, 0);
      continue;
    }
    auto range = s->unit_range(key);
    if (!range.is_ok()) return range.status();
    s->layer_ranges.push_back(range.value());
  }
  TESSERA_RETURN_IF_ERROR(s->map(s->end_));
  return s;
}

WeightSpill::~WeightSpill() {
  if (fd_ >= 0) ::close(fd_);
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (!partial_path_.empty() && !committed_) ::unlink(partial_path_.c_str());
}

Status WeightSpill::folder_error(const std::string& what) const {
  return invalid_argument(key_ + ": " + what + " (folder '" + dir_ + "')");
}

Status WeightSpill::file_error(const std::string& what) const {
  return invalid_argument(key_ + ": the cache file '" + cache_path_ + "' " + what);
}

Status WeightSpill::map(size_t reserve) {
  alignment_ = spill_unit_alignment(streaming_);
  reserve_ = align_up(std::max<size_t>(reserve, kSpillPage), alignment_);
  mapping_ = reserve_region(reserve_, PROT_READ, MAP_SHARED, fd_);
  if (mapping_ != nullptr && streaming_ != WeightStreaming::kMap) {
    // One huge page more, to start the region on one.
    std::shared_ptr<const void> whole =
        reserve_region(reserve_ + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1);
    if (whole != nullptr) {
      const auto at = reinterpret_cast<uintptr_t>(whole.get());
      char* start = static_cast<char*>(const_cast<void*>(whole.get())) + (align_up(at, kHugePage) - at);
      ::madvise(start, reserve_, MADV_HUGEPAGE);  // (where THP is "madvise"; a hint)
      region_ = std::shared_ptr<const void>(whole, start);
    }
  } else {
    region_ = mapping_;
  }
  if (region_ == nullptr) return resource_exhausted(key_ + ": cannot map the weights' file: " + std::strerror(errno));
  if (streaming_ == WeightStreaming::kDirect) {
    // A second descriptor of the same (perhaps unnamed) file that reads with O_DIRECT.
    const std::string self = "/proc/self/fd/" + std::to_string(fd_);
    direct_fd_ = ::open(self.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (direct_fd_ < 0) {
      return invalid_argument("model.weights_streaming direct: the folder '" + dir_ + "' does not take O_DIRECT reads (" +
                              std::strerror(errno) + "); choose read, or a " + key_ + " on a disk");
    }
  }
  return Status::ok();
}

StatusOr<SpillRange> WeightSpill::append(const std::string& key, const UnitTensors& ts, const RowTensors& by_rows,
                                         LayerWeights* layer) {
  if (reused_) return internal_error("weight cache: '" + key + "' appended to a file read back");
  const size_t offset = end_;
  if (end_ + spill_span_bound(ts, alignment_) > reserve_) {
    return internal_error("weight spill: the file outgrew its reserved mapping (" + std::to_string(reserve_) +
                          " bytes)");
  }
  const std::string cannot_write = key_ + ": cannot write the weights' file in '" + dir_ + "': ";
  std::unordered_map<const void*, size_t> at;  // buffer -> its offset
  std::vector<std::pair<Tensor*, size_t>> placements;
  for (Tensor* t : ts) {
    if (t->empty()) continue;
    auto [it, fresh] = at.emplace(t->view().data, 0);
    if (fresh) {
      end_ = (end_ + 63) / 64 * 64;
      it->second = end_;
      TESSERA_RETURN_IF_ERROR(write_all(fd_, t->view().data, t->nbytes(), end_, cannot_write));
      end_ += t->nbytes();
    }
    placements.emplace_back(t, it->second);
  }
  end_ = align_up(end_, alignment_);
  // The padding is in the file too: a unit is read whole, to its aligned end.
  if (::ftruncate(fd_, static_cast<off_t>(end_)) != 0) return resource_exhausted(cannot_write + std::strerror(errno));
  for (const auto& [tensor, at_offset] : placements) {
    const std::shared_ptr<const void>& owner = read_by_rows(tensor, by_rows) ? mapping_ : region_;
    TensorView v = tensor->view();
    v.data = static_cast<char*>(const_cast<void*>(owner.get())) + at_offset;
    *tensor = Tensor::borrowed(v, owner);
  }
  nlohmann::json records = nlohmann::json::array();
  for (Tensor* t : ts) records.push_back(weight_cache_tensor(*t, read_by_rows(t, by_rows) ? file_base() : region_base()));
  units_[key] = {{"offset", offset}, {"span", end_ - offset}, {"tensors", records}};
  if (layer != nullptr) units_[key]["fields"] = weight_cache_fields(*layer);
  ::madvise(file_base() + offset, end_ - offset, MADV_DONTNEED);  // not resident until a step asks
  // Direct reads must not find the file's pages dirty in the page cache (they would be
  // written back first, at the step's expense), nor keep the cache holding them.
  if (direct_fd_ >= 0) {
    ::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(end_ - offset),
                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    ::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(end_ - offset), POSIX_FADV_DONTNEED);
  }
  return SpillRange{offset, end_ - offset};
}

Status WeightSpill::commit(int layers) {
  if (cache_path_.empty() || reused_ || committed_) return Status::ok();
  const std::string cannot_write = key_ + ": cannot write the cache file '" + cache_path_ + "': ";
  const std::string trailer = encode_weight_cache_trailer({{"identity", identity_}, {"layers", layers}, {"units", units_}});
  TESSERA_RETURN_IF_ERROR(write_all(fd_, trailer.data(), trailer.size(), end_, cannot_write));
  if (::fdatasync(fd_) != 0) return resource_exhausted(cannot_write + std::strerror(errno));
  // Named only now, whole: a start cut short before this leaves no file that looks complete.
  int named = 0;
  if (partial_path_.empty()) {
    const std::string self = "/proc/self/fd/" + std::to_string(fd_);
    named = ::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, cache_path_.c_str(), AT_SYMLINK_FOLLOW);
  } else {
    named = ::rename(partial_path_.c_str(), cache_path_.c_str());
  }
  // Another start of the same model and options named its own first: the same bytes.
  if (named != 0 && errno != EEXIST) return resource_exhausted(cannot_write + std::strerror(errno));
  committed_ = true;
  return Status::ok();
}

std::set<std::string> WeightSpill::unit_keys() const {
  std::set<std::string> keys;
  for (const auto& [key, unit] : units_.items()) keys.insert(key);
  return keys;
}

StatusOr<SpillRange> WeightSpill::unit_range(const std::string& key) const {
  const nlohmann::json& u = units_[key];
  if (!u.is_object() || !u.value("offset", nlohmann::json()).is_number_unsigned() ||
      !u.value("span", nlohmann::json()).is_number_unsigned() || !u.value("tensors", nlohmann::json()).is_array()) {
    return file_error("is damaged (the record of " + key + " is not one)");
  }
  const auto offset = u["offset"].get<size_t>(), span = u["span"].get<size_t>();
  if (offset % spill_unit_alignment(streaming_) != 0 || span > end_ || offset > end_ - span) {
    return file_error("is damaged (" + key + " lies outside the file's units)");
  }
  return SpillRange{offset, span};
}

StatusOr<bool> WeightSpill::restore_layer(int layer, LayerWeights* lw) {
  const std::string key = layer_unit_name(layer);
  if (!reused_ || !holds(key)) return false;
  TESSERA_ASSIGN_OR_RETURN(const SpillRange range, unit_range(key));
  const nlohmann::json& u = units_[key];
  Status fields = restore_weight_cache_fields(u.value("fields", nlohmann::json()), lw);
  if (!fields.is_ok()) return file_error(fields.message());
  const UnitTensors ts = layer_tensors(*lw);
  const nlohmann::json& records = u["tensors"];
  if (records.size() != ts.size()) return file_error("is damaged (" + key + " records another number of tensors)");
  for (size_t i = 0; i < ts.size(); ++i) {
    if (records[i].is_null()) {
      *ts[i] = Tensor();
      continue;
    }
    auto view = weight_cache_view(records[i], region_base(), range.first, range.first + range.second);
    if (!view.is_ok()) return file_error(view.status().message());
    *ts[i] = Tensor::borrowed(view.value(), region_);
  }
  restored_layers_.insert(layer);
  return true;
}

StatusOr<SpillRange> WeightSpill::restore(const std::string& key, const UnitTensors& ts, const RowTensors& by_rows) {
  if (!reused_ || !holds(key)) return file_error("does not hold " + key + ", which this start streams");
  TESSERA_ASSIGN_OR_RETURN(const SpillRange range, unit_range(key));
  const nlohmann::json& records = units_[key]["tensors"];
  if (records.size() != ts.size()) return file_error("is damaged (" + key + " records another number of tensors)");
  for (size_t i = 0; i < ts.size(); ++i) {
    if (records[i].is_null() != ts[i]->empty()) return file_error("does not match the model (" + key + ")");
    if (ts[i]->empty()) continue;
    const bool rows = read_by_rows(ts[i], by_rows);
    auto view = weight_cache_view(records[i], rows ? file_base() : region_base(), range.first,
                                  range.first + range.second);
    if (!view.is_ok()) return file_error(view.status().message());
    if (!same_view(view.value(), ts[i]->view())) return file_error("does not match the model (a tensor of " + key + ")");
    *ts[i] = Tensor::borrowed(view.value(), rows ? mapping_ : region_);
  }
  return range;
}

StatusOr<SpillRange> WeightSpill::place_in_region(size_t span) {
  end_ = align_up(end_, alignment_);
  const size_t offset = end_, bytes = align_up(span, alignment_);
  if (offset + bytes > reserve_) {
    return internal_error("weight spill: the units outgrew the reserved region (" + std::to_string(reserve_) + " bytes)");
  }
  end_ += bytes;
  return SpillRange{offset, bytes};
}

void read_streamed_range(int fd, char* to, size_t offset, size_t bytes, bool whole_pages, const std::string& what) {
  while (bytes > 0) {
    const size_t ask = std::min<size_t>(whole_pages ? align_up(bytes, kSpillPage) : bytes, size_t{1} << 30);
    const ssize_t n = ::pread(fd, to, ask, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    TESSERA_CHECK(n > 0) << "cannot read streamed weights from " << what << ": "
                         << (n < 0 ? std::strerror(errno) : "it ended early");
    to += n;
    offset += static_cast<size_t>(n);
    bytes -= std::min(bytes, static_cast<size_t>(n));
  }
}

void WeightSpill::read_in(size_t offset, size_t span) const {
  // (A unit's span is whole pages, as O_DIRECT needs.)
  read_streamed_range(direct_fd_ >= 0 ? direct_fd_ : fd_, region_base() + offset, offset, span, false,
                      "the file in '" + dir_ + "'");
}

std::string WeightSpill::describe() const {
  if (cache_path_.empty()) return "an unlinked spill file in " + dir_;
  return "the cache file " + cache_path_ + (reused_ ? " (read back)" : " (written now)");
}

}  // namespace tessera
