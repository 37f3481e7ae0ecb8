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
#include <numeric>
#include <future>
#include <thread>

#include "common/checkpoint.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_tensor_rows.h"
#include "common/input_file.h"
#include "common/zmq/curve_keys.h"
#include "common/logging.h"
#include "common/private_temp_dir.h"
#include "common/secret_file.h"
#include "common/tokenizer/model_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/api/chat_template.h"
#include "coordinator/api/embedding_pooling.h"
#include "coordinator/cluster/cluster.h"
#include "coordinator/engine/engine_service.h"
#include "coordinator/engine/engine_warm_up.h"
#include "coordinator/server/http_server.h"
#include "coordinator/cluster/local_workers.h"
#include "coordinator/server/zmq_client_server.h"
#include "tools/lib/shutdown_signals.h"
#include "worker/activation_memory.h"
#include "worker/draft_model.h"
#include "worker/lora_adapter.h"
#include "worker/kv_cache.h"
#include "worker/model_config.h"
#include "worker/model_weights.h"
#include "worker/weight_quantization.h"
#include "worker/worker_runtime.h"
#include "worker/model_checkpoint.h"
#include "worker/tp_plan.h"

namespace tessera {
namespace {

// What a rank of `weights` bytes holds resident under model.weights_memory_budget (the KV pool
// gets the rest of the memory): the budget plus weights_prefetch_layers of the largest unit
// streamed whole in flight (worker/weight_units.h), estimated from the shapes: a layer's
// share of what is not the embedding table and LM head, or the LM head (vocab x hidden) when
// the budget cannot keep it (the rule keeps it first). On the CPU the table alone is read by
// rows; a device copies it whole into its slots like the rest (`table_whole`).
int64_t resident_weight_bytes(const ModelSection& model, const ModelConfig& mc, int world, int64_t weights,
                              bool table_whole) {
  if (model.weights_memory_budget.all() || weights <= 0) return weights;
  const int64_t table = mc.vocab * mc.hidden * static_cast<int64_t>(dtype_size(model.dtype)) / world;
  const int64_t tables = mc.tie_embeddings ? table : 2 * table;
  const int64_t layer = mc.layers > 0 ? std::max<int64_t>(weights - tables, 0) / mc.layers : 0;
  const int64_t budget = model.weights_memory_budget.bytes_for(weights);
  const int64_t streamed_whole = budget >= table && !table_whole ? layer : std::max(layer, table);
  return std::min(weights, budget + model.weights_prefetch_layers * streamed_whole);
}

}  // namespace

StatusOr<KvPoolModel> kv_pool_model(const TesseraConfig& c, int64_t max_model_len) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, open_model_checkpoint(c.model.path));
  TESSERA_ASSIGN_OR_RETURN(ModelConfig mc, parse_model_config(ckpt->config(), ckpt->config_source()));
  const int world = c.parallel.tensor_parallel;
  TESSERA_ASSIGN_OR_RETURN(TpPlan plan, plan_for_config(c, *ckpt, mc, /*use_env=*/false));
  // As the loader decides (worker/model_weights.cc): attention is split by heads unless the
  // plan keeps its output projection whole, and then every rank caches every KV head.
  const std::string o_name = tensor_name(mc.arch->name_of(TensorRole::kO), 0);
  const bool attn_split = world > 1 && plan.role_of(o_name) != TpRole::kKeep;
  // The weights' share of a rank: divided by the ranks (replicated tensors make the real
  // share a little larger).
  const QuantizationOptions quant = quantization_options(c.model);
  int64_t weights = static_cast<int64_t>(estimated_weight_bytes(*ckpt, mc, quant, c.model.dtype)) / world;
  // auto may be a GPU: counted as one (the larger estimate).
  const bool table_whole = c.worker.backend != BackendKind::kCpu;
  if (const int64_t held = resident_weight_bytes(c.model, mc, world, weights, table_whole); held < weights) {
    TESSERA_LOG_INFO("weights: about {} of each rank's {} held resident (model.weights_memory_budget {} and {} "
                     "streamed unit(s) in flight); the KV pool is sized beside that",
                     format_bytes(held), format_bytes(weights), c.model.weights_memory_budget.to_string(),
                     c.model.weights_prefetch_layers);
    weights = held;
  }
  // A draft model's blocks lie beside the target's in the same pool (same block ids), and
  // its weights (loaded as load_draft_model does: the target's options, no rules) take their
  // share of the budget too: all of them on every rank when it is not split.
  int64_t draft_block_bytes = 0;
  if (c.speculative.method == SpeculativeConfig::Method::kDraft) {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> draft_ckpt, open_model_checkpoint(c.speculative.draft_model));
    TESSERA_ASSIGN_OR_RETURN(ModelConfig draft, parse_model_config(draft_ckpt->config(), draft_ckpt->config_source()));
    draft_block_bytes = draft_kv_bytes_per_block(draft, world, c.cache.block_size, c.model.dtype);
    QuantizationOptions draft_quant = quant;
    draft_quant.rules.clear();
    weights += static_cast<int64_t>(estimated_weight_bytes(*draft_ckpt, draft, draft_quant, c.model.dtype)) /
               (draft_splits(draft, world) ? world : 1);
  }
  // LoRA adapters' factors take their share too: read (and so checked against the base) here,
  // counted whole on every rank (a split layer's rank holds less), in the dtype the workers
  // keep them in (worker/lora_weights.h).
  // On CUDA under lora.max_loras only that many are on the device at once (the largest, to be
  // safe); the others wait in host memory. On the CPU placed and host copies are one.
  std::vector<int64_t> each_adapter;
  for (const auto& [name, dir] : c.lora.adapters) {
    TESSERA_ASSIGN_OR_RETURN(const LoraAdapter adapter, load_lora_adapter(dir, *ckpt, mc, c.lora.max_rank));
    const int64_t elem = c.model.dtype == DType::kBF16 ? 2 : 4;
    int64_t bytes = 0;
    for (const LoraModule& module : adapter.modules) bytes += (module.a.numel() + module.b.numel()) * elem;
    each_adapter.push_back(bytes);
  }
  std::sort(each_adapter.rbegin(), each_adapter.rend());
  const bool device_slots = c.lora.max_loras > 0 && c.worker.backend == BackendKind::kCuda;
  const size_t counted = device_slots ? std::min(each_adapter.size(), static_cast<size_t>(c.lora.max_loras)) : each_adapter.size();
  const int64_t adapter_bytes = std::accumulate(each_adapter.begin(), each_adapter.begin() + static_cast<std::ptrdiff_t>(counted), int64_t{0});
  if (adapter_bytes > 0) {
    TESSERA_LOG_INFO("LoRA adapters: {} of factors ({} of {} adapter(s){}) beside each rank's weights",
                     format_bytes(adapter_bytes), counted, each_adapter.size(),
                     device_slots ? ", the largest lora.max_loras on the device" : "");
    weights += adapter_bytes;
  }
  // The largest step's activations beside them (worker/activation_memory.h), split as the
  // loader splits (layer 0's groups stand for all).
  const std::string down_name = tensor_name(mc.arch->name_of(TensorRole::kDown), 0);
  const bool mlp_split = world > 1 && plan.role_of(down_name) != TpRole::kKeep;
  const bool vocab_split = world > 1 && plan.role_of(mc.arch->name_of(TensorRole::kEmbed)) == TpRole::kVocab;
  const StepActivations activations =
      planned_step_activations(c, ActivationWidths::of(mc, world, attn_split, mlp_split, vocab_split));
  KvPoolModel m;
  m.activation_step = activations.step();
  m.block_size = c.cache.block_size;
  m.max_model_len = max_model_len;
  m.max_num_seqs = c.scheduler.max_num_seqs;
  for (int r = 0; r < world; ++r) {
    TESSERA_ASSIGN_OR_RETURN(ShardSpec shard, ShardSpec::make(mc, r, world));
    ModelConfig local = mc;
    local.kv_heads = attn_split ? shard.kv_heads : mc.kv_heads;
    m.bytes_per_block.push_back(KvCache::bytes_per_block(local, c.cache.block_size, c.model.dtype) + draft_block_bytes);
    m.weight_bytes.push_back(weights);
    m.activation_bytes.push_back(activations.bytes());
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

// server.warm_up on the workers, logged; false when a signal stopped it (logged too).
StatusOr<bool> warm_up_workers(const SchedulerConfig& sc, StepExecutor& group, int64_t vocab, Pooling embeddings_only,
                               const ShutdownSignals& signals, const std::function<bool()>& cut_short) {
  StatusOr<WarmUpReport> warm = warm_up_executor(sc, group, vocab, embeddings_only, cut_short);
  if (signals.requested()) {
    TESSERA_RETURN_IF_ERROR(interrupted_setup(signals, "warming up"));
    return false;
  }
  if (!warm.is_ok()) return Status(warm.status().code(), "warm-up (server.warm_up): " + warm.status().message());
  if (warm->cut_short) {
    TESSERA_LOG_INFO("warm-up: cut short by the first request after {} step(s) ({:.2f} s)", warm->steps, warm->seconds);
  } else {
    TESSERA_LOG_INFO("warm-up: {} steps ({} sequences decoding, then a {}-token prefill) in {:.2f} s", warm->steps,
                     warm->decode_batch, warm->prompt_tokens, warm->seconds);
  }
  return true;
}

// Speculative decoding's back-off reads what a verification row costs from a plain step's
// time by its rows (SchedulerConfig::row_costs), measured here on the workers.
Status measure_speculation_row_costs(SchedulerConfig& sc, StepExecutor& executor, int64_t vocab) {
  StatusOr<RowCostCurve> curve = measure_row_costs(sc, executor, vocab);
  if (!curve.is_ok()) return Status(curve.status().code(), "measuring step costs: " + curve.status().message());
  sc.row_costs = curve.value();
  TESSERA_LOG_INFO("speculation: a step's time by its rows {}; up to {} rows take at most {:.2f}x one row's",
                   sc.row_costs.describe(), sc.row_costs.nearly_free_rows(), RowCostCurve::kNearlyFree);
  return Status::ok();
}

Status check_tokenizer_fits_model(const Tokenizer& t, const ModelConfig& mc) {
  for (auto [id, name] : {std::pair{t.eos_id(), "eos_token"}, std::pair{t.bos_id(), "bos_token"}}) {
    if (id >= mc.vocab) {
      return invalid_argument("the tokenizer's " + std::string(name) + " '" + t.id_to_token(id) + "' is id " +
                              std::to_string(id) + ", outside the model's vocabulary [0, " + std::to_string(mc.vocab) +
                              ")");
    }
  }
  return Status::ok();
}

// What the coordinator reads of the model itself, checked before any worker starts.
struct ServedModel {
  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;  // null: only token-id prompts are accepted
  ChatRenderer chat_renderer;            // empty without a tokenizer
  std::optional<ToolCallFormat> tool_calls;
  std::optional<ReasoningFormat> reasoning;
  std::optional<EmbeddingPooling> embeddings;  // unset: server.task generate
};

// The tokenizer and the chat template. A model without tokenizer.json (and not a GGUF
// file, which holds its vocabulary) is served for token-id prompts only, with a warning; one
// that is present but cannot be used stops start-up, as does a template that does not parse
// (the model's, or server.chat_template's: construct and line), never a silent fallback; a
// model without a template gets the documented built-in.
Status read_tokenizer_and_chat_template(const TesseraConfig& c, const Checkpoint& ckpt, ServedModel& m) {
  const std::string tokenizer_json = (std::filesystem::path(ckpt.config_dir()) / "tokenizer.json").string();
  TESSERA_ASSIGN_OR_RETURN(const bool has_tokenizer_json, input_path_exists(tokenizer_json));
  if (!has_tokenizer_json && !is_gguf_path(c.model.path)) {
    TESSERA_LOG_WARN("no tokenizer: {} does not exist; only token-id prompts will be accepted", tokenizer_json);
  } else {
    StatusOr<std::unique_ptr<Tokenizer>> tok = load_model_tokenizer(c.model.path, ckpt.config_dir());
    if (!tok.is_ok()) return tok.status().with_context("the tokenizer");
    m.tokenizer = std::move(tok).value();
    TESSERA_RETURN_IF_ERROR(check_tokenizer_fits_model(*m.tokenizer, m.config));
  }
  TESSERA_ASSIGN_OR_RETURN(m.tool_calls, tool_call_format_from_name(c.server.tool_call_parser));
  TESSERA_ASSIGN_OR_RETURN(m.reasoning, reasoning_format_from_setting(c.server.reasoning_parser));
  if (!m.tokenizer) return Status::ok();
  StatusOr<ChatTemplate> tmpl = ChatTemplate::from_setting(*m.tokenizer, c.server.chat_template);
  // The model's template is named by the model's folder; server.chat_template's errors name the key.
  if (!tmpl.is_ok()) return c.server.chat_template.empty() ? tmpl.status().with_context(c.model.path) : tmpl.status();
  auto shared = std::make_shared<const ChatTemplate>(std::move(tmpl).value());
  if (!m.tool_calls) m.tool_calls = tool_call_format_for_template(shared->source());
  if (!m.reasoning) m.reasoning = reasoning_format_for_template(shared->source());
  TESSERA_LOG_INFO("chat template: {}; tool calls read as {}; reasoning read as {}",
                   !c.server.chat_template.empty() ? c.server.chat_template
                   : m.tokenizer->chat_template().empty() ? std::string("the built-in llama2 (the model has none)")
                                                          : std::string("the model's"),
                   tool_call_format_name(*m.tool_calls), reasoning_format_name(*m.reasoning));
  m.chat_renderer = [shared](const nlohmann::ordered_json& context) { return shared->render(context); };
  return Status::ok();
}

// How embeddings are pooled (server.task embed or both), from model.pooling / model.normalize
// or the folder's sentence-transformers files; said at start-up with where each came from.
Status read_embedding_pooling(const TesseraConfig& c, const Checkpoint& ckpt, ServedModel& m) {
  if (c.server.task == "generate") return Status::ok();
  TESSERA_ASSIGN_OR_RETURN(EmbeddingPooling pooling,
                           embedding_pooling(ckpt.config_dir(), c.model.pooling, c.model.normalize));
  pooling.embedding_size = static_cast<int>(m.config.hidden);
  TESSERA_LOG_INFO("embeddings (server.task {}): {} pooling ({}), {} ({}), {} values", c.server.task,
                   pooling_name(pooling.pooling), pooling.pooling_source,
                   pooling.normalize ? "normalised" : "not normalised", pooling.normalize_source, pooling.embedding_size);
  m.embeddings = std::move(pooling);
  return Status::ok();
}

// The scheduler's settings; num_blocks is a placeholder until the pool is sized when
// cache.num_blocks is auto.
SchedulerConfig scheduler_config(const TesseraConfig& c, const ModelConfig& mc, int64_t max_model_len) {
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
  sc.speculative = c.speculative;
  sc.structured_mask_budget_ms = c.scheduler.structured_mask_budget_ms;
  sc.max_loras = c.lora.max_loras;
  sc.sliding_window = mc.kv_window();  // blocks the window has left are freed
  return sc;
}

// Starts the local ranks (tessera-serve) and waits for the whole group: true once it is
// whole, false when a signal interrupted set-up, an error when the group failed to form.
// Unless true, the group is shut down and the local workers are stopped before it returns.
StatusOr<bool> start_and_await_workers(const ServeOptions& o, WorkerGroup& group, LocalWorkers& workers, PrivateTempDir& tmp,
                               const ShutdownSignals& signals) {
  const TesseraConfig& c = o.config;
  if (o.spawn_workers) {
    // Local ranks connect where the group bound (a shared config's worker.control_address
    // names the coordinator for workers on other hosts).
    TesseraConfig local = c;
    local.worker.control_address = group.endpoint();
    // Gloo between ranks of one host: over loopback unless the configuration names an address.
    if (local.worker.collectives_address.empty() && local.worker.collectives_interface.empty())
      local.worker.collectives_address = "127.0.0.1";
    TESSERA_ASSIGN_OR_RETURN(tmp, write_local_worker_config(local));
    TESSERA_RETURN_IF_ERROR(workers.start(executable_dir() + "/tessera-worker", tmp.path() + "/config.yaml",
                                          c.parallel.tensor_parallel));
  }
  TESSERA_LOG_INFO("waiting for {} worker(s) at {} (KV pool: {})", c.parallel.tensor_parallel, group.endpoint(),
                   c.cache.num_blocks ? std::to_string(*c.cache.num_blocks) + " blocks of " +
                                            std::to_string(c.cache.block_size) + " tokens"
                                      : std::string("auto, sized from the workers' reports"));
  // A signal before the caller's handler was set has shut nothing down: look once more.
  if (signals.requested()) group.shutdown("set-up interrupted by a signal");
  Status ready = group.wait_until_ready(std::chrono::minutes(10));
  if (signals.requested()) ready = interrupted_setup(signals, "waiting for the workers");
  if (ready.is_ok() && !signals.requested()) return true;
  group.shutdown("set-up ended");
  workers.stop();
  tmp.remove();
  if (!ready.is_ok()) return ready;
  return false;
}

HttpServerOptions http_server_options(const TesseraConfig& c, const std::shared_ptr<ServedLoras>& loras,
                                      const std::vector<std::string>& api_keys,
                                      const ServedModel& model, std::shared_ptr<const ReplyCounter> zmq_replies) {
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
  ho.zmq_replies = std::move(zmq_replies);  // /metrics shows the ZeroMQ API's replies
  ho.chat_renderer = model.chat_renderer;
  ho.tool_call_format = model.tool_calls;
  ho.reasoning_format = model.reasoning;
  ho.generation = c.server.task != "embed";
  ho.embeddings = model.embeddings;
  ho.responses_max_stored = c.server.responses_max_stored;
  ho.responses_max_age_s = c.server.responses_max_age_s;
  ho.batch_dir = c.server.batch_dir;
  ho.lora_adapters = loras;
  ho.lora_runtime_updates = c.lora.runtime_updates;
  ho.lora_max_loras = c.lora.max_loras;
  ho.check_lora = [model_path = c.model.path, max_rank = c.lora.max_rank](const std::string&,
                                                                          const std::string& dir) -> Status {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> base, open_model_checkpoint(model_path));
    TESSERA_ASSIGN_OR_RETURN(ModelConfig config, parse_model_config(base->config(), base->config_source()));
    return load_lora_adapter(dir, *base, config, max_rank).status();
  };
  return ho;
}

