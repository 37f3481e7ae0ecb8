#include "coordinator/cluster/worker_group.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <zmq.hpp>

#include "common/logging.h"
#include "common/zmq/curve_authenticator.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

Status unavailable(std::string msg) { return Status(StatusCode::kUnavailable, std::move(msg)); }

int64_t ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

// step_id sits right after the header in a StepPlan / StepResult frame.
uint64_t peek_step_id(const zmq::message_t& m) {
  uint64_t id = 0;
  if (m.size() >= wire::kHeaderBytes + 8) {
    const auto* p = static_cast<const uint8_t*>(m.data()) + wire::kHeaderBytes;
    for (int i = 0; i < 8; ++i) id |= static_cast<uint64_t>(p[i]) << (8 * i);
  }
  return id;
}

std::string_view view(const zmq::message_t& m) { return {static_cast<const char*>(m.data()), m.size()}; }

struct Slot {
  std::string identity;  // ROUTER routing id of the current connection; empty when none
  // The connection it had when declared dead: a setup failure it sent before it left can be
  // read after that (a send to it failed first), and is still its own.
  std::string dead_identity;
  bool registered = false;
  bool alive = false;
  bool ready = false;
  bool setup_failed = false;
  bool assigned = false;  // its current registration got an Assignment
  bool silent = false;    // declared dead for missed heartbeats (its connection may still be open)
  int registrations = 0;
  wire::Register info;
  std::string error;
  Clock::time_point last_heard{};
};

}  // namespace

struct WorkerGroup::Impl {
  WorkerGroupOptions opts;
  AssignmentFactory factory;
  zmq::context_t ctx{1};
  CurveAuthenticator authenticator;  // after ctx: closed before it
  // The ROUTER is used by whichever thread holds sock_mu: execute() while a step is in
  // flight (it then serves registrations and heartbeats too), the housekeeping thread
  // otherwise. No thread hop on the step path.
  std::unique_ptr<zmq::socket_t> router;
  std::mutex sock_mu;
  std::string endpoint;
  std::thread io;
  std::atomic<bool> stop{false};
  std::atomic<bool> stop_requested{false};
  std::string stop_reason;

  std::mutex exec_mu;  // serialises execute() and shutdown()
  bool started = false;
  bool stopped = false;
  std::string plan_buf;

  mutable std::mutex state_mu;  // guards slots, by_identity, collective_blobs
  std::condition_variable state_cv;
  std::vector<Slot> slots;
  std::unordered_map<std::string, int> by_identity;
  // The collective group's bootstrap blobs from the ranks' current sessions (rank 0's NCCL
  // unique id; every rank's Gloo addresses and shared-memory identity), by origin rank,
  // relayed to the other ranks; a rank's are dropped when it registers again or dies, all of
  // them when the group re-forms.
  std::vector<std::pair<int, std::string>> collective_blobs;
  void drop_blobs_of(int rank) {
    std::erase_if(collective_blobs, [rank](const auto& b) { return b.first == rank; });
  }
  // on_all_registered: whether it has run successfully (under sock_mu), and its error
  // (under state_mu), which ends wait_until_ready().
  bool all_registered_once = false;
  Status group_error;

  // The step in flight and socket-side state (under sock_mu).
  Status outcome_status;
  Clock::time_point next_hb{};
  bool step_active = false;
  uint64_t step_id = 0;
  std::vector<char> awaiting;
  int remaining = 0;
  StepResult rank0_result;
  std::vector<std::string> identities;
  StepResult scratch_result;
  uint64_t hb_seq = 0;
  std::string send_buf;

  bool complete_locked() const {
    return std::all_of(slots.begin(), slots.end(), [](const Slot& s) { return s.alive && s.ready; });
  }

