#include "tools/lib/serve_runtime.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/checkpoint.h"
#include "common/zmq/curve_keys.h"
#include "common/logging.h"
#include "common/private_temp_dir.h"
#include "common/secret_file.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/api/chat_template.h"
#include "coordinator/cluster/cluster.h"
#include "coordinator/engine/engine_service.h"
#include "coordinator/engine/engine_warm_up.h"
#include "coordinator/server/http_server.h"
#include "coordinator/cluster/local_workers.h"
#include "coordinator/server/zmq_client_server.h"
#include "tools/lib/shutdown_signals.h"
#include "worker/kv_cache.h"
#include "worker/model_config.h"
#include "worker/model_weights.h"
#include "worker/worker_runtime.h"
#include "worker/model_checkpoint.h"
#include "worker/tp_plan.h"

namespace tessera {
StatusOr<KvPoolModel> kv_pool_model(const TesseraConfig& c, int64_t max_model_len) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, open_model_checkpoint(c.model.path));
  TESSERA_ASSIGN_OR_RETURN(ModelConfig mc, parse_model_config(ckpt->config(), ckpt->config_dir() + "/config.json"));
  const int world = c.parallel.tensor_parallel;
  TESSERA_ASSIGN_OR_RETURN(TpPlan plan, plan_for_config(c, *ckpt, mc, /*use_env=*/false));
  // As the loader decides (worker/model_weights.cc): attention is split by heads unless the
  // plan keeps its output projection whole, and then every rank caches every KV head.
  const std::string o_name = tensor_name(mc.arch->name_of(TensorRole::kO), 0);
  const bool attn_split = world > 1 && plan.role_of(o_name) != TpRole::kKeep;
  // The weights' share of a rank, estimated before loading: every parameter in the model
  // dtype, divided by the ranks (replicated tensors make the real share a little larger).
  int64_t params = 0;
  for (const std::string& name : ckpt->tensor_names()) {
    int64_t n = 1;
    for (int64_t d : ckpt->find(name)->shape) n *= d;
    params += n;
  }
  const int64_t weights = params * static_cast<int64_t>(dtype_size(c.model.dtype)) / world;
  KvPoolModel m;
  m.block_size = c.cache.block_size;
  m.max_model_len = max_model_len;
  m.max_num_seqs = c.scheduler.max_num_seqs;
  for (int r = 0; r < world; ++r) {
    TESSERA_ASSIGN_OR_RETURN(ShardSpec shard, ShardSpec::make(mc, r, world));
    ModelConfig local = mc;
    local.kv_heads = attn_split ? shard.kv_heads : mc.kv_heads;
    m.bytes_per_block.push_back(KvCache::bytes_per_block(local, c.cache.block_size, c.model.dtype));
    m.weight_bytes.push_back(weights);
  }
  return m;
}

namespace {

// The local workers read their pre-registration settings (control address, CURVE key files,
// heartbeat, backend) from a file; everything else comes in their Assignment. The file holds
// no secrets (worker_config_yaml) and lies, 0600, in a fresh private folder (mkdtemp, 0700)
// removed on exit, or by the next start after a kill -9 (common/private_temp_dir.h).
StatusOr<PrivateTempDir> write_local_worker_config(const TesseraConfig& config) {
  if (int n = remove_stale_private_temp_dirs("tessera-serve"); n > 0) {
    TESSERA_LOG_INFO("removed {} temporary folder(s) of tessera-serve processes that no longer run", n);
  }
  TESSERA_ASSIGN_OR_RETURN(PrivateTempDir dir, PrivateTempDir::create("tessera-serve"));
  TESSERA_RETURN_IF_ERROR(dir.write_file("config.yaml", worker_config_yaml(config)).status());
  return dir;
}

// server.http.api_keys and the keys of server.http.api_keys_file (its mode checked).
StatusOr<std::vector<std::string>> configured_api_keys(const HttpSection& http) {
  std::vector<std::string> keys = http.api_keys;
  if (!http.api_keys_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> from_file, read_api_keys_file(http.api_keys_file));
    keys.insert(keys.end(), from_file.begin(), from_file.end());
  }
  return keys;
}

// Ends set-up early: the signal's log line and the (clean) outcome.
Status interrupted_setup(const ShutdownSignals& signals, const char* during) {
  TESSERA_LOG_INFO("signal {} during set-up ({}): stopped before serving", signals.signal(), during);
  return Status::ok();
}

}  // namespace

