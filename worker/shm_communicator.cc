#include "worker/shm_communicator.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "common/check.h"
#include "worker/rank_order_sum.h"

namespace tessera {
namespace {

// Segment layout (every offset page-aligned so slots never share a line with control):
//   [0, kPage)                    SegmentHeader, written once by rank 0
//   [kControlOffset, kDataOffset) RankControl per rank, one 128-byte line pair each
//   [kDataOffset, ...)            2 buffers x world_size slots x slot_bytes
constexpr uint64_t kMagic = 0x314d485341535454ull;  // "TTSASHM1"
constexpr uint32_t kVersion = 1;
constexpr int kMaxWorld = 64;
constexpr size_t kPage = 4096;
// Up to this many bytes per rank, every rank sums all slots itself (one rendezvous);
// above it, each rank reduces a slice and the slices are gathered (two rendezvous, 1/N of
// the arithmetic each). Both orders are rank order, so the switch never changes results.
constexpr size_t kSmallReduceBytes = 32 * 1024;
// Waits spin this long (the peer is usually on another core, microseconds away), then
// yield this long, then sleep on a futex so a stalled group costs no CPU.
constexpr auto kSpinTime = std::chrono::microseconds(50);
constexpr auto kYieldTime = std::chrono::milliseconds(5);
constexpr auto kFutexSlice = std::chrono::milliseconds(10);
constexpr auto kLivenessPeriod = std::chrono::milliseconds(20);

using Clock = std::chrono::steady_clock;

constexpr size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t world_size;
  uint64_t max_bytes;
  uint64_t slot_bytes;
  uint64_t total_bytes;
  uint64_t nonce;  // this incarnation of the group; differs from any stale segment's
  int32_t creator_pid;
  std::atomic<uint32_t> ready;  // stored last (release) by rank 0
};

// Everything a rank publishes. Only atomics: no lock a dead process could leave held.
struct alignas(128) RankControl {
  std::atomic<uint32_t> arrived;   // rendezvous sequence number this rank has reached
  std::atomic<uint32_t> sleepers;  // peers parked in FUTEX_WAIT on `arrived`
  std::atomic<uint32_t> closed;    // set when this rank's communicator is destroyed
  std::atomic<int32_t> pid;
  std::atomic<uint64_t> join_token;  // random, written by the joining rank
  std::atomic<uint64_t> ack_token;   // rank 0 copies join_token here to admit the rank
};

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free to be address-free across processes");
static_assert(sizeof(SegmentHeader) <= kPage);

constexpr size_t kControlOffset = kPage;
constexpr size_t kDataOffset = kControlOffset + round_up(sizeof(RankControl) * kMaxWorld, kPage);

size_t slot_bytes_for(size_t max_bytes) { return round_up(max_bytes, kPage); }
size_t total_bytes_for(int world, size_t max_bytes) {
  return kDataOffset + 2 * static_cast<size_t>(world) * slot_bytes_for(max_bytes);
}

Status unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }

std::string errno_text(int err) { return std::strerror(err); }

bool process_alive(int32_t pid) {
  if (pid <= 0) return true;  // unknown: do not call it dead
  return ::kill(pid, 0) == 0 || errno == EPERM;
}

