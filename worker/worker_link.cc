#include "worker/worker_link.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <zmq.hpp>

#include "common/logging.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

Status unavailable(std::string msg) { return Status(StatusCode::kUnavailable, std::move(msg)); }

std::string_view view(const zmq::message_t& m) { return {static_cast<const char*>(m.data()), m.size()}; }

std::string local_host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

struct WorkerLink::Impl {
  std::atomic<bool> stop{false};
  std::atomic<bool> silently{false};

  // share_collective_id(): the id relayed by the coordinator in this session (set by the
  // socket's reader, cleared when an Assignment arrives: an id that came before it belongs
  // to an earlier group), and how rank 0 sends its own (set while run() is running).
  std::mutex id_mu;
  std::condition_variable id_cv;
  std::optional<std::string> collective_id;
  bool running = false;
  std::function<void(const std::string& frame)> send_frame;
};

WorkerLink::WorkerLink(WorkerLinkOptions options) : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  if (options_.host.empty()) options_.host = local_host_name();
}

WorkerLink::~WorkerLink() = default;

void WorkerLink::stop(bool silently) {
  if (silently) impl_->silently.store(true);
  impl_->stop.store(true);
  std::lock_guard<std::mutex> lock(impl_->id_mu);
  impl_->id_cv.notify_all();  // a rank waiting for the collective id gives up
}

