#include "worker/worker_link.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "common/logging.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

Status link_unavailable(std::string msg) { return Status(StatusCode::kUnavailable, std::move(msg)); }

std::string_view view(const zmq::message_t& m) { return {static_cast<const char*>(m.data()), m.size()}; }

std::string local_host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

std::string rank_tag(int rank) { return "rank " + std::to_string(rank); }

}  // namespace

struct WorkerLink::Impl {
  std::atomic<bool> stop{false};
  std::atomic<bool> silently{false};

  // The collective group's bootstrap (share_collective_id, publish_collective_blob): the
  // blobs the coordinator relayed from the other ranks in this session, by origin rank (set
  // by the socket's reader, cleared when an Assignment arrives: blobs that came before it
  // belong to an earlier group), and how this rank sends its own (set while run() is running).
  std::mutex id_mu;
  std::condition_variable id_cv;
  std::vector<std::pair<int, std::string>> relayed;
  bool running = false;
  std::function<void(const std::string& frame)> send_frame;
};

// One run(). The DEALER is used by whichever thread holds sock_mu_: the run() thread while
// it waits for work, the housekeeping thread while the run() thread is in setup or a step
// (so heartbeats keep flowing). No thread hop on the step path.
//
// Members by owner: `options_`, `tag_` and the timing constants are fixed; everything under
// "guarded by sock_mu_" is touched only with it held, by either thread; plan_, result_ and
// out_ belong to the run() thread alone.
class WorkerLink::Session {
 public:
  explicit Session(WorkerLink& link)
      : options_(link.options_),
        shared_(*link.impl_),
        steps_served_(link.steps_served_),
        tag_(rank_tag(options_.rank)),
        interval_(options_.heartbeat_interval),
        tick_(std::clamp(interval_ / 8, std::chrono::milliseconds(1), std::chrono::milliseconds(20))),
        silence_limit_(interval_ * std::max(1, options_.coordinator_dead_after_intervals)) {}

  Status run(const WorkerSetupFn& setup, const WorkerStepFn& step) {
    if (Status st = connect(); !st.is_ok()) return st;
    last_heard_ = Clock::now();
    next_heartbeat_ = last_heard_ + interval_;
    send_register();
    open_collective_id_channel();
    std::thread housekeeping([this] { keep_house(); });
    serve_work(setup, step);
    housekeeping.join();
    if (monitoring_) zmq_socket_monitor(dealer_.handle(), nullptr, 0);
    close_collective_id_channel();
    return end_status_;
  }

 private:
  // Socket options, CURVE keys (and the monitor that tells a refused handshake), connect.
  Status connect() {
    const WorkerLinkOptions& o = options_;
    try {
      dealer_.set(zmq::sockopt::linger, 1000);
      dealer_.set(zmq::sockopt::sndhwm, 0);
      dealer_.set(zmq::sockopt::rcvhwm, 0);
      if (!o.curve_server_public_key.empty()) {
        if (Status st = set_up_curve(); !st.is_ok()) return st;
      }
      dealer_.connect(o.coordinator_address);
    } catch (const zmq::error_t& e) {
      return invalid_argument(tag_ + ": cannot connect to coordinator '" + o.coordinator_address + "': " + e.what());
    }
    return Status::ok();
  }

  Status set_up_curve() {
    const WorkerLinkOptions& o = options_;
    if (!zmq_has("curve")) return unimplemented("CURVE key given but libzmq was built without CURVE");
    std::string pub = o.curve_public_key, sec = o.curve_secret_key;
    if (pub.empty() || sec.empty()) {
      char p[41] = {}, k[41] = {};
      if (zmq_curve_keypair(p, k) != 0) return internal_error("zmq_curve_keypair failed");
      pub = p;
      sec = k;
    }
    dealer_.set(zmq::sockopt::curve_serverkey, o.curve_server_public_key);
    dealer_.set(zmq::sockopt::curve_publickey, pub);
    dealer_.set(zmq::sockopt::curve_secretkey, sec);
    client_public_key_ = pub;
    // The monitor tells a refused handshake (the coordinator's allowed-key list) at once
    // instead of after register_timeout.
    const std::string monitor_address = "inproc://tessera-link-monitor";
    if (zmq_socket_monitor(dealer_.handle(), monitor_address.c_str(), ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) == 0) {
      monitor_.connect(monitor_address);
      monitoring_ = true;
    }
    return Status::ok();
  }

