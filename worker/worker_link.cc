#include "worker/worker_link.h"

#include <unistd.h>

#include <algorithm>
#include <mutex>
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

// One-byte control frame from the step thread to the I/O thread: "end the session now".
constexpr char kEndSession = 'X';

}  // namespace

struct WorkerLink::Impl {
  std::atomic<bool> stop{false};
  std::atomic<bool> silently{false};
};

WorkerLink::WorkerLink(WorkerLinkOptions options) : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  if (options_.host.empty()) options_.host = local_host_name();
}

WorkerLink::~WorkerLink() = default;

void WorkerLink::stop(bool silently) {
  if (silently) impl_->silently.store(true);
  impl_->stop.store(true);
}

Status WorkerLink::run(const WorkerSetupFn& setup, const WorkerStepFn& step) {
  const WorkerLinkOptions& o = options_;
  const std::string tag = "rank " + std::to_string(o.rank);
  if (o.heartbeat_interval.count() < 1) return invalid_argument("heartbeat_interval must be >= 1 ms");
  zmq::context_t ctx(1);
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  zmq::socket_t pipe_io(ctx, zmq::socket_type::pair);
  zmq::socket_t pipe_step(ctx, zmq::socket_type::pair);
  try {
    dealer.set(zmq::sockopt::linger, 1000);
    dealer.set(zmq::sockopt::sndhwm, 0);
    dealer.set(zmq::sockopt::rcvhwm, 0);
    if (!o.curve_server_public_key.empty()) {
      if (!zmq_has("curve")) return unimplemented("CURVE key given but libzmq was built without CURVE");
      std::string pub = o.curve_public_key, sec = o.curve_secret_key;
      if (pub.empty() || sec.empty()) {
        char p[41] = {}, s[41] = {};
        if (zmq_curve_keypair(p, s) != 0) return internal_error("zmq_curve_keypair failed");
        pub = p;
        sec = s;
      }
      dealer.set(zmq::sockopt::curve_serverkey, o.curve_server_public_key);
      dealer.set(zmq::sockopt::curve_publickey, pub);
      dealer.set(zmq::sockopt::curve_secretkey, sec);
    }
    dealer.connect(o.coordinator_address);
    const std::string pipe = "inproc://tessera-worker-link-" + std::to_string(reinterpret_cast<uintptr_t>(this));
    pipe_io.bind(pipe);
    pipe_step.connect(pipe);
  } catch (const zmq::error_t& e) {
    return invalid_argument(tag + ": cannot connect to coordinator '" + o.coordinator_address + "': " + e.what());
  }

  std::mutex final_mu;
  Status final_status;

  // ---- I/O thread: owns the DEALER; heartbeats; forwards steps both ways.
  std::thread io([&] {
    auto finish = [&](Status st) {
      {
        std::lock_guard<std::mutex> lock(final_mu);
        final_status = std::move(st);
      }
      pipe_io.send(zmq::const_buffer("", 0), zmq::send_flags::none);
    };
    std::string buf;
    wire::Register reg;
    reg.protocol_version = o.protocol_version;
    reg.rank = o.rank;
    reg.world_size = o.world_size;
    reg.host = o.host;
    reg.backend = o.backend;
    reg.free_memory_bytes = o.free_memory_bytes;
    reg.pid = static_cast<int64_t>(getpid());
    wire::encode(reg, &buf);
    buf[4] = static_cast<char>(o.protocol_version & 0xff);  // header version (tests override it)
    buf[5] = static_cast<char>(o.protocol_version >> 8);
    dealer.send(zmq::buffer(buf), zmq::send_flags::none);
    TESSERA_LOG_INFO("{}: registering with coordinator at {} (world size {})", tag, o.coordinator_address,
                     o.world_size);

    const auto interval = o.heartbeat_interval;
    const auto tick = std::clamp(interval / 8, std::chrono::milliseconds(1), std::chrono::milliseconds(100));
    const auto silence_limit = interval * std::max(1, o.coordinator_dead_after_intervals);
    const Clock::time_point started = Clock::now();
    Clock::time_point last_heard = started;
    Clock::time_point next_hb = started + interval;
    bool assigned = false;
    uint64_t hb_seq = 0;
    zmq::pollitem_t items[] = {{dealer.handle(), 0, ZMQ_POLLIN, 0}, {pipe_io.handle(), 0, ZMQ_POLLIN, 0}};
    for (;;) {
      if (impl_->stop.load()) {
        if (impl_->silently.load()) dealer.set(zmq::sockopt::linger, 0);
        TESSERA_LOG_INFO("{}: link stopped{}", tag, impl_->silently.load() ? " silently" : "");
        return finish(Status::ok());
      }
      Clock::time_point now = Clock::now();
      auto timeout = std::min<Clock::duration>(tick, std::max<Clock::duration>(next_hb - now, Clock::duration(0)));
      zmq::poll(items, 2, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
      if (items[0].revents & ZMQ_POLLIN) {
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
            case wire::MessageType::kAssignment:
              assigned = true;
              [[fallthrough]];
            case wire::MessageType::kStepPlan:
              pipe_io.send(msg, zmq::send_flags::none);
              break;
            case wire::MessageType::kShutdown: {
              wire::Shutdown s;
              (void)wire::decode(view(msg), &s);
              TESSERA_LOG_INFO("{}: coordinator asked to shut down: {}", tag, s.reason);
              return finish(Status::ok());
            }
            case wire::MessageType::kReject: {
              wire::Reject r;
              Status st = wire::decode(view(msg), &r);
              const std::string reason = st.is_ok() ? r.reason : st.to_string();
              TESSERA_LOG_ERROR("{}: coordinator rejected this worker: {}", tag, reason);
              return finish(invalid_argument(tag + ": coordinator rejected this worker: " + reason));
            }
            default:
              TESSERA_LOG_WARN("{}: unexpected {} message from coordinator", tag,
                               wire::message_type_name(h->type));
          }
        }
      }
      if (items[1].revents & ZMQ_POLLIN) {
        for (;;) {
          zmq::message_t out;
          if (!pipe_io.recv(out, zmq::recv_flags::dontwait)) break;
          if (out.size() == 1 && *static_cast<const char*>(out.data()) == kEndSession) return finish(Status::ok());
          dealer.send(out, zmq::send_flags::none);
        }
      }
      now = Clock::now();
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
      if (!assigned && now - started > o.register_timeout) {
        const std::string msg = tag + ": no assignment from coordinator at " + o.coordinator_address + " within " +
                                std::to_string(o.register_timeout.count()) + " ms";
        TESSERA_LOG_ERROR("{}", msg);
        dealer.set(zmq::sockopt::linger, 0);
        return finish(unavailable(msg));
      }
      if (assigned && now - last_heard > silence_limit) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_heard).count();
        const std::string msg = tag + ": coordinator at " + o.coordinator_address + " silent for " +
                                std::to_string(ms) + " ms (" + std::to_string(o.coordinator_dead_after_intervals) +
                                " heartbeat intervals); presuming it dead, leaving";
        TESSERA_LOG_ERROR("{}", msg);
        dealer.set(zmq::sockopt::linger, 0);
        return finish(unavailable(msg));
      }
    }
  });

  // ---- This thread: setup and steps.
  Status setup_status;
  StepPlan plan;
  StepResult result;
  std::string out;
  for (;;) {
    zmq::message_t msg;
    if (!pipe_step.recv(msg, zmq::recv_flags::none) || msg.size() == 0) break;
    StatusOr<wire::Header> h = wire::decode_header(view(msg));
    if (!h.is_ok()) continue;
    if (h->type == wire::MessageType::kAssignment) {
      wire::Assignment a;
      Status st = wire::decode(view(msg), &a);
      if (st.is_ok()) st = setup ? setup(a) : Status::ok();
      wire::Ready ready{o.rank, st.is_ok(), st.is_ok() ? "" : st.to_string()};
      wire::encode(ready, &out);
      pipe_step.send(zmq::buffer(out), zmq::send_flags::none);
      if (!st.is_ok()) {
        TESSERA_LOG_ERROR("{}: setup failed: {}", tag, st.to_string());
        setup_status = st;
        pipe_step.send(zmq::const_buffer(&kEndSession, 1), zmq::send_flags::none);
      } else {
        TESSERA_LOG_INFO("{}: setup done, ready", tag);
      }
      continue;
    }
    if (h->type != wire::MessageType::kStepPlan) continue;
    Status st = wire::decode(view(msg), &plan);
    result.tokens.clear();
    result.error.clear();
    if (!st.is_ok()) {
      result.step_id = h->body_bytes >= 8 ? plan.step_id : 0;
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
    pipe_step.send(zmq::buffer(out), zmq::send_flags::none);
    steps_served_.fetch_add(1);
  }
  io.join();
  if (!setup_status.is_ok()) return setup_status;
  std::lock_guard<std::mutex> lock(final_mu);
  return final_status;
}

}  // namespace tessera