// The ZeroMQ client API beside HTTP (same service, same validation, its replies counted in
// `replies`); null when server.zmq_client is "" (not served).
StatusOr<std::unique_ptr<ZmqClientServer>> start_zmq_clients(const TesseraConfig& c, const HttpServerOptions& ho,
                                                             std::shared_ptr<ReplyCounter> replies,
                                                             EngineService& service, const Tokenizer* tokenizer) {
  if (c.server.zmq_client.empty()) return std::unique_ptr<ZmqClientServer>();
  ZmqClientServerOptions zo;
  zo.endpoint = c.server.zmq_client;
  zo.api_keys = ho.api_keys;
  zo.max_body_bytes = ho.max_body_bytes;
  zo.model_name = ho.model_name;
  zo.replies = std::move(replies);
  zo.chat_renderer = ho.chat_renderer;
  zo.reasoning_format = ho.reasoning_format;
  zo.generation = ho.generation;
  zo.embeddings = ho.embeddings;
  zo.lora_adapters = ho.lora_adapters;
  if (c.server.curve.client_api) {  // the same keypair as the control plane (server.curve)
    TESSERA_ASSIGN_OR_RETURN(CurveServerKeys keys, load_curve_server_keys(c.server.curve));
    zo.curve_server_secret_key = keys.server.secret_key;
  }
  auto zmq_clients = std::make_unique<ZmqClientServer>(zo, service, tokenizer);
  TESSERA_RETURN_IF_ERROR(zmq_clients->start());
  TESSERA_LOG_INFO("zmq clients on {}", zmq_clients->endpoint());
  return zmq_clients;
}