  // Before the housekeeping thread starts: no lock needed yet.
  void send_register() {
    const WorkerLinkOptions& o = options_;
    wire::Register reg;
    reg.protocol_version = o.protocol_version;
    reg.rank = o.rank;
    reg.world_size = o.world_size;
    reg.host = o.host;
    reg.backend = o.backend;
    reg.free_memory_bytes = o.free_memory_bytes;
    reg.total_memory_bytes = o.total_memory_bytes;
    reg.pid = static_cast<int64_t>(getpid());
    wire::encode(reg, &buf_);
    buf_[4] = static_cast<char>(o.protocol_version & 0xff);  // header version (tests override it)
    buf_[5] = static_cast<char>(o.protocol_version >> 8);
    dealer_.send(zmq::buffer(buf_), zmq::send_flags::none);
    TESSERA_LOG_INFO("{}: registering with coordinator at {} (world size {})", tag_, o.coordinator_address,
                     o.world_size);
  }

  // share_collective_id() may send through this session from now until it is closed.
  void open_collective_id_channel() {
    std::lock_guard<std::mutex> id_lock(shared_.id_mu);
    shared_.running = true;
    shared_.relayed.clear();
    shared_.send_frame = [this](const std::string& frame) {
      std::lock_guard<std::mutex> sock_lock(sock_mu_);
      if (!over_) dealer_.send(zmq::buffer(frame), zmq::send_flags::none);
    };
  }

  void close_collective_id_channel() {
    std::lock_guard<std::mutex> id_lock(shared_.id_mu);
    shared_.running = false;
    shared_.send_frame = nullptr;
    shared_.id_cv.notify_all();
  }