  std::string describe_incomplete_locked(Clock::time_point now) const {
    int ready = 0;
    std::string parts;
    for (size_t r = 0; r < slots.size(); ++r) {
      const Slot& s = slots[r];
      if (s.alive && s.ready) {
        ++ready;
        continue;
      }
      std::string what;
      if (!s.registered) {
        what = "not registered yet";
      } else if (s.alive && !s.assigned) {
        what = "registered, its assignment held until every rank has registered";
      } else if (!s.alive) {
        what = "dead (" + s.error + ")";
      } else if (s.setup_failed) {
        what = "setup failed: " + s.error;
      } else {
        what = "still setting up (" + std::to_string(ms_between(s.last_heard, now)) + " ms since heard)";
      }
      if (!parts.empty()) parts += "; ";
      parts += "rank " + std::to_string(r) + " " + what;
    }
    return "worker group incomplete (" + std::to_string(ready) + "/" + std::to_string(slots.size()) +
           " ranks ready): " + parts;
  }

  // ---- I/O thread ------------------------------------------------------------------

  bool send_to(const std::string& identity, std::string_view frame) {
    try {
      if (!router->send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return false;
      return router->send(zmq::buffer(frame.data(), frame.size()), zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t&) {
      return false;  // EHOSTUNREACH: the peer is gone (ROUTER_MANDATORY)
    }
  }
  bool send_msg_to(const std::string& identity, zmq::message_t& msg) {
    try {
      if (!router->send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return false;
      return router->send(msg, zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t&) {
      return false;
    }
  }

  void reject(const std::string& identity, const std::string& reason) {
    TESSERA_LOG_WARN("worker group: rejected a peer: {}", reason);
    wire::encode(wire::Reject{reason}, &send_buf);
    send_to(identity, send_buf);
  }

  void finish_step(Status status) {
    if (!step_active) return;
    step_active = false;
    outcome_status = std::move(status);
  }

  void mark_dead_locked(int rank, const std::string& why) {
    Slot& s = slots[rank];
    if (!s.alive) return;
    s.alive = false;
    s.ready = false;
    // A rank whose setup failed usually leaves right after: keep why it failed, the useful part.
    s.error = s.setup_failed ? "setup failed: " + s.error + "; then " + why : why;
    if (!s.identity.empty()) by_identity.erase(s.identity);
    s.dead_identity = s.identity;
    s.identity.clear();
    TESSERA_LOG_ERROR("worker group: rank {} (host {}, pid {}) declared dead: {}", rank, s.info.host, s.info.pid, why);
    state_cv.notify_all();
  }

  void on_dead(int rank, const std::string& why) {
    std::vector<std::string> regroup;  // routing ids of the ranks told to restart with the group
    const std::string reason = "rank " + std::to_string(rank) + " was lost (" + why +
                               "): every rank restarts so that the collective group forms anew";
    {
      std::lock_guard<std::mutex> lock(state_mu);
      const bool was_alive = slots[rank].alive;
      mark_dead_locked(rank, why);
      drop_blobs_of(rank);
      if (was_alive && opts.regroup_on_rank_loss) {
        for (size_t k = 0; k < slots.size(); ++k) {
          if (!slots[k].alive) continue;
          regroup.push_back(slots[k].identity);
          mark_dead_locked(static_cast<int>(k), "restarting with the group: rank " + std::to_string(rank) + " was lost");
        }
        if (!regroup.empty()) collective_blobs.clear();
      }
    }
    if (!regroup.empty()) {
      TESSERA_LOG_WARN("worker group: {}; told {} other rank(s) to leave", reason, regroup.size());
      wire::encode(wire::Shutdown{reason}, &send_buf);
      for (const std::string& identity : regroup) send_to(identity, send_buf);
    }
    if (step_active && awaiting[rank])
      finish_step(unavailable("rank " + std::to_string(rank) + " died during step " + std::to_string(step_id) +
                              ": " + why));
  }

  // Under sock_mu. Sends the plan to every rank; outcome_status says why not.
  void start_step(uint64_t id, const std::string& frame) {
    step_id = id;
    identities.clear();
    {
      std::lock_guard<std::mutex> lock(state_mu);
      if (!complete_locked()) {
        outcome_status =
            unavailable("refusing step " + std::to_string(step_id) + ": " + describe_incomplete_locked(Clock::now()));
        return;
      }
      for (const Slot& s : slots) identities.push_back(s.identity);
    }
    step_active = true;
    outcome_status = Status::ok();
    awaiting.assign(slots.size(), 1);
    remaining = static_cast<int>(slots.size());
    zmq::message_t plan(frame.data(), frame.size());
    for (size_t r = 0; r < identities.size(); ++r) {
      zmq::message_t copy;
      copy.copy(plan);
      if (!send_msg_to(identities[r], copy)) {
        on_dead(static_cast<int>(r), "unreachable when sending step " + std::to_string(step_id));
        return;
      }
    }
  }

  void on_step_result(int rank, zmq::message_t& msg) {
    if (!step_active || !awaiting[rank] || peek_step_id(msg) != step_id) return;  // late reply
    StepResult& result = rank == 0 ? rank0_result : scratch_result;
    Status st = wire::decode(view(msg), &result);
    if (!st.is_ok()) {
      finish_step(unavailable("rank " + std::to_string(rank) + " sent an unreadable reply to step " +
                              std::to_string(step_id) + ": " + st.to_string()));
      return;
    }
    if (!result.error.empty()) {
      // A rank's step often fails because a peer died (its collective broke): look at once
      // whether every rank is still connected, so the group reports a lost rank now rather
      // than at the next heartbeat (callers tell "workers unavailable" from "step failed" by
      // is_complete()).
      // The step's outcome is this rank's own error (what broke), set before anything else can
      // end the step with a vaguer one; a rank whose collective broke leaves, so the group is
      // incomplete now, not a heartbeat later (and before a heartbeat finds it gone).
      finish_step(unavailable("rank " + std::to_string(rank) + " failed step " + std::to_string(step_id) + ": " +
                              result.error));
      if (result.leaving) on_dead(rank, "left the group after its collective failed in step " + std::to_string(step_id));
      send_heartbeats();
      return;
    }
    awaiting[rank] = 0;
    if (--remaining == 0) finish_step(Status::ok());
  }

  void on_register(const std::string& identity, const zmq::message_t& msg) {
    StatusOr<wire::Header> header = wire::decode_header(view(msg));
    if (!header.is_ok()) return reject(identity, "unreadable registration: " + header.status().message());
    if (header->version != wire::kProtocolVersion)
      return reject(identity, "wire protocol version " + std::to_string(header->version) +
                                  " rejected: this coordinator speaks version " +
                                  std::to_string(wire::kProtocolVersion));
    wire::Register reg;
    Status st = wire::decode(view(msg), &reg);
    if (!st.is_ok()) return reject(identity, "unreadable registration: " + st.message());
    if (reg.protocol_version != wire::kProtocolVersion)
      return reject(identity, "protocol version " + std::to_string(reg.protocol_version) +
                                  " rejected: this coordinator speaks version " +
                                  std::to_string(wire::kProtocolVersion));
    const int world = static_cast<int>(slots.size());
    if (reg.world_size != world)
      return reject(identity, "rank " + std::to_string(reg.rank) + " registered for world size " +
                                  std::to_string(reg.world_size) + " but this group has " + std::to_string(world) +
                                  " ranks");
    if (reg.rank < 0 || reg.rank >= world)
      return reject(identity, "rank " + std::to_string(reg.rank) + " is out of range [0, " + std::to_string(world) +
                                  ")");
    const int rank = reg.rank;
    int registrations = 0;
    {
      std::lock_guard<std::mutex> lock(state_mu);
      Slot& s = slots[rank];
      if (s.alive && s.identity != identity) {
        const std::string reason = "duplicate registration for rank " + std::to_string(rank) + " from host " +
                                   reg.host + " (pid " + std::to_string(reg.pid) +
                                   ") rejected: the rank is held by host " + s.info.host + " (pid " +
                                   std::to_string(s.info.pid) + "), which is alive";
        // reject() logs and sends; call it outside the state lock is not needed (no re-entry).
        TESSERA_LOG_WARN("worker group: {}", reason);
        wire::encode(wire::Reject{reason}, &send_buf);
        send_to(identity, send_buf);
        return;
      }
      if (!s.identity.empty()) by_identity.erase(s.identity);
      s.identity = identity;
      s.dead_identity.clear();
      s.registered = true;
      s.alive = true;
      s.silent = false;
      s.ready = false;
      s.setup_failed = false;
      s.assigned = false;
      s.error.clear();
      s.info = reg;
      s.last_heard = Clock::now();
      registrations = ++s.registrations;
      by_identity[identity] = rank;
      drop_blobs_of(rank);  // a new session publishes anew
    }
    if (opts.on_all_registered && !all_registered_once) return hold_until_all_registered(rank, reg);
    assign(rank, identity, reg, registrations);
  }

  // on_all_registered mode, before it ran: holds this rank's assignment until every rank
  // has registered, then sizes the group and assigns them all.
  void hold_until_all_registered(int rank, const wire::Register& reg) {
    std::vector<wire::Register> regs;
    std::vector<std::string> ids;
    std::vector<int> counts;
    {
      std::lock_guard<std::mutex> lock(state_mu);
      for (const Slot& s : slots) {
        if (!s.alive) {
          regs.clear();
          break;
        }
        regs.push_back(s.info);
        ids.push_back(s.identity);
        counts.push_back(s.registrations);
      }
    }
    if (regs.empty()) {
      TESSERA_LOG_INFO("worker group: rank {} registered from host {} (pid {}, backend {}, {} MB free of {} MB); "
                       "holding its assignment until all {} rank(s) have registered",
                       rank, reg.host, reg.pid, reg.backend, reg.free_memory_bytes / 1000000,
                       reg.total_memory_bytes / 1000000, slots.size());
      return;
    }
    Status st = opts.on_all_registered(regs);
    if (!st.is_ok()) {
      TESSERA_LOG_ERROR("worker group: cannot assign the ranks: {}", st.to_string());
      {
        std::lock_guard<std::mutex> lock(state_mu);
        group_error = st;
      }
      for (size_t r = 0; r < ids.size(); ++r) {
        wire::encode(wire::Reject{st.message()}, &send_buf);
        send_to(ids[r], send_buf);
        std::lock_guard<std::mutex> lock(state_mu);
        mark_dead_locked(static_cast<int>(r), "refused: " + st.message());
      }
      state_cv.notify_all();
      return;
    }
    all_registered_once = true;
    for (size_t r = 0; r < ids.size(); ++r) assign(static_cast<int>(r), ids[r], regs[r], counts[r]);
  }

  // Builds and sends one rank's assignment (then rank 0's collective id, if it has one).
  void assign(int rank, const std::string& identity, const wire::Register& reg, int registrations) {
    const int world = static_cast<int>(slots.size());
    StatusOr<wire::Assignment> made = factory ? factory(rank, reg) : StatusOr<wire::Assignment>(wire::Assignment{});
    if (!made.is_ok()) {
      TESSERA_LOG_ERROR("worker group: refusing rank {} (host {}, pid {}): {}", rank, reg.host, reg.pid,
                        made.status().message());
      wire::encode(wire::Reject{made.status().message()}, &send_buf);
      send_to(identity, send_buf);
      std::lock_guard<std::mutex> lock(state_mu);
      mark_dead_locked(rank, "refused: " + made.status().message());
      return;
    }
    wire::Assignment a = std::move(made).value();
    a.rank = rank;
    a.world_size = world;
    TESSERA_LOG_INFO("worker group: rank {} registered from host {} (pid {}, backend {}){}; sending assignment", rank,
                     reg.host, reg.pid, reg.backend,
                     registrations > 1 ? " - re-registration #" + std::to_string(registrations - 1) : "");
    wire::encode(a, &send_buf);
    if (!send_to(identity, send_buf)) return on_dead(rank, "unreachable when sending its assignment");
    std::vector<std::pair<int, std::string>> blobs;
    {
      std::lock_guard<std::mutex> lock(state_mu);
      slots[rank].assigned = true;
      for (const auto& b : collective_blobs)
        if (b.first != rank) blobs.push_back(b);
    }
    // Joined after other ranks published: it waits for these.
    for (const auto& [origin, blob] : blobs) {
      wire::encode(wire::CollectiveId{origin, blob}, &send_buf);
      if (!send_to(identity, send_buf)) return on_dead(rank, "unreachable when sending the collective bootstrap");
    }
  }

  // A rank published a bootstrap blob of the collective group (rank 0's NCCL unique id, a
  // rank's Gloo addresses): every other rank gets it, now or when it registers.
  void on_collective_id(int rank, const zmq::message_t& msg) {
    wire::CollectiveId cid;
    Status st = wire::decode(view(msg), &cid);
    if (!st.is_ok() || cid.origin_rank != rank) {
      TESSERA_LOG_WARN("worker group: ignoring a collective bootstrap blob from rank {}: {}", rank,
                       st.is_ok() ? "it names rank " + std::to_string(cid.origin_rank) + " as its origin" : st.to_string());
      return;
    }
    std::vector<std::pair<int, std::string>> targets;
    {
      std::lock_guard<std::mutex> lock(state_mu);
      collective_blobs.emplace_back(rank, cid.blob);
      for (size_t r = 0; r < slots.size(); ++r)
        if (static_cast<int>(r) != rank && slots[r].alive) targets.emplace_back(static_cast<int>(r), slots[r].identity);
    }
    TESSERA_LOG_DEBUG("worker group: relaying rank {}'s collective bootstrap ({} bytes) to {} rank(s)", rank,
                      cid.blob.size(), targets.size());
    wire::encode(wire::CollectiveId{rank, cid.blob}, &send_buf);
    for (auto& [r, identity] : targets)
      if (!send_to(identity, send_buf)) on_dead(r, "unreachable when sending the collective bootstrap");
  }

  void on_worker_message(const std::string& identity, zmq::message_t& msg) {
    StatusOr<wire::Header> header = wire::decode_header(view(msg));
    if (header.is_ok() && header->type == wire::MessageType::kRegister) return on_register(identity, msg);
    int rank = -1;
    {
      std::lock_guard<std::mutex> lock(state_mu);
      auto it = by_identity.find(identity);
      if (it != by_identity.end()) {
        rank = it->second;
        slots[rank].last_heard = Clock::now();
      }
    }
    if (rank < 0) {
      if (header.is_ok() && header->type == wire::MessageType::kReady && late_setup_failure(identity, msg)) return;
      return reject(identity, "unknown peer (never registered, or declared dead): register again");
    }
    if (!header.is_ok()) {
      TESSERA_LOG_WARN("worker group: unreadable message from rank {}: {}", rank, header.status().to_string());
      return;
    }
    switch (header->type) {
      case wire::MessageType::kHeartbeat:
        break;
      case wire::MessageType::kStepResult:
        on_step_result(rank, msg);
        break;
      case wire::MessageType::kCollectiveId:
        on_collective_id(rank, msg);
        break;
      case wire::MessageType::kReady: {
        wire::Ready ready;
        Status st = wire::decode(view(msg), &ready);
        std::lock_guard<std::mutex> lock(state_mu);
        Slot& s = slots[rank];
        if (st.is_ok() && ready.ok) {
          s.ready = true;
          s.error.clear();
          TESSERA_LOG_INFO("worker group: rank {} ready", rank);
        } else {
          s.setup_failed = true;
          s.error = st.is_ok() ? ready.error : st.to_string();
          TESSERA_LOG_ERROR("worker group: rank {} setup failed: {}", rank, s.error);
        }
        state_cv.notify_all();
        break;
      }
      default:
        TESSERA_LOG_WARN("worker group: unexpected {} message from rank {}", wire::message_type_name(header->type),
                         rank);
    }
  }

  // A rank that failed its setup and left at once can be declared dead first (a send to it
  // found it gone) and its report read after: it is still why the group cannot start, so it
  // is kept (wait_until_ready then stops on it instead of waiting for a rank that will not come).
  bool late_setup_failure(const std::string& identity, const zmq::message_t& msg) {
    wire::Ready ready;
    if (!wire::decode(view(msg), &ready).is_ok() || ready.ok) return false;
    std::lock_guard<std::mutex> lock(state_mu);
    for (size_t r = 0; r < slots.size(); ++r) {
      Slot& s = slots[r];
      if (s.alive || s.setup_failed || s.dead_identity.empty() || s.dead_identity != identity) continue;
      s.setup_failed = true;
      s.error = "setup failed: " + ready.error + "; then " + s.error;
      TESSERA_LOG_ERROR("worker group: rank {} setup failed (read after it was declared dead): {}", r, ready.error);
      state_cv.notify_all();
      return true;
    }
    return false;
  }

  void send_heartbeats() {
    wire::Heartbeat hb;
    hb.sender = -1;
    hb.seq = hb_seq++;
    hb.time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
    wire::encode(hb, &send_buf);
    std::vector<std::pair<int, std::string>> targets;
    {
      std::lock_guard<std::mutex> lock(state_mu);
      for (size_t r = 0; r < slots.size(); ++r)
        if (slots[r].alive) targets.emplace_back(static_cast<int>(r), slots[r].identity);
    }
    for (auto& [rank, identity] : targets)
      if (!send_to(identity, send_buf)) on_dead(rank, "unreachable (connection closed)");
  }

  void check_liveness(Clock::time_point now) {
    const auto limit = opts.heartbeat_misses * opts.heartbeat_interval;
    std::vector<std::pair<int, std::string>> dead;
    {
      std::lock_guard<std::mutex> lock(state_mu);
      for (size_t r = 0; r < slots.size(); ++r) {
        Slot& s = slots[r];
        if (!s.alive || now - s.last_heard <= limit) continue;
        s.silent = true;
        dead.emplace_back(static_cast<int>(r), "no heartbeat for " + std::to_string(ms_between(s.last_heard, now)) +
                                                     " ms (limit: " + std::to_string(opts.heartbeat_misses) +
                                                     " intervals of " +
                                                     std::to_string(opts.heartbeat_interval.count()) + " ms)");
      }
    }
    for (auto& [rank, why] : dead) on_dead(rank, why);
  }

  Clock::duration tick() const {
    return std::clamp(opts.heartbeat_interval / 8, std::chrono::milliseconds(1), std::chrono::milliseconds(20));
  }

  // Under sock_mu: waits up to `timeout` for worker messages, handles all that arrived,
  // sends heartbeats when due, declares silent ranks dead.
  void service(Clock::duration timeout) {
    zmq::pollitem_t item{router->handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
    if (item.revents & ZMQ_POLLIN) {
      for (;;) {
        zmq::message_t identity, payload;
        if (!router->recv(identity, zmq::recv_flags::dontwait)) break;
        bool complete_frames = identity.more() && router->recv(payload, zmq::recv_flags::none).has_value();
        while (payload.more()) {  // drain and ignore any extra frames
          zmq::message_t extra;
          if (!router->recv(extra, zmq::recv_flags::none)) break;
          complete_frames = false;
          payload = std::move(extra);
        }
        if (complete_frames) on_worker_message(identity.to_string(), payload);
      }
    }
    const Clock::time_point now = Clock::now();
    if (now >= next_hb) {
      send_heartbeats();
      next_hb = now + opts.heartbeat_interval;
    }
    check_liveness(now);
  }

  // Housekeeping thread: serves the socket whenever no step holds it.
  void run() {
    // Never blocks in poll while holding the socket, so execute() gets it at once; worker
    // messages outside steps are therefore handled within one tick (<= 20 ms).
    while (!stop.load(std::memory_order_relaxed)) {
      {
        std::lock_guard<std::mutex> lock(sock_mu);
        service(Clock::duration(0));
      }
      std::this_thread::sleep_for(tick());
    }
  }

  void say_goodbye() {
    std::lock_guard<std::mutex> sock(sock_mu);
    wire::encode(wire::Shutdown{stop_reason}, &send_buf);
    std::lock_guard<std::mutex> lock(state_mu);
    for (Slot& s : slots) {
      if (s.alive) send_to(s.identity, send_buf);
      s.alive = false;
      s.ready = false;
      if (s.error.empty()) s.error = "group shut down";
    }
    state_cv.notify_all();
  }
};

WorkerGroup::WorkerGroup() : impl_(std::make_unique<Impl>()) {}

WorkerGroup::~WorkerGroup() { shutdown(); }

Status WorkerGroup::start(const WorkerGroupOptions& options, AssignmentFactory factory) {
  Impl& d = *impl_;
  std::lock_guard<std::mutex> lock(d.exec_mu);
  if (d.started) return invalid_argument("worker group already started");
  if (options.world_size < 1)
    return invalid_argument("worker group world_size must be >= 1, got " + std::to_string(options.world_size));
  if (options.heartbeat_interval.count() < 1) return invalid_argument("heartbeat_interval must be >= 1 ms");
  if (options.heartbeat_misses < 1)
    return invalid_argument("heartbeat_misses must be >= 1, got " + std::to_string(options.heartbeat_misses));
  const bool curve = !options.curve_server_secret_key.empty() || !options.curve_server_public_key.empty();
  if (curve && !zmq_has("curve")) return unimplemented("CURVE keys given but libzmq was built without CURVE");
  if (!curve && !options.curve_allowed_client_keys.empty())
    return invalid_argument("allowed CURVE client keys given without CURVE server keys");
  d.opts = options;
  if (curve && !options.curve_allowed_client_keys.empty()) {
    TESSERA_RETURN_IF_ERROR(d.authenticator.start(d.ctx.handle(), options.curve_allowed_client_keys, "worker group"));
  }
  d.factory = std::move(factory);
  d.slots.assign(options.world_size, Slot{});
  try {
    d.router = std::make_unique<zmq::socket_t>(d.ctx, zmq::socket_type::router);
    d.router->set(zmq::sockopt::linger, 0);
    d.router->set(zmq::sockopt::router_mandatory, 1);
    d.router->set(zmq::sockopt::sndhwm, 0);
    d.router->set(zmq::sockopt::rcvhwm, 0);
    if (curve) {
      d.router->set(zmq::sockopt::curve_server, 1);
      d.router->set(zmq::sockopt::curve_secretkey, options.curve_server_secret_key);
      d.router->set(zmq::sockopt::zap_domain, "tessera-control");
    }
    d.router->bind(options.bind_address);
    d.endpoint = d.router->get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    d.router.reset();
    d.authenticator.stop();
    return invalid_argument("worker group cannot bind '" + options.bind_address + "': " + e.what());
  }
  d.started = true;
  d.io = std::thread([&d] { d.run(); });
  TESSERA_LOG_INFO("worker group: listening on {} for {} rank(s), heartbeat every {} ms{}", d.endpoint,
                   options.world_size, options.heartbeat_interval.count(),
                   !curve ? ""
                   : options.curve_allowed_client_keys.empty()
                       ? ", CURVE on (any worker holding the server key)"
                       : ", CURVE on (" + std::to_string(options.curve_allowed_client_keys.size()) + " allowed worker key(s))");
  return Status::ok();
}

std::string WorkerGroup::endpoint() const { return impl_->endpoint; }

bool WorkerGroup::is_complete() const {
  std::lock_guard<std::mutex> lock(impl_->state_mu);
  return !impl_->slots.empty() && impl_->complete_locked();
}

Status WorkerGroup::wait_until_ready(std::chrono::milliseconds timeout) {
  Impl& d = *impl_;
  std::unique_lock<std::mutex> lock(d.state_mu);
  if (d.slots.empty()) return unavailable("worker group not started");
  auto failed = [&] {
    return std::any_of(d.slots.begin(), d.slots.end(), [](const Slot& s) { return s.setup_failed; });
  };
  d.state_cv.wait_for(lock, timeout,
                      [&] { return d.complete_locked() || failed() || !d.group_error.is_ok() || d.stop.load(); });
  if (d.complete_locked()) return Status::ok();
  if (!d.group_error.is_ok()) return d.group_error;
  return unavailable(d.describe_incomplete_locked(Clock::now()));
}

StatusOr<StepResult> WorkerGroup::execute(const StepPlan& plan) {
  Impl& d = *impl_;
  std::lock_guard<std::mutex> lock(d.exec_mu);
  if (!d.started || d.stopped) return unavailable("worker group is not running");
  {
    std::lock_guard<std::mutex> state(d.state_mu);
    if (!d.complete_locked())
      return unavailable("refusing step " + std::to_string(plan.step_id) + ": " +
                         d.describe_incomplete_locked(Clock::now()));
  }
  wire::encode(plan, &d.plan_buf);
  std::lock_guard<std::mutex> sock(d.sock_mu);
  d.start_step(plan.step_id, d.plan_buf);
  while (d.step_active) {
    if (d.stop.load()) {
      d.finish_step(unavailable("worker group shut down during step " + std::to_string(plan.step_id)));
      break;
    }
    d.service(d.tick());
  }
  if (!d.outcome_status.is_ok()) return d.outcome_status;
  StepResult result;
  std::swap(result, d.rank0_result);
  return result;
}

uint64_t WorkerGroup::kv_cache_epoch() const {
  // Every (re)registration brings a rank with an empty KV cache.
  const Impl& d = *impl_;
  std::lock_guard<std::mutex> lock(d.state_mu);
  uint64_t epoch = 0;
  for (const Slot& s : d.slots) epoch += static_cast<uint64_t>(s.registrations);
  return epoch;
}

std::string WorkerGroup::collectives() const {
  const Impl& d = *impl_;
  std::lock_guard<std::mutex> lock(d.state_mu);
  if (d.slots.size() == 1) return "loopback";
  const std::string prefix = "collectives:";
  for (const auto& [origin, blob] : d.collective_blobs)
    if (origin == 0 && blob.compare(0, prefix.size(), prefix) == 0) return blob.substr(prefix.size());
  return "";
}

std::vector<RankStatus> WorkerGroup::status() const {
  const Impl& d = *impl_;
  std::lock_guard<std::mutex> lock(d.state_mu);
  const auto now = Clock::now();
  std::vector<RankStatus> out;
  for (size_t r = 0; r < d.slots.size(); ++r) {
    const Slot& s = d.slots[r];
    RankStatus st;
    st.rank = static_cast<int>(r);
    st.registered = s.registered;
    st.alive = s.alive;
    st.ready = s.alive && s.ready;
    st.registrations = s.registrations;
    st.host = s.info.host;
    st.pid = s.info.pid;
    st.error = s.error;
    st.silent = !s.alive && s.silent;
    st.ms_since_heard = s.registered ? ms_between(s.last_heard, now) : -1;
    out.push_back(std::move(st));
  }
  return out;
}

uint64_t WorkerGroup::refused_handshakes() const { return impl_->authenticator.refused(); }

void WorkerGroup::shutdown(const std::string& reason) {
  Impl& d = *impl_;
  if (!d.started) return;
  if (!d.stop_requested.exchange(true)) {
    d.stop_reason = reason;
    d.stop.store(true);
  }
  std::lock_guard<std::mutex> lock(d.exec_mu);
  if (d.stopped) return;
  d.stopped = true;
  if (d.io.joinable()) d.io.join();
  d.say_goodbye();
  d.router.reset();
  d.authenticator.stop();
  TESSERA_LOG_INFO("worker group: shut down ({})", reason);
}

}  // namespace tessera
