#pragma once
// The coordinator's side of the worker processes: a ZeroMQ ROUTER that workers' DEALERs
// connect to. WorkerGroup takes registrations, hands out assignments, tracks heartbeats and,
// as a StepExecutor, fans every StepPlan out to all ranks and returns rank 0's StepResult.
//
//   WorkerGroup group;
//   group.start({.bind_address = "tcp://127.0.0.1:5560", .world_size = 2}, make_assignment);
//   group.wait_until_ready(std::chrono::seconds(60));
//   Engine engine(config, group);
//
// execute() drives the socket itself while a step is in flight (serving registrations and
// heartbeats too); a housekeeping thread serves it between steps, every tick (interval/8,
// at most 20 ms). The socket is guarded by a mutex, so the step path has no thread hop.
// A rank silent for heartbeat_misses intervals is declared dead: the step in flight fails with
// Unavailable naming it, and execute() refuses steps until the rank registers again (a
// restarted worker with the same rank is re-assigned; the coordinator keeps running).
// execute() may be called from one thread at a time (calls are serialised).
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/step_executor.h"
#include "common/wire/messages.h"

namespace tessera {

struct WorkerGroupOptions {
  // Where the ROUTER binds: "tcp://127.0.0.1:5560", "tcp://127.0.0.1:*" (any free port,
  // see WorkerGroup::endpoint()), "ipc:///tmp/tessera-ctl".
  std::string bind_address = "tcp://127.0.0.1:5560";
  int world_size = 1;
  // Both sides send a heartbeat every interval; a rank silent for heartbeat_misses
  // intervals is dead (the serving cluster takes both from server.heartbeat_ms and
  // server.heartbeat_misses, as the workers do). A rank whose connection closes (its process
  // died) is dead at the next heartbeat, whatever heartbeat_misses says.
  std::chrono::milliseconds heartbeat_interval{1000};
  int heartbeat_misses = 2;
  // CURVE encryption for links that leave the host (Z85 keys, 40 characters; both empty =
  // plain TCP). Workers then need this server public key. See docs/wire.md.
  std::string curve_server_public_key;
  std::string curve_server_secret_key;
  // With CURVE: the worker public keys let in (a ZAP handler refuses any other key during
  // the handshake); empty = any worker holding the server public key.
  std::vector<std::string> curve_allowed_client_keys;
  // When a rank is lost, tell every other live rank to leave too (Shutdown), so that their
  // supervisor restarts them and the collective group (NCCL, shared memory) forms anew with
  // the replacement: a collective cannot take one new member. Off: the others stay (tests of
  // the protocol alone). The serving cluster (coordinator/cluster/cluster.cc) turns it on.
  bool regroup_on_rank_loss = false;
  // When set, no rank gets its assignment until all world_size ranks have registered; then
  // this runs once with every registration (index = rank) before the first assignment is
  // built, so what the assignments hold may depend on every rank (cache.num_blocks auto:
  // the KV pool sized to the smallest rank's memory). An error rejects every waiting rank
  // with its message and ends wait_until_ready() with it. Ranks registering afterwards
  // (restarts) are assigned at once; the factory may refuse them. Called like the factory.
  std::function<Status(const std::vector<wire::Register>& registrations)> on_all_registered;
};

// Builds a rank's Assignment from its registration (model, dtype, KV sizes, bootstrap blob,
// the worker configuration); an error refuses the rank (Reject with the message). The group
// overwrites `rank` and `world_size` with the registered values.
// Called on the group's own threads (with its socket held): keep it quick and thread-safe.
using AssignmentFactory =
    std::function<StatusOr<wire::Assignment>(int rank, const wire::Register& registration)>;

struct RankStatus {
  int rank = 0;
  bool registered = false;  // a worker has registered for this rank (at least once)
  bool alive = false;       // registered and heard from within heartbeat_misses intervals
  bool ready = false;       // alive and its setup succeeded (Ready ok)
  int registrations = 0;    // how many times this rank registered (restarts + 1)
  std::string host;
  int64_t pid = 0;
  std::string error;        // why it is dead or not ready; empty otherwise
  // Dead because it missed server.heartbeat_misses heartbeats (not because its connection
  // closed): its process may still be there, stopped or hung.
  bool silent = false;
  // Since the last message from this rank (heartbeat, reply, ...); -1 when never heard from.
  int64_t ms_since_heard = -1;
};

class WorkerGroup final : public StepExecutor {
 public:
  WorkerGroup();
  ~WorkerGroup() override;  // shutdown()
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Binds and starts the I/O thread; returns at once (registrations are handled in the
  // background). Errors: a bad address or one already in use, invalid options.
  Status start(const WorkerGroupOptions& options, AssignmentFactory factory);
  // The address actually bound (resolves a "*" port). Empty before start().
  std::string endpoint() const;
  // Blocks until every rank is registered, alive and ready, or the timeout passes
  // (Unavailable naming the missing ranks). A rank whose setup failed ends the wait early,
  // and so does on_all_registered failing (its error).
  Status wait_until_ready(std::chrono::milliseconds timeout);
  bool is_complete() const;

  // Sends the plan to every rank and waits for every reply. Returns rank 0's result; a rank
  // that dies during the step, reports an error, or is missing when the step starts gives
  // Unavailable naming the rank.
  StatusOr<StepResult> execute(const StepPlan& plan) override;
  // Sum of all ranks' registrations: changes whenever a rank (re)joined with a fresh cache.
  uint64_t kv_cache_epoch() const override;

  std::vector<RankStatus> status() const;
  // How the group's ranks reduce, as rank 0 chose (worker/collective_group.h): "loopback" for a
  // group of one, "" until rank 0 has said.
  std::string collectives() const;
  // CURVE handshakes refused by the allowed-key list so far.
  uint64_t refused_handshakes() const;
  // Tells every connected worker to exit (Shutdown) and stops the I/O thread. Idempotent.
  void shutdown(const std::string& reason = "coordinator shutting down");

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