  // The housekeeping thread: serves the socket whenever the run() thread is not holding it.
  void keep_house() {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(sock_mu_);
        if (over_) return;
        service(Clock::duration(0));
        if (over_) return;
      }
      std::this_thread::sleep_for(tick_);
    }
  }

  // The step loop, on the run() thread: serves the socket until work comes, then lets the
  // housekeeping thread have it while setup or the step runs, and sends the reply.
  void serve_work(const WorkerSetupFn& setup, const WorkerStepFn& step) {
    Status setup_status;
    std::unique_lock<std::mutex> lock(sock_mu_);
    for (;;) {
      while (work_.empty() && !over_) service(tick_);
      if (over_) break;
      zmq::message_t msg = std::move(work_.front());
      work_.pop_front();
      lock.unlock();
      StatusOr<wire::Header> h = wire::decode_header(view(msg));
      bool leaving = false;
      if (h->type == wire::MessageType::kAssignment) {
        setup_status = run_setup(msg, setup);
      } else {
        leaving = run_step(msg, step);
      }
      lock.lock();
      if (over_) break;  // stopped (maybe silently) meanwhile: say nothing
      dealer_.send(zmq::buffer(out_), zmq::send_flags::none);
      if (!setup_status.is_ok()) end_session(setup_status, false);
      // Only once the reply saying so is queued (the housekeeping thread would otherwise end
      // the session first, and the reply with it); the close lingers until it is sent.
      if (leaving) shared_.stop.store(true);
    }
  }

  // Encodes the Ready reply into out_; returns setup's error, which ends the session once
  // the reply is sent.
  Status run_setup(const zmq::message_t& msg, const WorkerSetupFn& setup) {
    wire::Assignment a;
    Status st = wire::decode(view(msg), &a);
    if (st.is_ok()) st = setup ? setup(a) : Status::ok();
    wire::encode(wire::Ready{options_.rank, st.is_ok(), st.is_ok() ? "" : st.to_string()}, &out_);
    if (!st.is_ok()) {
      TESSERA_LOG_ERROR("{}: setup failed: {}", tag_, st.to_string());
      return st;
    }
    TESSERA_LOG_INFO("{}: setup done, ready", tag_);
    return Status::ok();
  }

  // Encodes the StepResult reply into out_; a step's error goes to the coordinator in it.
  // Returns whether this rank leaves after replying.
  bool run_step(const zmq::message_t& msg, const WorkerStepFn& step) {
    Status st = wire::decode(view(msg), &plan_);
    result_.tokens.clear();
    result_.error.clear();
    result_.leaving = false;
    if (!st.is_ok()) {
      result_.step_id = 0;
      result_.error = tag_ + ": " + st.to_string();
    } else {
      StatusOr<StepResult> r = step(plan_);
      if (r.is_ok()) {
        result_ = std::move(r).value();
        if (options_.rank != 0) result_.tokens.clear();  // only rank 0's tokens matter
      } else {
        result_.error = tag_ + ": " + r.status().to_string();
        // A step that failed Unavailable broke the group's collective: this rank leaves, and
        // says so in the reply so that the coordinator need not wait for heartbeats to tell.
        result_.leaving = r.status().code() == StatusCode::kUnavailable;
      }
      result_.step_id = plan_.step_id;
    }
    wire::encode(result_, &out_);
    steps_served_.fetch_add(1);
    return result_.leaving;
  }

  // Under sock_mu_: waits up to `timeout` for the socket, reads what came, heartbeats when
  // due and ends the session on stop(), a refused handshake, Shutdown, Reject or silence.
  void service(Clock::duration timeout) {
    if (shared_.stop.load()) {
      TESSERA_LOG_INFO("{}: link stopped{}", tag_, shared_.silently.load() ? " silently" : "");
      return end_session(Status::ok(), shared_.silently.load());
    }
    zmq::pollitem_t items[2] = {{dealer_.handle(), 0, ZMQ_POLLIN, 0}, {monitor_.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, monitoring_ ? 2 : 1, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
    if (monitoring_ && (items[1].revents & ZMQ_POLLIN)) {
      read_monitor_event();
      if (over_) return;
    }
    if (items[0].revents & ZMQ_POLLIN) {
      read_messages();
      if (over_) return;
    }
    const Clock::time_point now = Clock::now();
    send_heartbeat_if_due(now);
    check_coordinator_heard(now);
  }

  // A failed CURVE handshake before the Assignment: the coordinator does not allow our key.
  void read_monitor_event() {
    zmq::message_t event, endpoint;
    if (monitor_.recv(event, zmq::recv_flags::dontwait) && event.more()) (void)monitor_.recv(endpoint);
    uint32_t value = 0;
    if (event.size() >= 6) std::memcpy(&value, static_cast<const char*>(event.data()) + 2, 4);
    if (assigned_) return;
    const std::string msg = tag_ + ": the coordinator at " + options_.coordinator_address +
                            " refused this worker's CURVE key " + client_public_key_ + " (ZAP status " +
                            std::to_string(value) +
                            "): it is not in the coordinator's server.curve.allowed_client_keys_file";
    TESSERA_LOG_ERROR("{}", msg);
    end_session(Status(StatusCode::kInvalidArgument, msg), true);
  }

  // Drains the socket; stops early when a message ends the session.
  void read_messages() {
    while (!over_) {
      zmq::message_t msg;
      if (!dealer_.recv(msg, zmq::recv_flags::dontwait)) break;
      last_heard_ = Clock::now();
      handle_message(std::move(msg));
    }
  }

  void handle_message(zmq::message_t msg) {
    StatusOr<wire::Header> h = wire::decode_header(view(msg));
    if (!h.is_ok()) {
      TESSERA_LOG_WARN("{}: unreadable message from coordinator: {}", tag_, h.status().to_string());
      return;
    }
    switch (h->type) {
      case wire::MessageType::kHeartbeat:
        break;
      case wire::MessageType::kAssignment: {
        assigned_ = true;
        std::lock_guard<std::mutex> id_lock(shared_.id_mu);
        shared_.relayed.clear();
      }
        [[fallthrough]];
      case wire::MessageType::kStepPlan:
        work_.push_back(std::move(msg));
        break;
      case wire::MessageType::kCollectiveId:
        take_collective_id(msg);
        break;
      case wire::MessageType::kShutdown: {
        wire::Shutdown sd;
        (void)wire::decode(view(msg), &sd);
        TESSERA_LOG_INFO("{}: coordinator asked to shut down: {}", tag_, sd.reason);
        end_session(Status::ok(), false);
        break;
      }
      case wire::MessageType::kReject: {
        wire::Reject r;
        Status st = wire::decode(view(msg), &r);
        const std::string reason = st.is_ok() ? r.reason : st.to_string();
        TESSERA_LOG_ERROR("{}: coordinator rejected this worker: {}", tag_, reason);
        end_session(invalid_argument(tag_ + ": coordinator rejected this worker: " + reason), true);
        break;
      }
      default:
        TESSERA_LOG_WARN("{}: unexpected {} message from coordinator", tag_, wire::message_type_name(h->type));
    }
  }

  void take_collective_id(const zmq::message_t& msg) {
    wire::CollectiveId cid;
    if (Status st = wire::decode(view(msg), &cid); !st.is_ok()) {
      TESSERA_LOG_WARN("{}: unreadable collective id from coordinator: {}", tag_, st.to_string());
      return;
    }
    std::lock_guard<std::mutex> id_lock(shared_.id_mu);
    shared_.relayed.emplace_back(cid.origin_rank, std::move(cid.blob));
    shared_.id_cv.notify_all();
  }

  void send_heartbeat_if_due(Clock::time_point now) {
    if (now < next_heartbeat_) return;
    wire::Heartbeat hb;
    hb.sender = options_.rank;
    hb.seq = heartbeat_seq_++;
    hb.time_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    wire::encode(hb, &buf_);
    dealer_.send(zmq::buffer(buf_), zmq::send_flags::dontwait);
    next_heartbeat_ = now + interval_;
  }

  // Not assigned yet: waiting is fine while the coordinator is heard from (it holds every
  // assignment until all ranks have registered when it sizes the KV pool from their
  // reports, and heartbeats the waiting ones); silence for register_timeout is an error.
  // Assigned: silence for silence_limit_ means the coordinator is gone.
  void check_coordinator_heard(Clock::time_point now) {
    const WorkerLinkOptions& o = options_;
    if (!assigned_ && now - last_heard_ > o.register_timeout) {
      const std::string msg = tag_ + ": no assignment from coordinator at " + o.coordinator_address + " within " +
                              std::to_string(o.register_timeout.count()) + " ms" +
                              (o.curve_server_public_key.empty()
                                   ? ""
                                   : " (CURVE is on: a wrong server public key looks like this too)");
      TESSERA_LOG_ERROR("{}", msg);
      return end_session(link_unavailable(msg), true);
    }
    if (assigned_ && now - last_heard_ > silence_limit_) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_heard_).count();
      const std::string msg = tag_ + ": coordinator at " + o.coordinator_address + " silent for " +
                              std::to_string(ms) + " ms (" + std::to_string(o.coordinator_dead_after_intervals) +
                              " heartbeat intervals); presuming it dead, leaving";
      TESSERA_LOG_ERROR("{}", msg);
      return end_session(link_unavailable(msg), true);
    }
  }

  // The first end wins; `abrupt` drops unsent messages (linger 0).
  void end_session(Status st, bool abrupt) {
    if (over_) return;
    over_ = true;
    end_status_ = std::move(st);
    if (abrupt) dealer_.set(zmq::sockopt::linger, 0);
  }

  const WorkerLinkOptions& options_;
  Impl& shared_;
  std::atomic<uint64_t>& steps_served_;
  const std::string tag_;
  const std::chrono::milliseconds interval_;
  const std::chrono::milliseconds tick_;
  const std::chrono::milliseconds silence_limit_;

  zmq::context_t ctx_{1};
  zmq::socket_t dealer_{ctx_, zmq::socket_type::dealer};
  zmq::socket_t monitor_{ctx_, zmq::socket_type::pair};
  bool monitoring_ = false;          // set in connect(), read-only after
  std::string client_public_key_;    // set in connect(), read-only after

  std::mutex sock_mu_;
  // Guarded by sock_mu_ (once the housekeeping thread runs):
  std::deque<zmq::message_t> work_;  // Assignment / StepPlan frames not yet handled
  bool over_ = false;
  Status end_status_;
  std::string buf_;                  // Register / Heartbeat encoding
  Clock::time_point last_heard_;
  Clock::time_point next_heartbeat_;
  bool assigned_ = false;
  uint64_t heartbeat_seq_ = 0;

  // The run() thread's alone (used while sock_mu_ is released).
  StepPlan plan_;
  StepResult result_;
  std::string out_;
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
  if (options_.heartbeat_interval.count() < 1) return invalid_argument("heartbeat_interval must be >= 1 ms");
  Session session(*this);
  return session.run(setup, step);
}