uint64_t random_token() {
  std::random_device rd;
  uint64_t t = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
               static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
               (static_cast<uint64_t>(::getpid()) << 17);
  return t == 0 ? 1 : t;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000), static_cast<long>(timeout.count() % 1000000000)};
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// One mapping of the segment; unmapped and closed on destruction.
class Segment {
 public:
  Segment() = default;
  Segment(int fd, void* base, size_t size) : fd_(fd), base_(static_cast<char*>(base)), size_(size) {}
  Segment(Segment&& o) noexcept { *this = std::move(o); }
  Segment& operator=(Segment&& o) noexcept {
    std::swap(fd_, o.fd_);
    std::swap(base_, o.base_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~Segment() {
    if (base_ != nullptr) ::munmap(base_, size_);
    if (fd_ >= 0) ::close(fd_);
  }
  char* base() const { return base_; }
  int fd() const { return fd_; }
  SegmentHeader* header() const { return reinterpret_cast<SegmentHeader*>(base_); }
  RankControl& control(int rank) const {
    return reinterpret_cast<RankControl*>(base_ + kControlOffset)[rank];
  }

 private:
  int fd_ = -1;
  char* base_ = nullptr;
  size_t size_ = 0;
};

StatusOr<Segment> map_fd(int fd, size_t size, const std::string& name) {
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    int err = errno;
    ::close(fd);
    return resource_exhausted("mmap of shared-memory segment " + name + " (" + std::to_string(size) +
                              " bytes): " + errno_text(err));
  }
  return Segment(fd, base, size);
}

class ShmCommunicator final : public Communicator {
 public:
  ShmCommunicator(std::string group, int rank, int world, Segment segment, int timeout_ms)
      : group_(std::move(group)),
        rank_(rank),
        world_(world),
        segment_(std::move(segment)),
        timeout_(std::chrono::milliseconds(timeout_ms)) {
    const SegmentHeader* h = segment_.header();
    max_bytes_ = h->max_bytes;
    slot_bytes_ = h->slot_bytes;
    data_ = segment_.base() + kDataOffset;
    seq_ = segment_.control(rank_).arrived.load(std::memory_order_relaxed);
    spin_ = world_ <= usable_cpus() ? kSpinTime : std::chrono::microseconds(2);
  }

  ~ShmCommunicator() override {
    // Peers blocked on us learn at once that we will not come, instead of at their timeout.
    RankControl& me = segment_.control(rank_);
    me.closed.store(1, std::memory_order_seq_cst);
    futex_wake_all(&me.arrived);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "shm"; }

  Status all_reduce_sum(void* data, int64_t count, DType dtype) override {
    constexpr const char* kOp = "all_reduce_sum";
    TESSERA_RETURN_IF_ERROR(check_usable(kOp));
    if (dtype != DType::kF32 && dtype != DType::kBF16)
      return invalid_argument(std::string("shm all_reduce_sum supports float32 and bfloat16, not ") + dtype_name(dtype));
    if (count < 0) return invalid_argument("shm all_reduce_sum: negative count " + std::to_string(count));
    if (world_ == 1 || count == 0) return Status::ok();
    const size_t esize = dtype_size(dtype);
    const int64_t chunk = static_cast<int64_t>(max_bytes_ / esize);
    char* bytes = static_cast<char*>(data);
    for (int64_t off = 0; off < count; off += chunk) {
      const int64_t n = std::min(chunk, count - off);
      char* mine = bytes + off * esize;
      const int b = next_buffer();
      std::memcpy(slot(b, rank_), mine, n * esize);
      TESSERA_RETURN_IF_ERROR(rendezvous(kOp));
      if (static_cast<size_t>(n) * esize <= kSmallReduceBytes) {
        reduce_range(b, 0, n, dtype, mine);
        continue;
      }
      // Slices aligned to 64 bytes so two ranks never write the same cache line.
      const int64_t align = static_cast<int64_t>(64 / esize);
      const int64_t per = round_up((n + world_ - 1) / world_, align);
      const int64_t lo = std::min<int64_t>(n, per * rank_);
      const int64_t hi = std::min<int64_t>(n, lo + per);
      if (hi > lo) reduce_range(b, lo, hi - lo, dtype, slot(b, 0) + lo * esize);
      TESSERA_RETURN_IF_ERROR(rendezvous(kOp));
      std::memcpy(mine, slot(b, 0), n * esize);
    }
    return Status::ok();
  }

