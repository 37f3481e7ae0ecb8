#include "worker/gloo_communicator.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <signal.h>
#include <unistd.h>

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "common/logging.h"
#include "worker/rank_order_sum.h"

namespace tessera {
namespace gloo_comm {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

Status unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }

class FolderRendezvous final : public GlooRendezvous {
 public:
  explicit FolderRendezvous(std::string dir) : dir_(std::move(dir)) {}
  Status set(const std::string& key, const std::string& value) override {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    const std::string path = dir_ + "/" + key;
    const std::string tmp = path + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(value.data(), static_cast<std::streamsize>(value.size()));
      if (!out) return unavailable("gloo rendezvous: cannot write " + tmp);
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec) return unavailable("gloo rendezvous: cannot rename " + tmp + ": " + ec.message());
    return Status::ok();
  }
  StatusOr<std::string> get(const std::string& key, int timeout_ms) override {
    const std::string path = dir_ + "/" + key;
    const Clock::time_point deadline = Clock::now() + Ms(timeout_ms);
    for (;;) {
      std::ifstream in(path, std::ios::binary);
      if (in) {
        std::ostringstream s;
        s << in.rdbuf();
        return s.str();
      }
      if (Clock::now() >= deadline)
        return unavailable("gloo rendezvous: no \"" + key + "\" in " + dir_ + " after " +
                                 std::to_string(timeout_ms) + " ms");
      std::this_thread::sleep_for(Ms(2));
    }
  }

 private:
  std::string dir_;
};

