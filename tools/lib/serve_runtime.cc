#include "tools/lib/serve_runtime.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/checkpoint.h"
#include "common/curve_keys.h"
#include "common/logging.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/chat_template.h"
#include "coordinator/cluster.h"
#include "coordinator/engine_service.h"
#include "coordinator/http_server.h"
#include "coordinator/local_workers.h"
#include "coordinator/zmq_client_server.h"
#include "worker/kv_cache.h"
#include "worker/model_config.h"
#include "worker/model_weights.h"
#include "worker/worker_runtime.h"
#include "worker/model_checkpoint.h"

namespace tessera {
namespace {

int64_t available_memory_bytes() {
  return static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

StatusOr<int64_t> auto_kv_blocks(const TesseraConfig& c, int64_t max_model_len) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, open_model_checkpoint(c.model.path));
  TESSERA_ASSIGN_OR_RETURN(ModelConfig mc, parse_model_config(ckpt->config(), ckpt->config_dir() + "/config.json"));
  const int world = c.parallel.tensor_parallel;
  TESSERA_ASSIGN_OR_RETURN(ShardSpec shard, ShardSpec::make(mc, 0, world));
  ModelConfig local = mc;
  local.kv_heads = shard.kv_heads;
  const int64_t per_block = KvCache::bytes_per_block(local, c.cache.block_size, c.model.dtype);
  const int64_t model_bytes = ckpt->total_bytes() * static_cast<int64_t>(dtype_size(c.model.dtype)) / 4;
  const int64_t budget = static_cast<int64_t>(available_memory_bytes() * c.cache.memory_fraction) - model_bytes;
  const int64_t per_seq = (max_model_len + c.cache.block_size - 1) / c.cache.block_size;
  const int64_t wanted = per_seq * c.scheduler.max_num_seqs;
  const int64_t fits = budget / (per_block * world);
  if (fits < per_seq) {
    return resource_exhausted("cache.num_blocks auto: " + std::to_string(budget / 1000000) +
                              " MB of memory left for the KV cache hold " + std::to_string(fits) +
                              " blocks, fewer than one " + std::to_string(max_model_len) +
                              "-token sequence needs; lower scheduler.max_model_len or set cache.num_blocks");
  }
  return std::min(fits, wanted);
}

Status serve(ServeOptions o) {
  // SIGTERM/SIGINT are taken synchronously (sigwait below): block them before any thread
  // exists, so every thread inherits the mask and none dies of the default action.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  TesseraConfig& c = o.config;
  TESSERA_RETURN_IF_ERROR(merge_deepspeed_env(c));
  c.model.path = std::filesystem::absolute(c.model.path).lexically_normal().string();
  TESSERA_RETURN_IF_ERROR(validate_config(c));

  // The model's shape, the plan and the tokenizer, checked here before any worker starts.
  TESSERA_ASSIGN_OR_RETURN(ModelConfig mc, check_deployment(c));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, open_model_checkpoint(c.model.path));
  std::unique_ptr<Tokenizer> tokenizer;
  if (auto tok = Tokenizer::load(ckpt->config_dir()); tok.is_ok()) {
    tokenizer = std::move(tok).value();
  } else {
    TESSERA_LOG_WARN("no usable tokenizer ({}); only token-id prompts will be accepted", tok.status().to_string());
  }
  ckpt.reset();

  const int64_t max_model_len =
      c.scheduler.max_model_len.value_or(mc.max_positions > 0 ? mc.max_positions : int64_t{4096});
  int64_t kv_blocks = 0;
  if (c.cache.num_blocks) {
    kv_blocks = *c.cache.num_blocks;
  } else {
    TESSERA_ASSIGN_OR_RETURN(kv_blocks, auto_kv_blocks(c, max_model_len));
  }
  SchedulerConfig sc;
  sc.block_size = c.cache.block_size;
  sc.num_blocks = static_cast<int>(kv_blocks);
  sc.max_num_seqs = c.scheduler.max_num_seqs;
  sc.max_num_batched_tokens = c.scheduler.max_num_batched_tokens;
  sc.chunked_prefill = c.scheduler.chunked_prefill;
  sc.prefix_caching = c.scheduler.prefix_caching;
  sc.max_model_len = static_cast<int>(max_model_len);
  sc.mode = c.scheduler.mode;
  sc.sliding_window = mc.kv_window();  // blocks the window has left are freed
  TESSERA_RETURN_IF_ERROR(validate_scheduler_config(sc));