  Status all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    constexpr const char* kOp = "all_gather";
    TESSERA_RETURN_IF_ERROR(check_usable(kOp));
    if (count < 0) return invalid_argument("shm all_gather: negative count " + std::to_string(count));
    const size_t esize = dtype_size(dtype);
    if (world_ == 1) {
      if (send != recv) std::memmove(recv, send, count * esize);
      return Status::ok();
    }
    const int64_t chunk = static_cast<int64_t>(max_bytes_ / esize);
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    for (int64_t off = 0; off < count; off += chunk) {
      const int64_t n = std::min(chunk, count - off);
      const int b = next_buffer();
      std::memcpy(slot(b, rank_), in + off * esize, n * esize);
      TESSERA_RETURN_IF_ERROR(rendezvous(kOp));
      for (int k = 0; k < world_; ++k) {
        char* dst = out + (k * count + off) * esize;
        // In-place gathers (send inside recv) already hold this rank's part.
        if (k == rank_ && dst == in + off * esize) continue;
        std::memcpy(dst, slot(b, k), n * esize);
      }
    }
    return Status::ok();
  }

  Status broadcast(void* data, int64_t count, DType dtype, int root) override {
    constexpr const char* kOp = "broadcast";
    TESSERA_RETURN_IF_ERROR(check_usable(kOp));
    if (root < 0 || root >= world_)
      return invalid_argument("shm broadcast root " + std::to_string(root) + " in a world of " + std::to_string(world_));
    if (count < 0) return invalid_argument("shm broadcast: negative count " + std::to_string(count));
    if (world_ == 1) return Status::ok();
    const size_t esize = dtype_size(dtype);
    // Only the root writes, so one step may use the whole buffer (all slots, contiguous).
    const int64_t chunk = static_cast<int64_t>(world_ * slot_bytes_ / esize);
    char* bytes = static_cast<char*>(data);
    for (int64_t off = 0; off < count; off += chunk) {
      const int64_t n = std::min(chunk, count - off);
      const int b = next_buffer();
      if (rank_ == root) std::memcpy(slot(b, 0), bytes + off * esize, n * esize);
      TESSERA_RETURN_IF_ERROR(rendezvous(kOp));
      if (rank_ != root) std::memcpy(bytes + off * esize, slot(b, 0), n * esize);
    }
    return Status::ok();
  }

  Status barrier() override {
    TESSERA_RETURN_IF_ERROR(check_usable("barrier"));
    if (world_ == 1) return Status::ok();
    return rendezvous("barrier");
  }

 private:
  char* slot(int buffer, int r) const { return data_ + (static_cast<size_t>(buffer) * world_ + r) * slot_bytes_; }

  // Steps alternate between two buffers. A rank writes buffer b for step k+2 only after
  // the first rendezvous of step k+1, which every rank reaches only after it finished
  // reading buffer b in step k: so one rendezvous per small step is enough.
  int next_buffer() { return static_cast<int>(step_++ & 1u); }

  void reduce_range(int b, int64_t lo, int64_t n, DType dtype, char* out) const {
    const size_t esize = dtype_size(dtype);
    const void* src[kMaxWorld];
    for (int k = 0; k < world_; ++k) src[k] = slot(b, k) + lo * esize;
    if (dtype == DType::kF32)
      sum_in_rank_order(reinterpret_cast<const float* const*>(src), world_, n, reinterpret_cast<float*>(out));
    else
      sum_in_rank_order(reinterpret_cast<const uint16_t* const*>(src), world_, n, reinterpret_cast<uint16_t*>(out));
  }

  Status check_usable(const char* op) const {
    if (!broken_.is_ok())
      return Status(broken_.code(), std::string("shm ") + op + ": communicator unusable after an earlier failure: " +
                                        broken_.message());
    return Status::ok();
  }

  bool reached(int k) const {
    const uint32_t v = segment_.control(k).arrived.load(std::memory_order_acquire);
    return static_cast<int32_t>(v - seq_) >= 0;  // wrap-safe
  }

  // Publishes our arrival at the next rendezvous, then waits for every peer's.
  Status rendezvous(const char* op) {
    ++seq_;
    RankControl& me = segment_.control(rank_);
    // seq_cst store then seq_cst load of `sleepers` pairs with the waiter's increment then
    // re-check: either it sees our new value or we see it parked and wake it.
    me.arrived.store(seq_, std::memory_order_seq_cst);
    if (me.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&me.arrived);
    const Clock::time_point start = Clock::now();
    for (int k = 0; k < world_; ++k) {
      if (k == rank_ || reached(k)) continue;
      Status s = wait_for(k, op, start);
      if (!s.is_ok()) {
        broken_ = s;
        return s;
      }
    }
    return Status::ok();
  }

