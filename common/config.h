#pragma once
// The Tessera configuration file (../shared/DESIGN.md §5): one YAML document read by the
// coordinator and the workers. Every key has a default, every key can be overridden from the command
// line (`--set parallel.tensor_parallel=2`), and every error names the file (or the --set
// flag), the full dotted key path and what was expected. docs/configuration.md lists the keys.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/huge_pages.h"
#include "common/kernel_options.h"
#include "common/parallel_roles.h"
#include "common/quantization.h"
#include "common/weights_budget.h"
#include "common/speculative_config.h"
#include "common/status.h"

namespace tessera {
namespace tok {
class Regex;
}

struct ModelSection {
  std::string path;                 // HF folder or DeepSpeed checkpoint JSON; required
  DType dtype = DType::kF16;        // float32 | float16 | bfloat16
  bool kernel_inject = true;        // fused kernels; false = plain ops, same TP plan
  // Weight-only quantization of the linear layers at load time (docs/quantization.md).
  WeightQuantization quantization = WeightQuantization::kAuto;
  int quantization_group = kDefaultQuantGroup;   // input elements per scale; kAutoQuantGroup = "auto"
  std::vector<QuantRuleConfig> quantization_rules;  // first match wins, over the default choice
  Bf16Coding bf16_coding = Bf16Coding::kAuto;       // coded bf16 linear weights (common/quantization.h)
  // Refuse weights holding NaN or Inf at load, naming the tensor; nullopt = auto: for
  // checkpoints up to kCheckWeightsAutoBytes (worker/model_weights.h; the scan reads every
  // weight once more).
  std::optional<bool> check_weights;
  // Embeddings (/v1/embeddings, docs/api.md#embeddings): how the final hidden states are pooled,
  // last | mean | cls, and whether the vector is L2-normalised, true | false; "auto" = as the
  // folder's sentence-transformers files say (modules.json, 1_Pooling/config.json,
  // 2_Normalize), else last and normalised.
  std::string pooling = "auto";
  std::string normalize = "auto";
  // ZeRO-Inference on the CPU backend (worker/weight_residency.h): the bytes of a rank's weights
  // kept resident (all, a byte count or a share such as 25%); the rest is streamed layer by
  // layer from an unlinked spill file in weights_spill_dir ("" = $TMPDIR, else /var/tmp), or
  // from a cache file kept in weights_cache_dir for the next start (worker/weight_cache.h),
  // weights_prefetch_layers streamed units in flight (the one running and those read ahead),
  // brought in as weights_streaming says (map, read or direct; common/weights_budget.h).
  WeightsBudget weights_memory_budget;
  std::string weights_spill_dir;
  std::string weights_cache_dir;
  int weights_prefetch_layers = 2;
  WeightStreaming weights_streaming = WeightStreaming::kRead;
  // When a CPU rank's resident weights go onto 2 MiB pages (common/huge_pages.h): load,
  // after_start, or auto = after_start in tessera-serve (its first answer does not wait for
  // 2 MiB pages to be touched) and load in the tools that time or run steps right after
  // loading (tessera-bench, -generate, -perplexity, -batch), whose steps would run on 4 KiB
  // pages until the move.
  WeightHugePages weights_huge_pages = WeightHugePages::kAuto;
};
// The loader's view of the model section's quantization keys.
QuantizationOptions quantization_options(const ModelSection& model);

// One ordered auto-TP rule: the first rule whose regex matches a tensor name decides its role
// (column, row or keep; column on an embedding means its vocabulary rows).
struct TpRuleConfig {
  std::string match;  // PCRE2 regex, searched (unanchored) in the checkpoint tensor name
  TpRole role = TpRole::kKeep;
  // `match` compiled (common/tokenizer/regex.h) when the config is read, so it is compiled
  // once and shared by copies of the config; null for a rule built in code until
  // compile_tp_rule_regex() runs (the auto-TP planner compiles such rules itself).
  std::shared_ptr<const tok::Regex> regex;
  bool operator==(const TpRuleConfig& o) const { return match == o.match && role == o.role; }
};
// Compiles rule->match into rule->regex; InvalidArgument "invalid regular expression ..."
// with PCRE2's message and offset. Callers add where the rule is.
Status compile_tp_rule_regex(TpRuleConfig* rule);
// The same for a model.quantization_rules entry.
Status compile_quant_rule_regex(QuantRuleConfig* rule);

struct AutoTpSection {
  // DeepSpeed's DS_ALL_REDUCE_LINEAR_ITEMS / DS_KEEP_LINEAR_ITEMS as YAML:
  // linear name (suffix of the module path) -> model_type it applies to.
  std::map<std::string, std::string> all_reduce_linear;
  std::map<std::string, std::string> keep_linear;
  std::vector<TpRuleConfig> rules;
};

struct ParallelSection {
  int tensor_parallel = 1;
  AutoTpSection auto_tp;
  // DeepSpeed's injection_policy: block class name -> its row-parallel (all-reduced) linears;
  // the other linears of that block are column-parallel.
  std::map<std::string, std::vector<std::string>> injection_policy;
};

// cache.num_blocks "auto" sizes the pool from what the workers report when they register
// (coordinator/cluster/kv_pool_sizing.h): CUDA ranks give memory_fraction of their free device
// memory, CPU ranks cpu_kv_bytes; either less that rank's weights; the smallest rank wins.
struct CacheSection {
  int block_size = 16;                  // tokens per KV block
  std::optional<int64_t> num_blocks;    // nullopt = "auto" (sized from the workers' memory)
  double memory_fraction = 0.9;         // share of free device memory the KV cache may take (CUDA)
  // Bytes of KV cache a CPU rank may take; nullopt = "auto": min(2 GiB, 10% of the memory
  // the rank reports available). Either way at most what the rank reports, less its weights.
  std::optional<int64_t> cpu_kv_bytes;
};

struct SchedulerSection {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 4096;
  bool chunked_prefill = true;
  bool prefix_caching = true;
  std::optional<int64_t> max_model_len;  // nullopt = the model's max_position_embeddings
  BatchingMode mode = BatchingMode::kContinuous;
  // While sequences decode, a step's prompt tokens are capped so it takes at most this many
  // times the decodes alone (coordinator/engine/step_cost_model.h); 0 = no cap. Off by default since
  // max_tpot_slowdown bounds what streams average and, through each stream's credit, how long
  // any one step may stall them (docs/scheduler.md, "Decode latency budget").
  double max_decode_slowdown = 0.0;
  // Admission and prompt tokens so that no running sequence's mean time per output token is
  // predicted to exceed this many times a lone decode step; 0 = off.
  double max_tpot_slowdown = 1.75;
  // Engine time one step may spend computing structured-output masks (ms): a sequence whose
  // mask is not done by then sits out the step and its mask goes on in the next ones, so one
  // costly grammar cannot stall every other sequence; 0 = no limit (every step waits).
  int structured_mask_budget_ms = 50;
};

struct HttpSection {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> api_keys;   // empty = no authentication
  // A file of more keys, one per line (common/secret_file.h: its mode is checked), added to
  // api_keys when the server starts; "" = none.
  std::string api_keys_file;
  int64_t max_body_bytes = 1 << 20;     // largest accepted request body
  // Connection limits and CORS (docs/configuration.md, server.http.*).
  int max_connections = 0;              // open client connections (0 = what the fd limit allows); more get 503 at once
  int idle_timeout_s = 120;             // a kept-alive connection waiting for its next request
  int header_timeout_s = 10;            // from a request's first byte (a new connection: from accept) to its last header
  std::vector<std::string> cors_origins;  // browser origins allowed ("*" = any); empty = no CORS headers
};

// CURVE encryption and authentication of the ZeroMQ links (docs/configuration.md). Keys are
// Z85 text (40 characters) read from files, so secrets come from a mounted Secret and never
// sit in the YAML. One file may serve the coordinator and the workers: each reads only the
// files its side needs.
struct CurveSection {
  bool enabled = false;
  std::string server_public_key_file;     // the coordinator's public key (workers: required)
  std::string server_secret_key_file;     // the coordinator's secret key (coordinator: required)
  std::string client_secret_key_file;     // a worker's own secret key; "" = a fresh keypair per process
  std::string allowed_client_keys_file;   // coordinator: worker public keys let in; "" = any
  bool client_api = false;                // also encrypt the ZeroMQ client API (server.zmq_client)
};

struct ServerSection {
  HttpSection http;
  std::string zmq_client = "tcp://127.0.0.1:5555";  // ZeroMQ client API; "" = not served
  std::string control = "tcp://127.0.0.1:5560";
  int heartbeat_ms = 1000;
  int heartbeat_misses = 3;
  int max_queued_requests = 1024;  // requests waiting beyond this get 429 (queue_full)
  // SIGTERM/SIGINT: how long running requests may still run before they are cut (each then
  // ends with an error event, or a 503); new ones get 503 from the signal on.
  int drain_timeout_s = 30;
  // A rank lost (worker restarting): how long requests wait for the group to be whole again
  // before they get 503; 0 = at once.
  int worker_restart_wait_s = 30;
  // Before the first request: a few throwaway steps (the longest prefill chunk, a small
  // decode batch) so early requests do not pay for cold buffers (coordinator/engine/engine_warm_up.h).
  bool warm_up = true;
  // The chat template: "" = the model's own (tokenizer_config.json), or the built-in llama2
  // when it has none; a built-in name ("llama2", "chatml") or a template file's path
  // (relative to the working directory, as model.path) replaces it.
  std::string chat_template;
  // How tool calls are read out of generated text: auto (decided from the chat template) |
  // hermes | llama3_json | mistral | none.
  std::string tool_call_parser = "auto";
  // How a reasoning model's thoughts are told from its answer (chat reasoning_content):
  // auto (think tags when the chat template mentions <think> or </think>) | deepseek_r1 | qwen3 | none
  // (coordinator/api/reasoning/reasoning_parser.h).
  std::string reasoning_parser = "auto";
  // What the server answers: generate (completions, chat, responses) | embed (/v1/embeddings
  // only; the workers load no LM head) | both.
  std::string task = "both";
  // /v1/responses kept in memory for previous_response_id and GET /v1/responses/{id}: at
  // most this many (the oldest go first), none older than max_age_s.
  int responses_max_stored = 1000;
  int responses_max_age_s = 3600;
  // Where the Batch API (/v1/files, /v1/batches) keeps its files and batches, so that a
  // restart finds them (and reports the batches it cut as failed); "" = no Batch API.
  std::string batch_dir;
  CurveSection curve;
};

enum class CollectivesKind { kAuto, kShm, kGloo, kNccl };
const char* collectives_kind_name(CollectivesKind kind);  // "auto", "shm", "gloo", "nccl"

struct WorkerSection {
  std::optional<BackendKind> backend;  // nullopt = "auto" (common/parallel_roles.h)
  int threads = 0;  // CPU threads per worker; 0 = all cores (or OMP_NUM_THREADS)
  // The most memory this worker offers the KV cache and its weights: the free memory it
  // reports when it registers is min(what its device has free, this); 0 = no limit. For a
  // host or GPU shared with other programs.
  int64_t memory_limit_bytes = 0;
  // Where workers connect; "" = server.control (which is where the coordinator binds, e.g.
  // tcp://0.0.0.0:5560, while workers on other hosts need tcp://tessera-coordinator:5560).
  std::string control_address;
  // How the ranks of a tensor-parallel group reduce (worker/collective_group.h): auto =
  // shared memory where every rank shares one host and one /dev/shm, Gloo (TCP) between CPU
  // ranks otherwise, NCCL between GPU ranks. The coordinator's value holds for every rank.
  CollectivesKind collectives = CollectivesKind::kAuto;
  // Where this worker's Gloo connections listen (and its peers connect): an address or host
  // name, or a network interface whose address is used; both "" = the host's name (a pod's
  // name resolves to its IP). This worker's own configuration, not the coordinator's.
  std::string collectives_address;
  std::string collectives_interface;
  // The CPU backend's kernel choices (worker.cpu.*); the environment's TESSERA_CPU_*
  // variables override them when the worker resolves them (common/kernel_options.h).
  CpuKernelOptions cpu;
};

// LoRA adapters served beside the base model (docs/lora.md).
struct LoraSection {
  // Adapters loaded at start-up: the name a request's "model" picks -> its PEFT folder
  // (relative to the working directory, as model.path).
  std::map<std::string, std::string> adapters;
  // The largest adapter rank accepted; adapters above it are refused at load.
  int max_rank = 64;
  // > 0: at most this many adapters are resident on each worker at once, and so mixed into
  // one step (vLLM's max_loras). The others stay in host memory and are brought back (the
  // least recently used resident one leaving) when a sequence naming one is admitted; the
  // scheduler admits a sequence of a new adapter only while fewer than this many adapters run.
  // 0: every adapter served is resident.
  int max_loras = 0;
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter are served (vLLM's
  // VLLM_ALLOW_RUNTIME_LORA_UPDATING): off by default, since a client can then make the
  // server read any folder it can see.
  bool runtime_updates = false;
};

struct TesseraConfig {
  ModelSection model;
  ParallelSection parallel;
  CacheSection cache;
  SchedulerSection scheduler;
  SpeculativeConfig speculative;
  LoraSection lora;
  ServerSection server;
  WorkerSection worker;
  // Where the values came from, for messages: the file name, or "<defaults>".
  std::string source = "<defaults>";
  // The key paths the file or a --set gave a value (map-valued keys by their own path), so a
  // program can tell a default from the same value given on purpose: tessera-serve binds
  // free ports for server.control and server.zmq_client unless they were given.
  std::set<std::string> keys_given;
  bool gave(const std::string& key) const { return keys_given.count(key) != 0; }
};

// A LoRA adapter's name as served (lora.adapters, --lora NAME=PATH): 1 to 128 letters, digits
// and . _ - : / (a request's "model" carries it).
bool valid_lora_name(const std::string& name);

// Reads and parses a YAML file; messages start with `path`.
StatusOr<TesseraConfig> load_config_file(const std::string& path);
// Parses YAML text; `source` (a file name) starts every message. Absent keys keep their
// defaults; unknown keys, wrong types and out-of-range values are errors naming the key
// path. Cross-key checks are left to validate_config.
StatusOr<TesseraConfig> parse_config_yaml(const std::string& text, const std::string& source);
// Sets one key from a command-line `--set key=value`; `value` is YAML ("2", "auto",
// "[a, b]", "{w2: mixtral}", "null"). A key below a map-valued key adds one entry:
// `parallel.auto_tp.keep_linear.gate=mixtral`, `parallel.injection_policy.BloomBlock=[a, b]`.
Status apply_override(TesseraConfig& config, const std::string& dotted_key, const std::string& value);
// Splits "key=value" (the --set flag's argument) and applies it.
Status apply_override_arg(TesseraConfig& config, const std::string& key_equals_value);
// Checks across keys (model.path given, regexes compile, budgets consistent).
Status validate_config(const TesseraConfig& config);
// Every key with its current value, as YAML that parse_config_yaml reads back identically.
std::string dump_config_yaml(const TesseraConfig& config);
// All leaf key paths ("model.path", ...), in file order — for docs and `--help`.
std::vector<std::string> config_key_paths();
// Whether a key path's values are secrets that no error or log line may show: any component
// naming a key, secret or password ("server.http.api_keys", "server.curve.server_secret_key_file",
// a mistyped "server.http.api_key"). Errors about them give the value's shape, never the value.
bool is_secret_config_path(const std::string& path);

}  // namespace tessera