  // Workers: the group binds first, then (tessera-serve) the local ranks start.
  ClusterOptions co;
  co.config = c;
  co.kv_num_blocks = sc.num_blocks;
  co.kv_dtype = c.model.dtype;
  co.group_name = "serve-" + std::to_string(getpid());
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<WorkerGroup> group, start_cluster(co));
  LocalWorkers workers;
  std::string tmp;
  if (o.spawn_workers) {
    tmp = (std::filesystem::temp_directory_path() / ("tessera-serve-" + std::to_string(getpid()))).string();
    std::filesystem::create_directories(tmp);
    // Local ranks connect where the group bound (a shared config's worker.control_address
    // names the coordinator for workers on other hosts).
    TesseraConfig local = c;
    local.worker.control_address = group->endpoint();
    std::ofstream(tmp + "/config.yaml") << dump_config_yaml(local);
    TESSERA_RETURN_IF_ERROR(workers.start(executable_dir() + "/tessera-worker", tmp + "/config.yaml",
                                          c.parallel.tensor_parallel));
  }
  TESSERA_LOG_INFO("waiting for {} worker(s) at {} ({} KV blocks of {} tokens)", c.parallel.tensor_parallel,
                   group->endpoint(), sc.num_blocks, sc.block_size);
  TESSERA_RETURN_IF_ERROR(group->wait_until_ready(std::chrono::minutes(10)));

  EngineServiceOptions eo;
  eo.scheduler = sc;
  eo.vocab_size = mc.vocab;
  eo.max_queued_requests = c.server.max_queued_requests;
  EngineService service(eo, *group, tokenizer.get());
  service.start();

  HttpServerOptions ho;
  ho.host = c.server.http.host;
  ho.port = c.server.http.port;
  ho.api_keys = c.server.http.api_keys;
  ho.max_body_bytes = c.server.http.max_body_bytes;
  ho.model_name = std::filesystem::path(c.model.path).filename().string();
  auto zmq_replies = std::make_shared<ReplyCounter>();  // shared: /metrics shows the ZeroMQ API's replies
  ho.zmq_replies = zmq_replies;
  HttpServer http(ho, service, tokenizer.get());
  WorkerGroup* g = group.get();
  http.ready_check = [g] { return g->is_complete(); };

  TESSERA_RETURN_IF_ERROR(http.start());
  // The ZeroMQ client API beside HTTP (same service, same validation); "" = not served.
  std::unique_ptr<ZmqClientServer> zmq_clients;
  if (!c.server.zmq_client.empty()) {
    ZmqClientServerOptions zo;
    zo.endpoint = c.server.zmq_client;
    zo.api_keys = ho.api_keys;
    zo.max_body_bytes = ho.max_body_bytes;
    zo.model_name = ho.model_name;
    zo.replies = zmq_replies;
    if (c.server.curve.client_api) {  // the same keypair as the control plane (server.curve)
      TESSERA_ASSIGN_OR_RETURN(CurveServerKeys keys, load_curve_server_keys(c.server.curve));
      zo.curve_server_secret_key = keys.server.secret_key;
    }
    zmq_clients = std::make_unique<ZmqClientServer>(zo, service, tokenizer.get());
    TESSERA_RETURN_IF_ERROR(zmq_clients->start());
    TESSERA_LOG_INFO("zmq clients on {}", zmq_clients->endpoint());
  }
  TESSERA_LOG_INFO("listening on http://{}:{}", ho.host, http.port());

  // Supervise the local ranks: a rank that exits (crash, or a broken collective group) is
  // started again; the coordinator stays up and the group becomes whole again.
  std::atomic<bool> stopping{false};
  std::thread supervisor;
  if (o.spawn_workers) {
    supervisor = std::thread([&] {
      while (!stopping.load()) {
        if (int n = workers.restart_exited(); n > 0) TESSERA_LOG_WARN("restarted {} worker process(es)", n);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  }

  int sig = 0;
  sigwait(&signals, &sig);
  TESSERA_LOG_INFO("signal {}: draining (up to {} s), new requests get 503", sig, o.drain_seconds);
  http.set_draining(true);
  if (zmq_clients) zmq_clients->set_draining(true);
  service.drain_and_stop(std::chrono::seconds(o.drain_seconds));
  http.stop();
  if (zmq_clients) zmq_clients->stop();
  stopping.store(true);
  if (supervisor.joinable()) supervisor.join();
  group->shutdown("server shutting down");
  workers.stop();
  if (!tmp.empty()) std::filesystem::remove_all(tmp);
  TESSERA_LOG_INFO("stopped");
  return Status::ok();
}

}  // namespace tessera
