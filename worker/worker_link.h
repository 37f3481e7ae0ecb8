#pragma once
// The worker's side of the wire protocol: a ZeroMQ DEALER connected to the coordinator's
// ROUTER. WorkerLink::run() registers, receives the Assignment, calls the setup callback
// (load the model there), reports Ready, then serves steps with the step callback until the
// coordinator says Shutdown, goes silent, rejects the worker, or stop() is called.
//
// Generic: no model code. The callbacks run on the thread that called run(), which also
// serves the socket while it waits for work (no thread hop on the step path); a private
// housekeeping thread takes the socket over during setup and steps, so heartbeats keep
// flowing however long they take.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "common/step_plan.h"
#include "common/wire/messages.h"

namespace tessera {

struct WorkerLinkOptions {
  std::string coordinator_address = "tcp://127.0.0.1:5560";
  int rank = 0;
  int world_size = 1;
  std::string host;     // reported in Register (defaults to gethostname())
  std::string backend = "cpu";     // reported in Register: the backend this worker made
  uint64_t free_memory_bytes = 0;  // reported in Register: its device's memory (Backend::memory_info)
  uint64_t total_memory_bytes = 0;
  // Heartbeat period; the coordinator should use the same value.
  std::chrono::milliseconds heartbeat_interval{1000};
  // The coordinator is presumed dead after this many intervals without any message from it.
  int coordinator_dead_after_intervals = 3;
  // How long to wait, after registering, without any word from the coordinator before the
  // Assignment (or a Reject) comes; its heartbeats while it holds the assignment count.
  std::chrono::milliseconds register_timeout{30000};
  // CURVE: the coordinator's public key (Z85); empty = plain TCP. The worker's own keypair
  // is generated when not given. A coordinator whose allowed-key list lacks this worker's
  // public key refuses the handshake: run() then ends at once with InvalidArgument.
  std::string curve_server_public_key;
  std::string curve_public_key;
  std::string curve_secret_key;
  // Protocol version put in the header and Register; tests only (to check rejection).
  uint16_t protocol_version = wire::kProtocolVersion;
};

// Loads the model for the assignment; an error is reported to the coordinator (Ready !ok)
// and ends run() with that error.
using WorkerSetupFn = std::function<Status(const wire::Assignment& assignment)>;
// Runs one step. Rank 0 returns its sampled tokens; other ranks' tokens are not sent. A step
// that fails Unavailable (a collective broke: the group is gone) ends the session: the reply
// says the rank is leaving, and run() returns OK once it is sent.
using WorkerStepFn = std::function<StatusOr<StepResult>(const StepPlan& plan)>;

class WorkerLink {
 public:
  explicit WorkerLink(WorkerLinkOptions options);
  ~WorkerLink();
  WorkerLink(const WorkerLink&) = delete;
  WorkerLink& operator=(const WorkerLink&) = delete;

  // Blocks until the session ends. OK after a Shutdown from the coordinator or stop();
  // Unavailable when the coordinator is unreachable or silent for too long (the caller may
  // call run() again to reconnect); InvalidArgument when the coordinator rejected this
  // worker (wrong version, duplicate rank, ...), with its reason; setup's own error.
  Status run(const WorkerSetupFn& setup, const WorkerStepFn& step);

  // From any thread: makes run() return OK soon. With `silently`, the link closes without
  // a word and stops heartbeating (what a crashed worker looks like to the coordinator).
  void stop(bool silently = false);

  // For the setup callback of a collective group that rank 0 creates (NCCL): rank 0 passes
  // the id it made, which goes to the coordinator and from there to every other rank, and
  // gets it back; other ranks pass "" and wait, at most `timeout`, for rank 0's id (the one
  // relayed after this session's Assignment). Unavailable on timeout or when the link ends.
  StatusOr<std::string> share_collective_id(const std::string& rank0_id, std::chrono::milliseconds timeout);
  // The general form, for groups whose ranks all publish (Gloo's addresses, the shared-memory
  // identity `worker.collectives: auto` compares): `blob` goes to the coordinator and from
  // there to every other rank of this session's group (and to ranks that register later);
  // wait_collective_blob returns the first relayed blob from `origin` (-1: any rank) that
  // `match` accepts, waiting at most `timeout`. Unavailable on timeout or when the link ends.
  Status publish_collective_blob(const std::string& blob);
  StatusOr<std::string> wait_collective_blob(int origin, const std::function<bool(const std::string&)>& match,
                                             std::chrono::milliseconds timeout);

  // Steps served by the current / last run().
  uint64_t steps_served() const { return steps_served_.load(); }

 private:
  struct Impl;     // what outlives one run(): stop flags, the relayed collective id
  class Session;   // one run(): the socket and the state its two threads share
  WorkerLinkOptions options_;
  std::unique_ptr<Impl> impl_;
  std::atomic<uint64_t> steps_served_{0};
};

}  // namespace tessera