// Gloo's store interface over a GlooRendezvous (Gloo reports failures by exceptions).
class StoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  StoreAdapter(GlooRendezvous& r, int timeout_ms) : r_(r), timeout_ms_(timeout_ms) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    const Status s = r_.set(key, std::string(data.begin(), data.end()));
    if (!s.is_ok()) throw std::runtime_error(s.message());
  }
  std::vector<char> get(const std::string& key) override {
    StatusOr<std::string> v = r_.get(key, timeout_ms_);
    if (!v.is_ok()) throw std::runtime_error(v.status().message());
    return std::vector<char>(v.value().begin(), v.value().end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, Ms(timeout_ms_)); }
  void wait(const std::vector<std::string>& keys, const Ms& timeout) override {
    for (const std::string& k : keys) {
      StatusOr<std::string> v = r_.get(k, static_cast<int>(timeout.count()));
      // Gloo's full mesh keys each rank's addresses by its number.
      const bool rank_key = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!v.is_ok())
        throw std::runtime_error((rank_key ? "rank " + k + " did not join within " + std::to_string(timeout.count()) + " ms: " : "") +
                                 v.status().message());
    }
  }

 private:
  GlooRendezvous& r_;
  int timeout_ms_;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<::gloo::rendezvous::Context> ctx, std::shared_ptr<::gloo::transport::Device> device,
                   int timeout_ms)
      : ctx_(std::move(ctx)), device_(std::move(device)), timeout_(timeout_ms) {}

  // Puts every connection in synchronous mode (the calling thread writes and reads the socket
  // itself: no hand-off to Gloo's I/O thread, which cost ~1 ms a collective inside a decode)
  // with a send and a receive buffer of one chunk per peer.
  Status start() {
    try {
      const auto slot = static_cast<uint64_t>(ctx_->nextSlot());
      send_stage_.resize(kChunk);
      for (int p = 0; p < world_size(); ++p) {
        if (p == rank()) continue;
        Peer& peer = peers_.emplace_back();
        peer.rank = p;
        peer.stage.resize(kChunk);
        auto& pair = ctx_->getPair(p);
        pair->setSync(true, false);
        peer.send = pair->createSendBuffer(static_cast<int>(slot), send_stage_.data(), kChunk);
        peer.recv = pair->createRecvBuffer(static_cast<int>(slot), peer.stage.data(), kChunk);
      }
    } catch (const std::exception& e) {
      return fail("set-up", {}, e.what());
    }
    return Status::ok();
  }
  ~GlooCommunicator() override {
    // Closing first tells the peers at once (they fail instead of waiting for the timeout).
    try {
      ctx_->closeConnections();
    } catch (const std::exception&) {
    }
  }
  int rank() const override { return ctx_->rank; }
  int world_size() const override { return ctx_->size; }
  std::string name() const override { return "gloo"; }

  Status all_reduce_sum(void* data, int64_t count, DType dtype) override {
    if (dtype != DType::kF32 && dtype != DType::kBF16)
      return invalid_argument("gloo all_reduce_sum: f32 or bf16 only, got " + std::string(dtype_name(dtype)));
    if (count < 0) return invalid_argument("gloo all_reduce_sum: negative count");
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    if (world_size() == 1 || count == 0) return usable("all_reduce_sum");
    scratch_.resize(bytes * static_cast<size_t>(world_size()));
    TESSERA_RETURN_IF_ERROR(exchange("all_reduce_sum", data, bytes, scratch_.data()));
    std::memcpy(scratch_.data() + static_cast<size_t>(rank()) * bytes, data, bytes);
    if (dtype == DType::kF32)
      sum_parts<float>(data, count);
    else
      sum_parts<uint16_t>(data, count);
    return Status::ok();
  }

  Status all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    if (count < 0) return invalid_argument("gloo all_gather: negative count");
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    char* mine = static_cast<char*>(recv) + static_cast<size_t>(rank()) * bytes;
    if (mine != send) std::memmove(mine, send, bytes);
    if (world_size() == 1 || count == 0) return usable("all_gather");
    return exchange("all_gather", mine, bytes, static_cast<char*>(recv));
  }

  Status broadcast(void* data, int64_t count, DType dtype, int root) override {
    if (root < 0 || root >= world_size())
      return invalid_argument("gloo broadcast: root " + std::to_string(root) + " outside the group of " +
                              std::to_string(world_size()));
    if (count < 0) return invalid_argument("gloo broadcast: negative count");
    TESSERA_RETURN_IF_ERROR(usable("broadcast"));
    if (world_size() == 1 || count == 0) return Status::ok();
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    char* at = static_cast<char*>(data);
    std::vector<int> missing;
    std::string why;
    for (size_t off = 0; off < bytes && missing.empty(); off += kChunk) {
      const size_t n = std::min(kChunk, bytes - off);
      if (rank() == root) {
        std::memcpy(send_stage_.data(), at + off, n);
        for (Peer& peer : peers_) attempt([&] { peer.send->send(0, n); }, peer.rank, missing, why);
      } else {
        Peer& from = peer_of(root);
        if (attempt([&] { from.recv->waitRecv(); }, root, missing, why)) std::memcpy(at + off, from.stage.data(), n);
      }
    }
    return missing.empty() ? Status::ok() : fail("broadcast", missing, why);
  }

  Status barrier() override {
    if (world_size() == 1) return usable("barrier");
    char token = 1;
    std::vector<char> all(static_cast<size_t>(world_size()));
    return exchange("barrier", &token, 1, all.data());
  }

 private:
  Status usable(const char* op) const {
    if (failed_.empty()) return Status::ok();
    return unavailable(std::string("gloo ") + op + ": the group failed earlier (" + failed_ + ")");
  }

  // Sends `bytes` from `send` to every peer and receives peer p's into recv + p * bytes.
  Status exchange(const char* op, const void* send, size_t bytes, char* recv) {
    TESSERA_RETURN_IF_ERROR(usable(op));
    const char* from = static_cast<const char*>(send);
    std::vector<int> missing;
    std::string why;
    // A chunk to every peer, then a chunk from every peer: each connection holds at most one
    // chunk each way, which the sockets' buffers take, so no two ranks block on each other.
    for (size_t off = 0; off < bytes && missing.empty(); off += kChunk) {
      const size_t n = std::min(kChunk, bytes - off);
      std::memcpy(send_stage_.data(), from + off, n);
      for (Peer& peer : peers_) attempt([&] { peer.send->send(0, n); }, peer.rank, missing, why);
      for (Peer& peer : peers_) {
        if (std::find(missing.begin(), missing.end(), peer.rank) != missing.end()) continue;
        if (attempt([&] { peer.recv->waitRecv(); }, peer.rank, missing, why))
          std::memcpy(recv + static_cast<size_t>(peer.rank) * bytes + off, peer.stage.data(), n);
      }
    }
    if (missing.empty()) return Status::ok();
    std::sort(missing.begin(), missing.end());
    return fail(op, missing, why);
  }

  // Runs one transfer with `peer`; an exception marks the peer missing (the first one's text
  // is `why`). True when it went through.
  template <typename Fn>
  static bool attempt(Fn&& transfer, int peer, std::vector<int>& missing, std::string& why) {
    try {
      transfer();
      return true;
    } catch (const std::exception& e) {
      if (why.empty()) why = e.what();
      if (std::find(missing.begin(), missing.end(), peer) == missing.end()) missing.push_back(peer);
      return false;
    }
  }

  struct Peer {
    int rank = 0;
    std::unique_ptr<::gloo::transport::Buffer> send, recv;
    std::vector<char> stage;  // where recv lands
  };
  Peer& peer_of(int r) {
    return *std::find_if(peers_.begin(), peers_.end(), [r](const Peer& p) { return p.rank == r; });
  }

  Status fail(const char* op, const std::vector<int>& missing, const std::string& why) {
    std::string ranks;
    for (int r : missing) {
      if (!ranks.empty()) ranks += ",";
      ranks += std::to_string(r);
    }
    failed_ = std::string(op) + (ranks.empty() ? "" : ": missing rank(s) " + ranks) + ": " + why;
    return unavailable("gloo " + failed_ + " (rank " + std::to_string(rank()) + " of " + std::to_string(world_size()) +
                       ", timeout " + std::to_string(timeout_.count()) + " ms)");
  }

  // data = the ranks' parts in scratch_ (T: float, or uint16_t for bf16), summed in rank
  // order (worker/rank_order_sum.h).
  template <typename T>
  void sum_parts(void* data, int64_t count) const {
    std::vector<const T*> parts;
    for (int r = 0; r < world_size(); ++r) parts.push_back(reinterpret_cast<const T*>(scratch_.data()) + r * count);
    sum_in_rank_order(parts.data(), world_size(), count, static_cast<T*>(data));
  }

  std::shared_ptr<::gloo::rendezvous::Context> ctx_;
  std::shared_ptr<::gloo::transport::Device> device_;
  Ms timeout_;
  // One message on a connection. Every rank sends a chunk to each peer before it reads theirs, so
  // each connection must take a chunk each way unread (its send and receive buffers): 64 KB is
  // well within the smallest defaults, and as fast as 512 KB here (1.3-1.5 GB/s from 256 KB up).
  static constexpr size_t kChunk = size_t{64} << 10;
  std::vector<char> send_stage_;  // what every peer's send buffer sends from
  std::vector<Peer> peers_;
  std::vector<char> scratch_;  // every rank's part of an all-reduce
  std::string failed_;         // why the group failed; empty while it works
};