// Supervises the local ranks while it lives: a rank that exits (crash, or a broken
// collective group) is started again; so is one whose process is still there although the
// group declared it dead: at once when it missed its heartbeats (stopped, or hung in a kernel
// or a deadlock), else (told to restart with the group) when it has not gone on its own within
// the heartbeat limit. It is killed and started again, as after a crash. Only the process
// that registered is killed, never a fresh one still loading.
class WorkerSupervisor {
 public:
  WorkerSupervisor(LocalWorkers& workers, const WorkerGroup& group, std::chrono::milliseconds silence_limit)
      : thread_([this, &workers, &group, silence_limit] {
          while (!stopping_.load()) {
            kill_silent(workers, group, silence_limit);
            if (int n = workers.restart_exited(); n > 0) TESSERA_LOG_WARN("restarted {} worker process(es)", n);
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
        }) {}
  ~WorkerSupervisor() {
    stopping_.store(true);
    thread_.join();
  }

 private:
  static void kill_silent(LocalWorkers& workers, const WorkerGroup& group, std::chrono::milliseconds limit) {
    for (const RankStatus& st : group.status()) {
      if (st.alive || !st.registered || st.pid <= 0 || st.pid != workers.pid(st.rank)) continue;
      if ((!st.silent && st.ms_since_heard < limit.count()) || !workers.running(st.rank)) continue;
      TESSERA_LOG_WARN("rank {} (pid {}) is dead to the group ({}) but its process is still there, silent for {} ms: "
                       "killing it to start it again",
                       st.rank, st.pid, st.error, st.ms_since_heard);
      if (Status r = workers.restart(st.rank); !r.is_ok())
        TESSERA_LOG_ERROR("rank {}: restart failed: {}", st.rank, r.to_string());
    }
  }

  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// The API context the front ends serve with, as the HTTP server builds its own.
ApiContext served_api_context(const TesseraConfig& c, const std::shared_ptr<ServedLoras>& loras, const ServedModel& model,
                              const EngineService& service) {
  ApiContext api = make_api_context(model.tokenizer.get(), std::filesystem::path(c.model.path).filename().string(),
                                    service.max_model_len(), model.chat_renderer, model.tool_calls, model.reasoning);
  api.max_model_len_limit = service.max_model_len_limit();
  api.generation = c.server.task != "embed";
  api.embeddings = model.embeddings;
  api.lora_adapters = loras;
  return api;
}

// The drain, in the order that keeps every stream whole: stop admitting (503 + Retry-After);
// let the engine end every request (finished, or cut at the deadline: each choice gets its
// final event, posted to its connection); only then close the front ends, which write
// everything those events queued (final chunk, [DONE], the chunked terminator; the ZeroMQ
// Finals) before closing.
void drain(HttpServer& http, ZmqClientServer* zmq_clients, EngineService& service, int drain_seconds) {
  http.set_draining(true);
  if (zmq_clients) zmq_clients->set_draining(true);
  service.drain_and_stop(std::chrono::seconds(drain_seconds));
  http.stop_gracefully();
  if (zmq_clients) zmq_clients->stop();
}

}  // namespace

Status run_engine_stack(ServeOptions o, const FrontEnd& front_end, const Preflight& preflight) {
  // SIGTERM/SIGINT are watched from the start, before any thread exists (so every thread
  // inherits their mask): a signal during set-up stops it at once, one while serving drains.
  ShutdownSignals signals;
  signals.set_handler([](int sig, int count) {
    if (count == 1) TESSERA_LOG_INFO("signal {}: stopping set-up", sig);
  });

  TesseraConfig& c = o.config;
  TESSERA_RETURN_IF_ERROR(merge_deepspeed_env(c));
  TESSERA_RETURN_IF_ERROR(validate_config(c));  // first: it names an empty model.path
  c.model.path = std::filesystem::absolute(c.model.path).lexically_normal().string();
  // The local workers resolve worker.cpu under this environment: a bad TESSERA_CPU_* is one error here.
  TESSERA_RETURN_IF_ERROR(kernel_options_from_environment(c.worker.cpu).status());
  if (preflight) TESSERA_RETURN_IF_ERROR(preflight(c));
  // The model's shape and the parallel plan now; its tokenizer and chat template below,
  // while the workers load.
  ServedModel model;
  TESSERA_ASSIGN_OR_RETURN(model.config, check_deployment(c));
  if (signals.requested()) return interrupted_setup(signals, "reading the model");

  const ModelConfig& mc = model.config;
  const int64_t max_model_len =
      configured_max_model_len(c, mc);
  SchedulerConfig sc = scheduler_config(c, mc, max_model_len);
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
  // The tokenizer, the chat template and the embedding pooling are read on their own thread
  // while the workers start and load the weights (a GGUF file's 32,000-token vocabulary takes
  // ~70 ms to build); an error there shuts the group down at once, so it still ends start-up
  // early.
  std::future<Status> text_side = std::async(std::launch::async, [&c, &model, g] {
    Status read = [&]() -> Status {
      TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, open_model_checkpoint(c.model.path));
      TESSERA_RETURN_IF_ERROR(read_tokenizer_and_chat_template(c, *ckpt, model));
      return read_embedding_pooling(c, *ckpt, model);
    }();
    if (!read.is_ok()) g->shutdown("the tokenizer, chat template or embedding pooling failed");
    return read;
  });
  StatusOr<bool> workers_ready = start_and_await_workers(o, *group, workers, tmp, signals);
  TESSERA_RETURN_IF_ERROR(text_side.get());  // its own error rather than the group's shutdown
  TESSERA_RETURN_IF_ERROR(workers_ready.status());
  if (!*workers_ready) return Status::ok();
  const std::optional<KvPoolSize> pool = cluster.kv_pool->get();
  if (!pool) return internal_error("the worker group became ready without a KV pool size");
  if (c.cache.num_blocks) TESSERA_LOG_INFO("{}", pool->describe());