  Status wait_for(int k, const char* op, Clock::time_point start) {
    RankControl& peer = segment_.control(k);
    // Spin: a decode-sized step completes in microseconds when each rank has a core.
    Clock::time_point now = Clock::now();
    while (now - start < spin_) {
      for (int i = 0; i < 64; ++i) {
        if (reached(k)) return Status::ok();
        cpu_relax();
      }
      now = Clock::now();
    }
    // Yield: with more ranks than cores the peer may need this core to get here.
    while (now - start < spin_ + kYieldTime) {
      if (reached(k)) return Status::ok();
      sched_yield();
      now = Clock::now();
    }
    Clock::time_point last_liveness = now;
    for (;;) {
      const uint32_t v = peer.arrived.load(std::memory_order_acquire);
      if (static_cast<int32_t>(v - seq_) >= 0) return Status::ok();
      // `closed` is stored after the peer's last arrival, so closed + not arrived means
      // it will never arrive.
      if (peer.closed.load(std::memory_order_acquire) != 0 && !reached(k))
        return lost_peers(op, start, "closed its communicator");
      now = Clock::now();
      if (now - start >= timeout_) return lost_peers(op, start, "did not arrive");
      if (now - last_liveness >= kLivenessPeriod) {
        last_liveness = now;
        if (!process_alive(peer.pid.load(std::memory_order_relaxed)) && !reached(k))
          return lost_peers(op, start, "exited");
      }
      peer.sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (peer.arrived.load(std::memory_order_seq_cst) == v)
        futex_wait(&peer.arrived, v, std::min<Clock::duration>(kFutexSlice, timeout_ - (now - start)));
      peer.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  Status lost_peers(const char* op, Clock::time_point start, const char* what) const {
    std::string missing;
    for (int k = 0; k < world_; ++k) {
      if (k == rank_ || reached(k)) continue;
      const RankControl& c = segment_.control(k);
      if (!missing.empty()) missing += ", ";
      missing += std::to_string(k) + " (pid " + std::to_string(c.pid.load(std::memory_order_relaxed));
      if (c.closed.load(std::memory_order_relaxed) != 0)
        missing += ", closed";
      else if (!process_alive(c.pid.load(std::memory_order_relaxed)))
        missing += ", exited";
      missing += ")";
    }
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    return unavailable("shm " + std::string(op) + " in group '" + group_ + "': rank " + std::to_string(rank_) +
                       " gave up after " + std::to_string(waited) + " ms (timeout " +
                       std::to_string(timeout_.count()) + " ms); missing rank(s) " + missing + ": a peer " + what);
  }

  std::string group_;
  int rank_;
  int world_;
  Segment segment_;
  std::chrono::milliseconds timeout_;
  std::chrono::microseconds spin_{};
  size_t max_bytes_ = 0;
  size_t slot_bytes_ = 0;
  char* data_ = nullptr;
  uint32_t seq_ = 0;   // rendezvous count, same on every rank
  uint32_t step_ = 0;  // buffer alternation, same on every rank
  Status broken_;
};

// ---- setup -----------------------------------------------------------------------------

bool valid_group_name(const std::string& g) {
  if (g.empty() || g.size() > 200) return false;
  for (char c : g)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  return true;
}

std::string describe(const std::string& group, int rank) {
  return "shm communicator (group '" + group + "', rank " + std::to_string(rank) + ")";
}

// Rank 0: replace whatever has the name, initialise, admit every rank, then unlink the name.
StatusOr<Segment> create_segment(const std::string& group, const std::string& name, int world, size_t max_bytes,
                                 Clock::time_point deadline, int timeout_ms) {
  ::shm_unlink(name.c_str());  // a stale segment of a crashed run, if any
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    return unavailable(describe(group, 0) + ": cannot create " + name + ": " + errno_text(errno) +
                       (errno == EEXIST ? " (another rank 0 of this group is starting?)" : ""));
  const size_t total = total_bytes_for(world, max_bytes);
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
    int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    return resource_exhausted(describe(group, 0) + ": cannot size " + name + " to " + std::to_string(total) +
                              " bytes: " + errno_text(err));
  }
  // tmpfs allocates pages on first touch, and a full /dev/shm (64 MB in a default Docker
  // container) would then kill us with SIGBUS mid-collective: reserve them now instead.
  if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(total)); err != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    return resource_exhausted(describe(group, 0) + ": cannot reserve " + std::to_string(total) + " bytes for " +
                              name + " (is /dev/shm large enough?): " + errno_text(err));
  }
  StatusOr<Segment> mapped = map_fd(fd, total, name);
  if (!mapped.is_ok()) {
    ::shm_unlink(name.c_str());
    return mapped.status();
  }
  Segment seg = std::move(mapped).value();
  // ftruncate zero-filled the segment, which is a valid initial state for every atomic.
  SegmentHeader* h = seg.header();
  h->magic = kMagic;
  h->version = kVersion;
  h->world_size = static_cast<uint32_t>(world);
  h->max_bytes = max_bytes;
  h->slot_bytes = slot_bytes_for(max_bytes);
  h->total_bytes = total;
  h->nonce = random_token();
  h->creator_pid = ::getpid();
  seg.control(0).pid.store(::getpid(), std::memory_order_relaxed);
  seg.control(0).join_token.store(h->nonce, std::memory_order_relaxed);
  seg.control(0).ack_token.store(h->nonce, std::memory_order_relaxed);
  h->ready.store(1, std::memory_order_release);

  for (;;) {
    std::string missing;
    for (int r = 1; r < world; ++r) {
      RankControl& c = seg.control(r);
      const uint64_t token = c.join_token.load(std::memory_order_acquire);
      if (token == 0) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      } else if (c.ack_token.load(std::memory_order_relaxed) != token) {
        c.ack_token.store(token, std::memory_order_release);
      }
    }
    if (missing.empty()) break;
    if (Clock::now() >= deadline) {
      ::shm_unlink(name.c_str());
      return unavailable(describe(group, 0) + ": rank(s) " + missing + " did not join within " +
                         std::to_string(timeout_ms) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  // Everyone has it mapped: drop the name now, so no crash from here on leaves it behind.
  ::shm_unlink(name.c_str());
  return seg;
}

bool same_object(int fd, const std::string& name) {
  int probe = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (probe < 0) return false;
  struct stat a {}, b {};
  bool same = ::fstat(fd, &a) == 0 && ::fstat(probe, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
  ::close(probe);
  return same;
}

// Ranks > 0: wait for rank 0's segment, check it matches, join, and wait to be admitted.
// Anything that looks stale (dead creator, taken slot, name replaced) is dropped and retried.
StatusOr<Segment> join_segment(const std::string& group, const std::string& name, int rank, int world,
                               size_t max_bytes, Clock::time_point deadline, int timeout_ms) {
  const uint64_t token = random_token();
  const size_t total = total_bytes_for(world, max_bytes);
  std::string last = "segment " + name + " never appeared (is rank 0 running?)";
  auto pause = [] { std::this_thread::sleep_for(std::chrono::microseconds(200)); };
  for (;;) {
    if (Clock::now() >= deadline)
      return unavailable(describe(group, rank) + ": not admitted within " + std::to_string(timeout_ms) +
                         " ms: " + last);
    int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) {
      if (errno != ENOENT)
        return unavailable(describe(group, rank) + ": cannot open " + name + ": " + errno_text(errno));
      pause();
      continue;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < kDataOffset) {
      ::close(fd);
      last = "segment " + name + " exists but is not initialised";
      pause();
      continue;
    }
    StatusOr<Segment> mapped = map_fd(fd, static_cast<size_t>(st.st_size), name);
    if (!mapped.is_ok()) return mapped.status();
    Segment seg = std::move(mapped).value();
    const SegmentHeader* h = seg.header();
    if (h->ready.load(std::memory_order_acquire) != 1 || h->magic != kMagic || h->version != kVersion) {
      last = "segment " + name + " is not (yet) an initialised version-" + std::to_string(kVersion) + " segment";
      pause();
      continue;
    }
    if (h->world_size != static_cast<uint32_t>(world) || h->max_bytes != max_bytes ||
        static_cast<size_t>(st.st_size) != total) {
      const std::string mismatch = "rank 0 created it for world size " + std::to_string(h->world_size) +
                                   " and max_bytes " + std::to_string(h->max_bytes) + ", this rank has world size " +
                                   std::to_string(world) + " and max_bytes " + std::to_string(max_bytes);
      if (process_alive(h->creator_pid))
        return invalid_argument(describe(group, rank) + ": segment " + name + " does not match: " + mismatch);
      last = "stale segment " + name + " (" + mismatch + ", creator gone)";
      pause();
      continue;
    }
    RankControl& me = seg.control(rank);
    uint64_t expected = 0;
    if (!me.join_token.compare_exchange_strong(expected, token, std::memory_order_acq_rel)) {
      last = "rank " + std::to_string(rank) + " is already taken in " + name +
             " (a stale segment, or two processes started as the same rank)";
      pause();
      continue;
    }
    me.pid.store(::getpid(), std::memory_order_relaxed);
    const int32_t creator = h->creator_pid;
    for (int polls = 0;; ++polls) {
      if (me.ack_token.load(std::memory_order_acquire) == token) return seg;
      if (Clock::now() >= deadline)
        return unavailable(describe(group, rank) + ": rank 0 did not admit this rank within " +
                           std::to_string(timeout_ms) + " ms");
      // Rank 0 acks before it unlinks, so a vanished or replaced name with no ack yet
      // means we joined a segment no live rank 0 will serve.
      if (polls % 16 == 15 && (!same_object(seg.fd(), name) || !process_alive(creator))) {
        if (me.ack_token.load(std::memory_order_acquire) == token) return seg;
        last = "joined a stale segment " + name + "; retrying";
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

}  // namespace

std::string shm_segment_name(const std::string& group_name) { return "/tessera-" + group_name; }

StatusOr<std::unique_ptr<Communicator>> make_shm_communicator(const std::string& group_name, int rank,
                                                              int world_size, size_t max_bytes, int timeout_ms) {
  if (!valid_group_name(group_name))
    return invalid_argument("shm communicator: group name '" + group_name +
                            "' must be 1-200 characters of [A-Za-z0-9._-]");
  if (world_size < 1 || world_size > kMaxWorld)
    return invalid_argument("shm communicator: world size " + std::to_string(world_size) + " not in [1, " +
                            std::to_string(kMaxWorld) + "]");
  if (rank < 0 || rank >= world_size)
    return invalid_argument("shm communicator: rank " + std::to_string(rank) + " not in [0, " +
                            std::to_string(world_size) + ")");
  if (max_bytes < 64 || max_bytes > (size_t{1} << 32))
    return invalid_argument("shm communicator: max_bytes " + std::to_string(max_bytes) + " not in [64, 4 GiB]");
  if (timeout_ms <= 0)
    return invalid_argument("shm communicator: timeout_ms must be positive, got " + std::to_string(timeout_ms));
  // Chunks are whole elements of every dtype and slices stay 64-byte aligned.
  max_bytes = max_bytes / 64 * 64;
  const std::string name = shm_segment_name(group_name);
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  StatusOr<Segment> seg = rank == 0 ? create_segment(group_name, name, world_size, max_bytes, deadline, timeout_ms)
                                    : join_segment(group_name, name, rank, world_size, max_bytes, deadline, timeout_ms);
  if (!seg.is_ok()) return seg.status();
  return std::unique_ptr<Communicator>(
      std::make_unique<ShmCommunicator>(group_name, rank, world_size, std::move(seg).value(), timeout_ms));
}

}  // namespace tessera