// What Gloo's device would refuse, checked first (its refusals leak what they looked up): an
// interface that does not exist, an address that does not resolve or that no interface here has.
Status check_listen(const ::gloo::transport::tcp::attr& attr) {
  if (!attr.iface.empty()) {
    if (::if_nametoindex(attr.iface.c_str()) == 0) return invalid_argument("no such network interface");
    return Status::ok();
  }
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(attr.hostname.c_str(), nullptr, &hints, &found); rc != 0)
    return invalid_argument(std::string("cannot resolve it: ") + ::gai_strerror(rc));
  std::string why = "no address";
  bool bound = false;
  for (const addrinfo* a = found; a != nullptr && !bound; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    bound = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;  // port 0: any
    if (!bound) why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return bound ? Status::ok() : invalid_argument(why);
}

// "; the peers' addresses for this rank: rank 1 at 10.0.0.2:43210, ..." from what they
// published (Gloo's own error may not name the address it failed to reach); "" when none did.
std::string peer_addresses(GlooRendezvous& rendezvous, int rank, int world) {
  std::string out;
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    StatusOr<std::string> all = rendezvous.get(std::to_string(peer), 0);
    if (!all.is_ok() || all->empty()) continue;
    // The peer's list holds an address for each other rank, in rank order, itself left out.
    const size_t each = all->size() / static_cast<size_t>(world - 1);
    const size_t index = static_cast<size_t>(rank > peer ? rank - 1 : rank);
    std::string where = "?";
    try {
      const ::gloo::transport::tcp::Address a(std::vector<char>(all->begin() + static_cast<std::ptrdiff_t>(index * each),
                                                                 all->begin() + static_cast<std::ptrdiff_t>((index + 1) * each)));
      const sockaddr_storage& ss = a.getSockaddr();
      char host[INET6_ADDRSTRLEN] = "?";
      int port = 0;
      if (ss.ss_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
        ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        port = ntohs(in->sin_port);
      } else if (ss.ss_family == AF_INET6) {
        const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
        ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        port = ntohs(in6->sin6_port);
      }
      where = std::string(host) + ":" + std::to_string(port);
    } catch (const std::exception&) {
    }
    out += (out.empty() ? "; the peers' addresses for this rank: rank " : ", rank ") + std::to_string(peer) + " at " + where;
  }
  return out;
}

}  // namespace gloo_comm