  sc.num_blocks = static_cast<int>(pool->num_blocks);
  TESSERA_RETURN_IF_ERROR(validate_scheduler_config(sc));
  // A server that only embeds has workers without an LM head: it warms up with embeddings.
  const Pooling embeddings_only = c.server.task == "embed" ? model.embeddings->pooling : Pooling::kNone;
  // The server takes requests while it warms up, and the first to come ends the warm-up,
  // except under speculative decoding: its step costs are measured next, on warm steps,
  // before any request runs.
  const bool warm_before_serving = c.server.warm_up && sc.speculative.enabled();
  if (warm_before_serving) {
    TESSERA_ASSIGN_OR_RETURN(const bool warmed, warm_up_workers(sc, *group, mc.vocab, embeddings_only, signals, {}));
    if (!warmed) return Status::ok();
  }
  if (sc.speculative.enabled()) {
    TESSERA_RETURN_IF_ERROR(measure_speculation_row_costs(sc, *group, mc.vocab));
    if (signals.requested()) return interrupted_setup(signals, "measuring step costs");
  }

  EngineServiceOptions eo;
  eo.scheduler = sc;
  eo.vocab_size = mc.vocab;
  eo.max_queued_requests = c.server.max_queued_requests;
  // While a rank is lost (and restarting) requests wait for the group instead of failing.
  eo.executor_ready = [g] { return g->is_complete(); };
  eo.executor_wait = std::chrono::seconds(c.server.worker_restart_wait_s);
  EngineService service(eo, *group, model.tokenizer.get());
  std::atomic<bool> engine_started{false};
  // The front end calls it once it takes requests: they queue until the engine starts.
  auto start_engine = [&]() -> StatusOr<bool> {
    if (c.server.warm_up && !warm_before_serving) {
      StatusOr<bool> warmed = warm_up_workers(sc, *group, mc.vocab, embeddings_only, signals,
                                              [&service] { return service.has_untaken_submissions(); });
      if (!warmed.is_ok() || !*warmed) {
        service.drain_and_stop(std::chrono::milliseconds(0));  // what came meanwhile ends, answered
        return warmed;
      }
    }
    service.start();
    engine_started = true;
    return true;
  };