Status serve(ServeOptions o) {
  // SIGTERM/SIGINT are watched from the start, before any thread exists (so every thread
  // inherits their mask): a signal during set-up stops it at once, one while serving drains.
  ShutdownSignals signals;
  signals.set_handler([](int sig, int count) {
    if (count == 1) TESSERA_LOG_INFO("signal {}: stopping set-up", sig);
  });

  TesseraConfig& c = o.config;
  TESSERA_RETURN_IF_ERROR(merge_deepspeed_env(c));
  c.model.path = std::filesystem::absolute(c.model.path).lexically_normal().string();
  TESSERA_RETURN_IF_ERROR(validate_config(c));
  // The local workers resolve worker.cpu under this environment: a bad TESSERA_CPU_* is one error here.
  TESSERA_RETURN_IF_ERROR(kernel_options_from_environment(c.worker.cpu).status());
  TESSERA_ASSIGN_OR_RETURN(const std::vector<std::string> api_keys, configured_api_keys(c.server.http));

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
  // The chat template is checked before any worker starts: one that does not parse (the
  // model's, or server.chat_template's) stops start-up with its error (construct and line),
  // never a silent fallback; a model without one gets the documented built-in.
  ChatRenderer chat_renderer;
  std::optional<ToolCallFormat> tool_calls;
  TESSERA_ASSIGN_OR_RETURN(tool_calls, tool_call_format_from_name(c.server.tool_call_parser));
  if (tokenizer) {
    StatusOr<ChatTemplate> tmpl = ChatTemplate::from_setting(*tokenizer, c.server.chat_template);
    // The model's template is named by the model's folder; server.chat_template's errors name the key.
    if (!tmpl.is_ok()) return c.server.chat_template.empty() ? tmpl.status().with_context(c.model.path) : tmpl.status();
    auto shared = std::make_shared<const ChatTemplate>(std::move(tmpl).value());
    if (!tool_calls) tool_calls = tool_call_format_for_template(shared->source());
    TESSERA_LOG_INFO("chat template: {}; tool calls read as {}",
                     !c.server.chat_template.empty() ? c.server.chat_template
                     : tokenizer->chat_template().empty() ? std::string("the built-in llama2 (the model has none)")
                                                          : std::string("the model's"),
                     tool_call_format_name(*tool_calls));
    chat_renderer = [shared](const nlohmann::ordered_json& context) { return shared->render(context); };
  }
  if (signals.requested()) return interrupted_setup(signals, "reading the model");

  const int64_t max_model_len =
      c.scheduler.max_model_len.value_or(mc.max_positions > 0 ? mc.max_positions : int64_t{4096});

  SchedulerConfig sc;
  sc.block_size = c.cache.block_size;
  sc.num_blocks = static_cast<int>(std::min<int64_t>(c.cache.num_blocks.value_or(1), INT32_MAX));
  sc.max_num_seqs = c.scheduler.max_num_seqs;
  sc.max_num_batched_tokens = c.scheduler.max_num_batched_tokens;
  sc.chunked_prefill = c.scheduler.chunked_prefill;
  sc.prefix_caching = c.scheduler.prefix_caching;
  sc.max_model_len = static_cast<int>(max_model_len);
  sc.mode = c.scheduler.mode;
  sc.max_decode_slowdown = c.scheduler.max_decode_slowdown;
  sc.max_tpot_slowdown = c.scheduler.max_tpot_slowdown;
  sc.sliding_window = mc.kv_window();  // blocks the window has left are freed
  // A fixed pool is checked before any worker starts; an automatic one once it is sized.
  if (c.cache.num_blocks) TESSERA_RETURN_IF_ERROR(validate_scheduler_config(sc));

  // Workers: the group binds first, then (tessera-serve) the local ranks start. With
  // cache.num_blocks auto the pool is sized once every rank has registered and reported
  // its memory (coordinator/cluster/cluster.h).
  ClusterOptions co;
  co.config = c;
  co.kv_dtype = c.model.dtype;
  co.group_name = "serve-" + std::to_string(getpid());
  if (!c.cache.num_blocks) {
    TESSERA_ASSIGN_OR_RETURN(co.kv_model, kv_pool_model(c, max_model_len));
  }
  TESSERA_ASSIGN_OR_RETURN(Cluster cluster, start_cluster(co));
  std::unique_ptr<WorkerGroup> group = std::move(cluster.group);
  // From here a signal during set-up ends the wait for the workers (shutting the group
  // down wakes it); the local workers are then stopped and reaped on the way out.
  WorkerGroup* g = group.get();
  signals.set_handler([g](int sig, int count) {
    if (count == 1) TESSERA_LOG_INFO("signal {}: stopping set-up", sig);
    g->shutdown("set-up interrupted by a signal");
  });
  // Whatever way serve() returns, the handler is gone before the objects it uses.
  struct HandlerReset {
    ShutdownSignals& s;
    ~HandlerReset() { s.set_handler(nullptr); }
  } handler_reset{signals};
  LocalWorkers workers;
  PrivateTempDir tmp;
  if (o.spawn_workers) {
    // Local ranks connect where the group bound (a shared config's worker.control_address
    // names the coordinator for workers on other hosts).
    TesseraConfig local = c;
    local.worker.control_address = group->endpoint();
    TESSERA_ASSIGN_OR_RETURN(tmp, write_local_worker_config(local));
    TESSERA_RETURN_IF_ERROR(workers.start(executable_dir() + "/tessera-worker", tmp.path() + "/config.yaml",
                                          c.parallel.tensor_parallel));
  }
  TESSERA_LOG_INFO("waiting for {} worker(s) at {} (KV pool: {})", c.parallel.tensor_parallel, group->endpoint(),
                   c.cache.num_blocks ? std::to_string(*c.cache.num_blocks) + " blocks of " +
                                            std::to_string(c.cache.block_size) + " tokens"
                                      : std::string("auto, sized from the workers' reports"));
  // A signal before the handler above was set has shut nothing down: look once more.
  if (signals.requested()) group->shutdown("set-up interrupted by a signal");
  Status ready = group->wait_until_ready(std::chrono::minutes(10));
  if (signals.requested()) ready = interrupted_setup(signals, "waiting for the workers");
  if (!ready.is_ok() || signals.requested()) {
    group->shutdown("set-up ended");
    workers.stop();
    tmp.remove();
    return ready;
  }
  const std::optional<KvPoolSize> pool = cluster.kv_pool->get();
  if (!pool) return internal_error("the worker group became ready without a KV pool size");
  if (c.cache.num_blocks) TESSERA_LOG_INFO("{}", pool->describe());

  sc.num_blocks = static_cast<int>(pool->num_blocks);
  TESSERA_RETURN_IF_ERROR(validate_scheduler_config(sc));
  if (c.server.warm_up) {
    StatusOr<WarmUpReport> warm = warm_up_executor(sc, *group, mc.vocab);
    if (signals.requested()) return interrupted_setup(signals, "warming up");
    if (!warm.is_ok()) return Status(warm.status().code(), "warm-up (server.warm_up): " + warm.status().message());
    TESSERA_LOG_INFO("warm-up: {} steps ({}-token prefill, then {} sequences decoding) in {:.2f} s", warm->steps,
                     warm->prompt_tokens, warm->decode_batch, warm->seconds);
  }

  EngineServiceOptions eo;
  eo.scheduler = sc;
  eo.vocab_size = mc.vocab;
  eo.max_queued_requests = c.server.max_queued_requests;
  // While a rank is lost (and restarting) requests wait for the group instead of failing.
  eo.executor_ready = [g] { return g->is_complete(); };
  eo.executor_wait = std::chrono::seconds(c.server.worker_restart_wait_s);
  EngineService service(eo, *group, tokenizer.get());
  service.start();

  HttpServerOptions ho;
  ho.host = c.server.http.host;
  ho.port = c.server.http.port;
  ho.api_keys = api_keys;
  ho.max_body_bytes = c.server.http.max_body_bytes;
  ho.max_connections = c.server.http.max_connections;
  ho.idle_timeout_s = c.server.http.idle_timeout_s;
  ho.header_timeout_s = c.server.http.header_timeout_s;
  ho.cors_origins = c.server.http.cors_origins;
  ho.model_name = std::filesystem::path(c.model.path).filename().string();
  auto zmq_replies = std::make_shared<ReplyCounter>();  // shared: /metrics shows the ZeroMQ API's replies
  ho.zmq_replies = zmq_replies;
  ho.chat_renderer = chat_renderer;
  ho.tool_call_format = tool_calls;
  HttpServer http(ho, service, tokenizer.get());
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
    zo.chat_renderer = chat_renderer;
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

  // Serving. The first signal drains, a second one cuts the drain short.
  const int drain_seconds = c.server.drain_timeout_s;
  signals.set_handler([&service](int sig, int count) {
    if (count == 1) return;  // the main thread drains
    TESSERA_LOG_WARN("signal {} again: ending the drain now", sig);
    service.drain_and_stop(std::chrono::milliseconds(0));
  });
  signals.wait();
  TESSERA_LOG_INFO("signal {}: draining (up to {} s), new requests get 503", signals.signal(), drain_seconds);
  // Order matters. First stop admitting (503 + Retry-After); then let the engine end every
  // request (finished, or cut at the deadline: each choice gets its final event, posted to
  // its connection); only then close the front ends, which write everything those events
  // queued (final chunk, [DONE], the chunked terminator; the ZeroMQ Finals) before closing.
  http.set_draining(true);
  if (zmq_clients) zmq_clients->set_draining(true);
  service.drain_and_stop(std::chrono::seconds(drain_seconds));
  http.stop_gracefully();
  if (zmq_clients) zmq_clients->stop();
  stopping.store(true);
  if (supervisor.joinable()) supervisor.join();
  group->shutdown("server shutting down");
  workers.stop();
  tmp.remove();
  signals.set_handler(nullptr);  // it uses `service`, which goes before handler_reset does
  TESSERA_LOG_INFO("stopped");
  return Status::ok();
}

}  // namespace tessera