Status WorkerLink::run(const WorkerSetupFn& setup, const WorkerStepFn& step) {
  const WorkerLinkOptions& o = options_;
  const std::string tag = "rank " + std::to_string(o.rank);
  if (o.heartbeat_interval.count() < 1) return invalid_argument("heartbeat_interval must be >= 1 ms");
  zmq::context_t ctx(1);
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  // With CURVE, a monitor tells a refused handshake (the coordinator's allowed-key list) at
  // once instead of after register_timeout.
  zmq::socket_t monitor(ctx, zmq::socket_type::pair);
  bool monitoring = false;
  std::string client_public_key;
  try {
    dealer.set(zmq::sockopt::linger, 1000);
    dealer.set(zmq::sockopt::sndhwm, 0);
    dealer.set(zmq::sockopt::rcvhwm, 0);
    if (!o.curve_server_public_key.empty()) {
      if (!zmq_has("curve")) return unimplemented("CURVE key given but libzmq was built without CURVE");
      std::string pub = o.curve_public_key, sec = o.curve_secret_key;
      if (pub.empty() || sec.empty()) {
        char p[41] = {}, k[41] = {};
        if (zmq_curve_keypair(p, k) != 0) return internal_error("zmq_curve_keypair failed");
        pub = p;
        sec = k;
      }
      dealer.set(zmq::sockopt::curve_serverkey, o.curve_server_public_key);
      dealer.set(zmq::sockopt::curve_publickey, pub);
      dealer.set(zmq::sockopt::curve_secretkey, sec);
      client_public_key = pub;
      const std::string monitor_address = "inproc://tessera-link-monitor";
      if (zmq_socket_monitor(dealer.handle(), monitor_address.c_str(), ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) == 0) {
        monitor.connect(monitor_address);
        monitoring = true;
      }
    }
    dealer.connect(o.coordinator_address);
  } catch (const zmq::error_t& e) {
    return invalid_argument(tag + ": cannot connect to coordinator '" + o.coordinator_address + "': " + e.what());
  }

  // The DEALER is used by whichever thread holds sock_mu: this thread while it waits for
  // work, the housekeeping thread while this one runs setup or a step (so heartbeats keep
  // flowing). No thread hop on the step path.
  std::mutex sock_mu;
  std::deque<zmq::message_t> work;  // Assignment / StepPlan frames not yet handled
  bool over = false;
  Status end_status;
  std::string buf;

  const auto interval = o.heartbeat_interval;
  const auto tick = std::clamp(interval / 8, std::chrono::milliseconds(1), std::chrono::milliseconds(20));
  const auto silence_limit = interval * std::max(1, o.coordinator_dead_after_intervals);
  const Clock::time_point started = Clock::now();
  Clock::time_point last_heard = started;
  Clock::time_point next_hb = started + interval;
  bool assigned = false;
  uint64_t hb_seq = 0;

  auto end_session = [&](Status st, bool abrupt) {
    if (over) return;
    over = true;
    end_status = std::move(st);
    if (abrupt) dealer.set(zmq::sockopt::linger, 0);
  };

  // Under sock_mu.
  auto service = [&](Clock::duration timeout) {
    if (impl_->stop.load()) {
      TESSERA_LOG_INFO("{}: link stopped{}", tag, impl_->silently.load() ? " silently" : "");
      return end_session(Status::ok(), impl_->silently.load());
    }
    zmq::pollitem_t items[2] = {{dealer.handle(), 0, ZMQ_POLLIN, 0}, {monitor.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, monitoring ? 2 : 1, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
    if (monitoring && (items[1].revents & ZMQ_POLLIN)) {
      zmq::message_t event, endpoint;
      if (monitor.recv(event, zmq::recv_flags::dontwait) && event.more()) (void)monitor.recv(endpoint);
      uint32_t value = 0;
      if (event.size() >= 6) std::memcpy(&value, static_cast<const char*>(event.data()) + 2, 4);
      if (!assigned) {
        const std::string msg = tag + ": the coordinator at " + o.coordinator_address +
                                " refused this worker's CURVE key " + client_public_key + " (ZAP status " +
                                std::to_string(value) +
                                "): it is not in the coordinator's server.curve.allowed_client_keys_file";
        TESSERA_LOG_ERROR("{}", msg);
        return end_session(Status(StatusCode::kInvalidArgument, msg), true);
      }
    }
    const zmq::pollitem_t& item = items[0];
    if (item.revents & ZMQ_POLLIN) {
      for (;;) {
        zmq::message_t msg;
        if (!dealer.recv(msg, zmq::recv_flags::dontwait)) break;
        last_heard = Clock::now();
        StatusOr<wire::Header> h = wire::decode_header(view(msg));
        if (!h.is_ok()) {
          TESSERA_LOG_WARN("{}: unreadable message from coordinator: {}", tag, h.status().to_string());
          continue;
        }
        switch (h->type) {
          case wire::MessageType::kHeartbeat:
            break;
          case wire::MessageType::kAssignment: {
            assigned = true;
            std::lock_guard<std::mutex> id_lock(impl_->id_mu);
            impl_->collective_id.reset();
          }
            [[fallthrough]];
          case wire::MessageType::kStepPlan:
            work.push_back(std::move(msg));
            break;
          case wire::MessageType::kCollectiveId: {
            wire::CollectiveId cid;
            if (Status st = wire::decode(view(msg), &cid); !st.is_ok()) {
              TESSERA_LOG_WARN("{}: unreadable collective id from coordinator: {}", tag, st.to_string());
              break;
            }
            std::lock_guard<std::mutex> id_lock(impl_->id_mu);
            impl_->collective_id = std::move(cid.blob);
            impl_->id_cv.notify_all();
            break;
          }
          case wire::MessageType::kShutdown: {
            wire::Shutdown sd;
            (void)wire::decode(view(msg), &sd);
            TESSERA_LOG_INFO("{}: coordinator asked to shut down: {}", tag, sd.reason);
            return end_session(Status::ok(), false);
          }
          case wire::MessageType::kReject: {
            wire::Reject r;
            Status st = wire::decode(view(msg), &r);
            const std::string reason = st.is_ok() ? r.reason : st.to_string();
            TESSERA_LOG_ERROR("{}: coordinator rejected this worker: {}", tag, reason);
            return end_session(invalid_argument(tag + ": coordinator rejected this worker: " + reason), true);
          }
          default:
            TESSERA_LOG_WARN("{}: unexpected {} message from coordinator", tag, wire::message_type_name(h->type));
        }
      }
    }
    const Clock::time_point now = Clock::now();
    if (now >= next_hb) {
      wire::Heartbeat hb;
      hb.sender = o.rank;
      hb.seq = hb_seq++;
      hb.time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
      wire::encode(hb, &buf);
      dealer.send(zmq::buffer(buf), zmq::send_flags::dontwait);
      next_hb = now + interval;
    }
    // Not assigned yet: waiting is fine while the coordinator is heard from (it holds every
    // assignment until all ranks have registered when it sizes the KV pool from their
    // reports, and heartbeats the waiting ones); silence for register_timeout is an error.
    if (!assigned && now - last_heard > o.register_timeout) {
      const std::string msg = tag + ": no assignment from coordinator at " + o.coordinator_address + " within " +
                              std::to_string(o.register_timeout.count()) + " ms" +
                              (o.curve_server_public_key.empty()
                                   ? ""
                                   : " (CURVE is on: a wrong server public key looks like this too)");
      TESSERA_LOG_ERROR("{}", msg);
      return end_session(unavailable(msg), true);
    }
    if (assigned && now - last_heard > silence_limit) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_heard).count();
      const std::string msg = tag + ": coordinator at " + o.coordinator_address + " silent for " +
                              std::to_string(ms) + " ms (" + std::to_string(o.coordinator_dead_after_intervals) +
                              " heartbeat intervals); presuming it dead, leaving";
      TESSERA_LOG_ERROR("{}", msg);
      return end_session(unavailable(msg), true);
    }
  };

  {
    wire::Register reg;
    reg.protocol_version = o.protocol_version;
    reg.rank = o.rank;
    reg.world_size = o.world_size;
    reg.host = o.host;
    reg.backend = o.backend;
    reg.free_memory_bytes = o.free_memory_bytes;
    reg.total_memory_bytes = o.total_memory_bytes;
    reg.pid = static_cast<int64_t>(getpid());
    wire::encode(reg, &buf);
    buf[4] = static_cast<char>(o.protocol_version & 0xff);  // header version (tests override it)
    buf[5] = static_cast<char>(o.protocol_version >> 8);
    dealer.send(zmq::buffer(buf), zmq::send_flags::none);
    TESSERA_LOG_INFO("{}: registering with coordinator at {} (world size {})", tag, o.coordinator_address,
                     o.world_size);
  }

  {
    std::lock_guard<std::mutex> id_lock(impl_->id_mu);
    impl_->running = true;
    impl_->collective_id.reset();
    impl_->send_frame = [&](const std::string& frame) {
      std::lock_guard<std::mutex> sock_lock(sock_mu);
      if (!over) dealer.send(zmq::buffer(frame), zmq::send_flags::none);
    };
  }
  std::thread housekeeping([&] {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(sock_mu);
        if (over) return;
        service(Clock::duration(0));
        if (over) return;
      }
      std::this_thread::sleep_for(tick);
    }
  });

  Status setup_status;
  StepPlan plan;
  StepResult result;
  std::string out;
  std::unique_lock<std::mutex> lock(sock_mu);
  for (;;) {
    while (work.empty() && !over) service(tick);
    if (over) break;
    zmq::message_t msg = std::move(work.front());
    work.pop_front();
    lock.unlock();
    StatusOr<wire::Header> h = wire::decode_header(view(msg));
    if (h->type == wire::MessageType::kAssignment) {
      wire::Assignment a;
      Status st = wire::decode(view(msg), &a);
      if (st.is_ok()) st = setup ? setup(a) : Status::ok();
      wire::encode(wire::Ready{o.rank, st.is_ok(), st.is_ok() ? "" : st.to_string()}, &out);
      if (st.is_ok()) {
        TESSERA_LOG_INFO("{}: setup done, ready", tag);
      } else {
        TESSERA_LOG_ERROR("{}: setup failed: {}", tag, st.to_string());
        setup_status = st;
      }
    } else {
      Status st = wire::decode(view(msg), &plan);
      result.tokens.clear();
      result.error.clear();
      if (!st.is_ok()) {
        result.step_id = 0;
        result.error = tag + ": " + st.to_string();
      } else {
        StatusOr<StepResult> r = step(plan);
        if (r.is_ok()) {
          result = std::move(r).value();
          if (o.rank != 0) result.tokens.clear();  // only rank 0's tokens matter
        } else {
          result.error = tag + ": " + r.status().to_string();
        }
        result.step_id = plan.step_id;
      }
      wire::encode(result, &out);
      steps_served_.fetch_add(1);
    }
    lock.lock();
    if (over) break;  // stopped (maybe silently) meanwhile: say nothing
    dealer.send(zmq::buffer(out), zmq::send_flags::none);
    if (!setup_status.is_ok()) end_session(setup_status, false);
  }
  lock.unlock();
  housekeeping.join();
  if (monitoring) zmq_socket_monitor(dealer.handle(), nullptr, 0);
  {
    std::lock_guard<std::mutex> id_lock(impl_->id_mu);
    impl_->running = false;
    impl_->send_frame = nullptr;
    impl_->id_cv.notify_all();
  }
  return end_status;
}

StatusOr<std::string> WorkerLink::share_collective_id(const std::string& rank0_id, std::chrono::milliseconds timeout) {
  const std::string tag = "rank " + std::to_string(options_.rank);
  std::unique_lock<std::mutex> lock(impl_->id_mu);
  if (!impl_->running || !impl_->send_frame) return unavailable(tag + ": collective id outside a link session");
  if (options_.rank == 0) {
    if (rank0_id.empty()) return invalid_argument(tag + ": rank 0 must supply the collective id");
    std::string frame;
    wire::encode(wire::CollectiveId{0, rank0_id}, &frame);
    // The reader takes id_mu while holding the socket lock: send without holding id_mu. The
    // function stays valid: setup (our only caller) runs inside run().
    auto send = impl_->send_frame;
    lock.unlock();
    send(frame);
    return rank0_id;
  }
  const bool got = impl_->id_cv.wait_for(lock, timeout, [&] {
    return impl_->collective_id.has_value() || impl_->stop.load() || !impl_->running;
  });
  if (!got || !impl_->collective_id)
    return unavailable(tag + ": no collective id from rank 0 (via the coordinator) within " +
                       std::to_string(timeout.count()) + " ms");
  return *impl_->collective_id;
}

}  // namespace tessera