  Status served;
  {
    std::optional<WorkerSupervisor> supervisor;
    // A rank told to restart with the group gets as long as the group allows a silence to
    // exit on its own before it is killed.
    const auto silence_limit = std::chrono::milliseconds(int64_t{c.server.heartbeat_ms} * c.server.heartbeat_misses);
    if (o.spawn_workers) supervisor.emplace(workers, *group, silence_limit);
    // The adapters served, shared by every front end (and changed at run time).
    auto loras = std::make_shared<ServedLoras>(c.lora.adapters);
    EngineStack stack{c, service, model.tokenizer.get(), served_api_context(c, loras, model, service), signals,
                      [&c, &model, loras, g](std::shared_ptr<const ReplyCounter> zmq_replies) {
                        HttpServerOptions ho = http_server_options(c, loras, {}, model, std::move(zmq_replies));
                        ho.collectives = [g] { return g->collectives(); };
                        return ho;
                      },
                      [g, &engine_started] { return engine_started && g->is_complete(); },
                      start_engine};
    served = front_end(stack);
    // However the front end ended, no request is left running when the workers go.
    service.drain_and_stop(std::chrono::milliseconds(0));
  }  // the supervisor stops before the workers do
  group->shutdown("server shutting down");
  workers.stop();
  tmp.remove();
  signals.set_handler(nullptr);  // it may use `service`, which goes before handler_reset does
  return served;
}