std::unique_ptr<GlooRendezvous> make_folder_rendezvous(const std::string& dir) {
  return std::make_unique<gloo_comm::FolderRendezvous>(dir);
}

StatusOr<std::unique_ptr<Communicator>> make_gloo_communicator(const GlooOptions& o, GlooRendezvous& rendezvous) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    return invalid_argument("gloo: rank " + std::to_string(o.rank) + " outside a group of " + std::to_string(o.world_size));
  if (o.timeout_ms < 1) return invalid_argument("gloo: timeout must be at least 1 ms");
  // Gloo writes to its sockets without MSG_NOSIGNAL: a write to a peer that died would kill
  // this process with SIGPIPE instead of failing the collective. Ignored, unless someone
  // installed a handler (the write then fails with EPIPE, which Gloo reports).
  struct sigaction pipe_action = {};
  if (::sigaction(SIGPIPE, nullptr, &pipe_action) == 0 && pipe_action.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  ::gloo::transport::tcp::attr attr;
  attr.hostname = o.address;
  attr.iface = o.interface;
  if (o.address.empty() && o.interface.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    attr.hostname = host;
  }
  const std::string where = !o.interface.empty() ? "interface " + o.interface : "address " + attr.hostname;
  if (Status s = gloo_comm::check_listen(attr); !s.is_ok())
    return invalid_argument("gloo: rank " + std::to_string(o.rank) + " cannot listen on " + where + ": " + s.message());
  std::shared_ptr<::gloo::transport::Device> device;
  try {
    device = ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return invalid_argument("gloo: rank " + std::to_string(o.rank) + " cannot listen on " + where + ": " + e.what());
  }
  TESSERA_LOG_INFO("gloo: rank {}/{} listens on {} ({})", o.rank, o.world_size, where, device->str());
  auto ctx = std::make_shared<::gloo::rendezvous::Context>(o.rank, o.world_size);
  ctx->setTimeout(gloo_comm::Ms(o.timeout_ms));
  gloo_comm::StoreAdapter store(rendezvous, o.timeout_ms);
  try {
    ctx->connectFullMesh(store, device);
  } catch (const std::exception& e) {
    return gloo_comm::unavailable("gloo: rank " + std::to_string(o.rank) + " (listening on " + device->str() +
                                  ") could not connect to its peers: " + e.what() +
                                  gloo_comm::peer_addresses(rendezvous, o.rank, o.world_size));
  }
  // A rank's connections are up on its side when connectFullMesh returns, not yet on every
  // peer's; a barrier over the mesh makes the group whole for all before anyone uses it (or
  // leaves: a rank closing early would reset a peer still completing its connect).
  auto comm = std::make_unique<gloo_comm::GlooCommunicator>(std::move(ctx), std::move(device), o.timeout_ms);
  if (Status s = comm->start(); !s.is_ok()) return s;
  if (Status s = comm->barrier(); !s.is_ok())
    return s.with_context("gloo: rank " + std::to_string(o.rank) + " could not complete the group");
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace tessera