StatusOr<std::string> WorkerLink::share_collective_id(const std::string& rank0_id, std::chrono::milliseconds timeout) {
  // Tagged: rank 0 publishes other blobs on the same channel (its choice of collectives, ...).
  const std::string tag = "collective-id:";
  if (options_.rank == 0) {
    if (rank0_id.empty()) return invalid_argument(rank_tag(0) + ": rank 0 must supply the collective id");
    TESSERA_RETURN_IF_ERROR(publish_collective_blob(tag + rank0_id));
    return rank0_id;
  }
  StatusOr<std::string> id = wait_collective_blob(
      0, [&](const std::string& b) { return b.compare(0, tag.size(), tag) == 0; }, timeout);
  if (!id.is_ok())
    return link_unavailable(rank_tag(options_.rank) + ": no collective id from rank 0 (via the coordinator) within " +
                            std::to_string(timeout.count()) + " ms");
  return id->substr(tag.size());
}

Status WorkerLink::publish_collective_blob(const std::string& blob) {
  const std::string tag = rank_tag(options_.rank);
  std::unique_lock<std::mutex> lock(impl_->id_mu);
  if (!impl_->running || !impl_->send_frame) return link_unavailable(tag + ": collective bootstrap outside a link session");
  std::string frame;
  wire::encode(wire::CollectiveId{options_.rank, blob}, &frame);
  // The reader takes id_mu while holding the socket lock: send without holding id_mu. The
  // function stays valid: setup (our only caller) runs inside run().
  auto send = impl_->send_frame;
  lock.unlock();
  send(frame);
  return Status::ok();
}

StatusOr<std::string> WorkerLink::wait_collective_blob(int origin, const std::function<bool(const std::string&)>& match,
                                                       std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(impl_->id_mu);
  if (!impl_->running) return link_unavailable(rank_tag(options_.rank) + ": collective bootstrap outside a link session");
  const std::string* found = nullptr;
  const auto look = [&] {
    for (const auto& [from, blob] : impl_->relayed)
      if ((origin < 0 || from == origin) && match(blob)) {
        found = &blob;
        return true;
      }
    return false;
  };
  const bool got = impl_->id_cv.wait_for(lock, timeout, [&] { return look() || impl_->stop.load() || !impl_->running; });
  if (!got || found == nullptr)
    return link_unavailable(rank_tag(options_.rank) + ": nothing relayed from " +
                            (origin < 0 ? std::string("any rank") : "rank " + std::to_string(origin)) + " within " +
                            std::to_string(timeout.count()) + " ms");
  return *found;
}

}  // namespace tessera