Status serve(ServeOptions o) {
  // A server's first answer should not wait for its weights' 2 MiB pages (common/huge_pages.h).
  if (o.config.model.weights_huge_pages == WeightHugePages::kAuto) {
    o.config.model.weights_huge_pages = WeightHugePages::kAfterStart;
  }
  std::vector<std::string> api_keys;
  const auto read_keys = [&api_keys](const TesseraConfig& c) -> Status {
    TESSERA_ASSIGN_OR_RETURN(api_keys, configured_api_keys(c.server.http));
    return Status::ok();
  };
  const auto front_end = [&api_keys](EngineStack& stack) -> Status {
    const TesseraConfig& c = stack.config;
    EngineService& service = stack.service;
    auto zmq_replies = std::make_shared<ReplyCounter>();  // shared: /metrics shows the ZeroMQ API's replies
    HttpServerOptions ho = stack.http_options(zmq_replies);
    ho.api_keys = api_keys;
    HttpServer http(ho, service, stack.tokenizer);
    http.ready_check = stack.ready;
    TESSERA_RETURN_IF_ERROR(http.start());
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<ZmqClientServer> zmq_clients,
                             start_zmq_clients(c, ho, zmq_replies, service, stack.tokenizer));
    // Requests are taken from here on (answered once the engine starts); the "listening on"
    // line says the server is warm and serving.
    TESSERA_LOG_INFO("taking requests on http://{}:{} (answered once the engine starts)", ho.host, http.port());
    TESSERA_ASSIGN_OR_RETURN(const bool started, stack.start_engine());
    if (!started) return Status::ok();
    TESSERA_LOG_INFO("listening on http://{}:{}", ho.host, http.port());
    // Serving. The first signal drains, a second one cuts the drain short.
    const int drain_seconds = c.server.drain_timeout_s;
    stack.signals.set_handler([&service](int sig, int count) {
      if (count == 1) return;  // the main thread drains
      TESSERA_LOG_WARN("signal {} again: ending the drain now", sig);
      service.drain_and_stop(std::chrono::milliseconds(0));
    });
    stack.signals.wait();
    TESSERA_LOG_INFO("signal {}: draining (up to {} s), new requests get 503", stack.signals.signal(), drain_seconds);
    drain(http, zmq_clients.get(), service, drain_seconds);
    stack.signals.set_handler(nullptr);  // it uses `service`
    return Status::ok();
  };
  TESSERA_RETURN_IF_ERROR(run_engine_stack(std::move(o), front_end, read_keys));
  TESSERA_LOG_INFO("stopped");
  return Status::ok();
}

}  // namespace tessera
