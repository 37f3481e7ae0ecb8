#include "common/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "common/config_values.h"
#include "common/input_file.h"
#include "common/step_plan.h"
#include "common/string_util.h"
#include "common/tokenizer/regex.h"

namespace tessera {
namespace {

using namespace config_values;  // NOLINT: the schema below is written in its readers

// ---- the schema ---------------------------------------------------------------------------

using Setter = std::function<Status(TesseraConfig&, const YAML::Node&, const Where&)>;
using Emitter = std::function<void(const TesseraConfig&, YAML::Emitter&)>;
// Adds one entry to a map-valued key (--set parallel.auto_tp.keep_linear.gate=mixtral).
using EntrySetter = std::function<Status(TesseraConfig&, const std::string&, const YAML::Node&, const Where&)>;

// A CORS origin as browsers send it in "Origin": "*" or scheme://host[:port], nothing after.
Status check_cors_origin(const std::string& origin) {
  if (origin == "*") return Status::ok();
  const size_t scheme_end = origin.find("://");
  const std::string scheme = scheme_end == std::string::npos ? "" : origin.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https")
    return invalid_argument("'" + origin + "' is not an origin: expected \"*\" or http(s)://HOST[:PORT]");
  const std::string rest = origin.substr(scheme_end + 3);
  if (rest.empty() || rest.find_first_of("/?#") != std::string::npos)
    return invalid_argument("'" + origin + "' is not an origin: expected http(s)://HOST[:PORT] with no path");
  return Status::ok();
}

struct KeyDef {
  std::string path;
  bool raw_string = false;  // a --set value is taken verbatim, not parsed as YAML
  Setter set;
  Emitter emit;
  EntrySetter set_entry;  // map-valued keys only
};

std::string shortest(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, end);
}

void emit_string_list(YAML::Emitter& out, const std::vector<std::string>& v) {
  out << YAML::Flow << YAML::BeginSeq;
  for (const auto& s : v) out << YAML::DoubleQuoted << s;
  out << YAML::EndSeq;
}

void emit_string_map(YAML::Emitter& out, const std::map<std::string, std::string>& m) {
  out << YAML::Flow << YAML::BeginMap;
  for (const auto& [k, v] : m) out << YAML::Key << YAML::DoubleQuoted << k << YAML::Value << YAML::DoubleQuoted << v;
  out << YAML::EndMap;
}

const std::vector<std::pair<const char*, DType>> kDtypes = {
    {"float32", DType::kF32}, {"float16", DType::kF16}, {"bfloat16", DType::kBF16}};
const std::vector<std::pair<const char*, WeightQuantization>> kQuantizations = {
    {"auto", WeightQuantization::kAuto}, {"none", WeightQuantization::kNone}, {"int8", WeightQuantization::kInt8},
    {"int4", WeightQuantization::kInt4}};
const std::vector<std::pair<const char*, Bf16Coding>> kBf16Codings = {
    {"auto", Bf16Coding::kAuto}, {"on", Bf16Coding::kOn}, {"off", Bf16Coding::kOff}};
const std::vector<std::pair<const char*, CollectivesKind>> kCollectives = {{"auto", CollectivesKind::kAuto},
                                                                          {"shm", CollectivesKind::kShm},
                                                                          {"gloo", CollectivesKind::kGloo},
                                                                          {"nccl", CollectivesKind::kNccl}};
const std::vector<std::pair<const char*, WeightStreaming>> kWeightStreamings = {
    {"map", WeightStreaming::kMap}, {"read", WeightStreaming::kRead}, {"direct", WeightStreaming::kDirect}};
const std::vector<std::pair<const char*, WeightHugePages>> kWeightHugePages = {
    {"auto", WeightHugePages::kAuto}, {"load", WeightHugePages::kLoad}, {"after_start", WeightHugePages::kAfterStart}};
const std::vector<std::pair<const char*, SpeculativeConfig::Method>>& kSpeculativeMethods = speculative_method_names();
const std::vector<std::pair<const char*, BatchingMode>> kModes = {
    {"continuous", BatchingMode::kContinuous}, {"static", BatchingMode::kStatic}};
const std::vector<std::pair<const char*, std::string>> kToolCallParsers = {
    {"auto", "auto"},       {"hermes", "hermes"}, {"llama3_json", "llama3_json"},
    {"mistral", "mistral"}, {"openai", "openai"}, {"none", "none"}};
const std::vector<std::pair<const char*, std::string>> kReasoningParsers = {
    {"auto", "auto"}, {"deepseek_r1", "deepseek_r1"}, {"qwen3", "qwen3"}, {"gpt_oss", "gpt_oss"}, {"none", "none"}};
const std::vector<std::pair<const char*, std::string>> kPoolings = {
    {"auto", "auto"}, {"last", "last"}, {"mean", "mean"}, {"cls", "cls"}};
const std::vector<std::pair<const char*, std::string>> kNormalize = {{"auto", "auto"}, {"true", "true"}, {"false", "false"}};
const std::vector<std::pair<const char*, std::string>> kTasks = {{"generate", "generate"}, {"embed", "embed"}, {"both", "both"}};
const std::vector<std::pair<const char*, std::optional<BackendKind>>> kBackends = {
    {"auto", std::nullopt}, {"cpu", BackendKind::kCpu}, {"cuda", BackendKind::kCuda}};

#define TESSERA_INT_KEY(PATH, FIELD, LO, HI)                                                     \
  KeyDef {                                                                                       \
    PATH, false,                                                                                 \
        [](TesseraConfig& c, const YAML::Node& n, const Where& w) {                              \
          return read_int32(n, w, LO, HI, &c.FIELD);                                             \
        },                                                                                       \
        [](const TesseraConfig& c, YAML::Emitter& out) { out << c.FIELD; }, nullptr              \
  }
#define TESSERA_BOOL_KEY(PATH, FIELD)                                                             \
  KeyDef {                                                                                       \
    PATH, false,                                                                                 \
        [](TesseraConfig& c, const YAML::Node& n, const Where& w) { return read_bool(n, w, &c.FIELD); }, \
        [](const TesseraConfig& c, YAML::Emitter& out) { out << (c.FIELD ? "true" : "false"); }, nullptr \
  }
#define TESSERA_STRING_KEY(PATH, FIELD, READER)                                                   \
  KeyDef {                                                                                       \
    PATH, true,                                                                                  \
        [](TesseraConfig& c, const YAML::Node& n, const Where& w) { return READER(n, w, &c.FIELD); }, \
        [](const TesseraConfig& c, YAML::Emitter& out) { out << YAML::DoubleQuoted << c.FIELD; }, nullptr \
  }

template <typename E>
const char* enum_name(const std::vector<std::pair<const char*, E>>& names, E value) {
  for (const auto& [name, v] : names) {
    if (v == value) return name;
  }
  return "?";
}

#define TESSERA_ENUM_KEY(PATH, FIELD, NAMES)                                                      \
  KeyDef {                                                                                       \
    PATH, false,                                                                                 \
        [](TesseraConfig& c, const YAML::Node& n, const Where& w) { return read_enum(n, w, NAMES, &c.FIELD); }, \
        [](const TesseraConfig& c, YAML::Emitter& out) { out << enum_name(NAMES, c.FIELD); }, nullptr \
  }

// Map-valued key for auto_tp name -> model_type maps.
KeyDef string_map_key(const char* path, std::map<std::string, std::string> AutoTpSection::*field) {
  return KeyDef{
      path, false,
      [field](TesseraConfig& c, const YAML::Node& n, const Where& w) {
        return read_string_map(n, w, &(c.parallel.auto_tp.*field));
      },
      [field](const TesseraConfig& c, YAML::Emitter& out) { emit_string_map(out, c.parallel.auto_tp.*field); },
      [field](TesseraConfig& c, const std::string& entry, const YAML::Node& n, const Where& w) {
        std::string v;
        TESSERA_RETURN_IF_ERROR(read_string(n, w, &v));
        if (v.empty()) return w.error("expected a model_type");
        (c.parallel.auto_tp.*field)[entry] = v;
        return Status::ok();
      }};
}

// A lora.adapters entry: a name a request's "model" can carry, and a folder or GGUF file.
Status check_lora_entry(const std::string& name, const std::string& path, const Where& w) {
  if (!valid_lora_name(name))
    return w.error("adapter name \"" + name + "\" must be 1 to 128 characters of letters, digits and . _ - : /");
  if (path.empty()) return w.error("adapter \"" + name + "\" needs its PEFT folder or GGUF adapter file");
  return Status::ok();
}

// In file order; sections are the dotted prefixes.
const std::vector<KeyDef>& schema() {
  static const std::vector<KeyDef> keys = {
      TESSERA_STRING_KEY("model.path", model.path, read_string),
      TESSERA_ENUM_KEY("model.dtype", model.dtype, kDtypes),
      TESSERA_BOOL_KEY("model.kernel_inject", model.kernel_inject),
      TESSERA_ENUM_KEY("model.pooling", model.pooling, kPoolings),
      TESSERA_ENUM_KEY("model.normalize", model.normalize, kNormalize),
      TESSERA_ENUM_KEY("model.quantization", model.quantization, kQuantizations),
      KeyDef{"model.quantization_group", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               const std::optional<int> v = n.IsScalar() ? parse_quant_group(n.Scalar()) : std::nullopt;
               if (!v) return w.error("expected \"auto\" or a multiple of 32 in [32, 256], got " + w.got(n));
               c.model.quantization_group = *v;
               return Status::ok();
             },
             [](const TesseraConfig& c, YAML::Emitter& out) { out << quant_group_name(c.model.quantization_group); },
             nullptr},
      TESSERA_ENUM_KEY("model.bf16_coding", model.bf16_coding, kBf16Codings),
      KeyDef{"model.check_weights", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               if (n.IsScalar() && n.Scalar() == "auto") {
                 c.model.check_weights.reset();
                 return Status::ok();
               }
               bool v = false;
               if (!read_bool(n, w, &v).is_ok()) return w.error("expected auto, true or false, got " + w.got(n));
               c.model.check_weights = v;
               return Status::ok();
             },
             [](const TesseraConfig& c, YAML::Emitter& out) {
               if (c.model.check_weights) {
                 out << (*c.model.check_weights ? "true" : "false");
               } else {
                 out << "auto";
               }
             },
             nullptr},
      KeyDef{"model.weights_memory_budget", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               if (!n.IsScalar()) return w.error("expected all, a byte count or a share such as 25%, got " + w.got(n));
               StatusOr<WeightsBudget> b = parse_weights_budget(n.Scalar());
               if (!b.is_ok()) return w.error(b.status().message());
               c.model.weights_memory_budget = *b;
               return Status::ok();
             },
             [](const TesseraConfig& c, YAML::Emitter& out) { out << c.model.weights_memory_budget.to_string(); },
             nullptr},
      TESSERA_STRING_KEY("model.weights_spill_dir", model.weights_spill_dir, read_string),
      TESSERA_STRING_KEY("model.weights_cache_dir", model.weights_cache_dir, read_string),
      TESSERA_INT_KEY("model.weights_prefetch_layers", model.weights_prefetch_layers, 1, 64),
      TESSERA_ENUM_KEY("model.weights_streaming", model.weights_streaming, kWeightStreamings),
      TESSERA_ENUM_KEY("model.weights_huge_pages", model.weights_huge_pages, kWeightHugePages),
      KeyDef{"model.quantization_rules", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               return read_quant_rules(n, w, &c.model.quantization_rules);
             },
             [](const TesseraConfig& c, YAML::Emitter& out) {
               out << YAML::BeginSeq;
               for (const auto& r : c.model.quantization_rules) {
                 out << YAML::Flow << YAML::BeginMap << YAML::Key << "match" << YAML::Value << YAML::DoubleQuoted
                     << r.match << YAML::Key << "quantize" << YAML::Value << weight_quantization_name(r.quantize)
                     << YAML::EndMap;
               }
               out << YAML::EndSeq;
             },
             nullptr},
      TESSERA_INT_KEY("parallel.tensor_parallel", parallel.tensor_parallel, 1, 1024),
      string_map_key("parallel.auto_tp.all_reduce_linear", &AutoTpSection::all_reduce_linear),
      string_map_key("parallel.auto_tp.keep_linear", &AutoTpSection::keep_linear),
      KeyDef{"parallel.auto_tp.rules", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               return read_rules(n, w, &c.parallel.auto_tp.rules);
             },
             [](const TesseraConfig& c, YAML::Emitter& out) {
               out << YAML::BeginSeq;
               for (const auto& r : c.parallel.auto_tp.rules) {
                 out << YAML::Flow << YAML::BeginMap << YAML::Key << "match" << YAML::Value << YAML::DoubleQuoted
                     << r.match << YAML::Key << "role" << YAML::Value << tp_role_name(r.role) << YAML::EndMap;
               }
               out << YAML::EndSeq;
             },
             nullptr},
      KeyDef{"parallel.injection_policy", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               return read_policy(n, w, &c.parallel.injection_policy);
             },
             [](const TesseraConfig& c, YAML::Emitter& out) {
               out << YAML::BeginMap;
               for (const auto& [block, linears] : c.parallel.injection_policy) {
                 out << YAML::Key << block << YAML::Value;
                 emit_string_list(out, linears);
               }
               out << YAML::EndMap;
             },
             [](TesseraConfig& c, const std::string& entry, const YAML::Node& n, const Where& w) {
               return read_string_list(n, w, true, &c.parallel.injection_policy[entry]);
             }},
      TESSERA_INT_KEY("cache.block_size", cache.block_size, 1, 4096),
      KeyDef{"cache.num_blocks", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               if (n.IsScalar() && n.Scalar() == "auto") {
                 c.cache.num_blocks.reset();
                 return Status::ok();
               }
               int64_t v = 0;
               Status st = read_int(n, w, 1, int64_t{1} << 40, &v);
               if (!st.is_ok()) return w.error("expected \"auto\" or an integer >= 1, got " + w.got(n));
               c.cache.num_blocks = v;
               return Status::ok();
             },
             [](const TesseraConfig& c, YAML::Emitter& out) {
               if (c.cache.num_blocks) {
                 out << *c.cache.num_blocks;
               } else {
                 out << "auto";
               }
             },
             nullptr},
      KeyDef{"cache.memory_fraction", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               return read_fraction(n, w, &c.cache.memory_fraction);
             },
             [](const TesseraConfig& c, YAML::Emitter& out) { out << shortest(c.cache.memory_fraction); }, nullptr},
      KeyDef{"cache.cpu_kv_bytes", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               if (n.IsScalar() && n.Scalar() == "auto") {
                 c.cache.cpu_kv_bytes.reset();
                 return Status::ok();
               }
               int64_t v = 0;
               Status st = read_int(n, w, 1, int64_t{1} << 50, &v);
               if (!st.is_ok()) {
                 return w.error("expected \"auto\" or a byte count from 1 to 2^50 (an integer), got " + w.got(n));
               }
               c.cache.cpu_kv_bytes = v;
               return Status::ok();
             },
             [](const TesseraConfig& c, YAML::Emitter& out) {
               if (c.cache.cpu_kv_bytes) {
                 out << *c.cache.cpu_kv_bytes;
               } else {
                 out << "auto";
               }
             },
             nullptr},
      TESSERA_INT_KEY("scheduler.max_num_seqs", scheduler.max_num_seqs, 1, 65536),
      TESSERA_INT_KEY("scheduler.max_num_batched_tokens", scheduler.max_num_batched_tokens, 1, 1 << 24),
      TESSERA_BOOL_KEY("scheduler.chunked_prefill", scheduler.chunked_prefill),
      TESSERA_BOOL_KEY("scheduler.prefix_caching", scheduler.prefix_caching),
      KeyDef{"scheduler.max_decode_slowdown", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               return read_slowdown(n, w, &c.scheduler.max_decode_slowdown);
             },
             [](const TesseraConfig& c, YAML::Emitter& out) { out << shortest(c.scheduler.max_decode_slowdown); },
             nullptr},
      KeyDef{"scheduler.max_tpot_slowdown", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               return read_slowdown(n, w, &c.scheduler.max_tpot_slowdown);
             },
             [](const TesseraConfig& c, YAML::Emitter& out) { out << shortest(c.scheduler.max_tpot_slowdown); },
             nullptr},
      TESSERA_INT_KEY("scheduler.structured_mask_budget_ms", scheduler.structured_mask_budget_ms, 0, 60000),
      KeyDef{"scheduler.max_model_len", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               if (n.IsNull()) {
                 c.scheduler.max_model_len.reset();
                 return Status::ok();
               }
               int64_t v = 0;
               TESSERA_RETURN_IF_ERROR(read_int(n, w, 1, 1 << 24, &v));
               c.scheduler.max_model_len = v;
               return Status::ok();
             },
             [](const TesseraConfig& c, YAML::Emitter& out) {
               if (c.scheduler.max_model_len) {
                 out << *c.scheduler.max_model_len;
               } else {
                 out << YAML::Null;
               }
             },
             nullptr},
      TESSERA_ENUM_KEY("scheduler.mode", scheduler.mode, kModes),
      TESSERA_ENUM_KEY("speculative.method", speculative.method, kSpeculativeMethods),
      TESSERA_INT_KEY("speculative.num_tokens", speculative.num_tokens, 1, SeqStep::kMaxDraft),
      TESSERA_INT_KEY("speculative.ngram_min", speculative.ngram_min, 1, 64),
      TESSERA_INT_KEY("speculative.ngram_max", speculative.ngram_max, 1, 64),
      TESSERA_STRING_KEY("speculative.draft_model", speculative.draft_model, read_string),
      KeyDef{"speculative.draft_min_probability", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               return read_number(n, w, "a number in [0, 1)", [](double v) { return v >= 0.0 && v < 1.0; },
                                  &c.speculative.draft_min_probability);
             },
             [](const TesseraConfig& c, YAML::Emitter& out) { out << shortest(c.speculative.draft_min_probability); },
             nullptr},
      KeyDef{"lora.adapters", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               if (n.IsNull()) {
                 c.lora.adapters.clear();
                 return Status::ok();
               }
               if (!n.IsMap()) return w.error("expected a map of adapter name -> PEFT folder or GGUF adapter file, got " + w.got(n));
               std::map<std::string, std::string> m;
               for (const auto& kv : n) {
                 std::string name, path;
                 TESSERA_RETURN_IF_ERROR(read_string(kv.first, w, &name));
                 const Where cw = w.child("." + name, kv.second);
                 TESSERA_RETURN_IF_ERROR(read_string(kv.second, cw, &path));
                 TESSERA_RETURN_IF_ERROR(check_lora_entry(name, path, cw));
                 m[name] = path;
               }
               c.lora.adapters = std::move(m);
               return Status::ok();
             },
             [](const TesseraConfig& c, YAML::Emitter& out) { emit_string_map(out, c.lora.adapters); },
             [](TesseraConfig& c, const std::string& entry, const YAML::Node& n, const Where& w) {
               std::string path;
               TESSERA_RETURN_IF_ERROR(read_string(n, w, &path));
               TESSERA_RETURN_IF_ERROR(check_lora_entry(entry, path, w));
               c.lora.adapters[entry] = path;
               return Status::ok();
             }},
      TESSERA_INT_KEY("lora.max_rank", lora.max_rank, 1, 4096),
      TESSERA_INT_KEY("lora.max_loras", lora.max_loras, 0, 4096),
      TESSERA_BOOL_KEY("lora.runtime_updates", lora.runtime_updates),
      TESSERA_STRING_KEY("server.http.host", server.http.host, read_string),
      TESSERA_INT_KEY("server.http.port", server.http.port, 0, 65535),
      KeyDef{"server.http.api_keys", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               if (n.IsNull()) {
                 c.server.http.api_keys.clear();
                 return Status::ok();
               }
               return read_string_list(n, w, false, &c.server.http.api_keys);
             },
             [](const TesseraConfig& c, YAML::Emitter& out) { emit_string_list(out, c.server.http.api_keys); },
             nullptr},
      TESSERA_STRING_KEY("server.http.api_keys_file", server.http.api_keys_file, read_string),
      KeyDef{"server.http.max_body_bytes", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               return read_int(n, w, 1024, int64_t{1} << 34, &c.server.http.max_body_bytes);
             },
             [](const TesseraConfig& c, YAML::Emitter& out) { out << c.server.http.max_body_bytes; }, nullptr},
      // Connection limits and CORS (the HTTP front end's edges).
      TESSERA_INT_KEY("server.http.max_connections", server.http.max_connections, 0, 1000000),
      TESSERA_INT_KEY("server.http.idle_timeout_s", server.http.idle_timeout_s, 1, 86400),
      TESSERA_INT_KEY("server.http.header_timeout_s", server.http.header_timeout_s, 1, 3600),
      KeyDef{"server.http.cors_origins", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               if (n.IsNull()) {
                 c.server.http.cors_origins.clear();
                 return Status::ok();
               }
               std::vector<std::string> origins;
               TESSERA_RETURN_IF_ERROR(read_string_list(n, w, false, &origins));
               for (size_t i = 0; i < origins.size(); ++i) {
                 if (Status st = check_cors_origin(origins[i]); !st.is_ok())
                   return w.child("[" + std::to_string(i) + "]", n[i]).error(st.message());
               }
               c.server.http.cors_origins = std::move(origins);
               return Status::ok();
             },
             [](const TesseraConfig& c, YAML::Emitter& out) { emit_string_list(out, c.server.http.cors_origins); },
             nullptr},
      TESSERA_STRING_KEY("server.zmq_client", server.zmq_client, read_optional_endpoint),
      TESSERA_STRING_KEY("server.control", server.control, read_endpoint),
      TESSERA_INT_KEY("server.heartbeat_ms", server.heartbeat_ms, 10, 3600000),
      TESSERA_INT_KEY("server.heartbeat_misses", server.heartbeat_misses, 1, 1000),
      TESSERA_INT_KEY("server.max_queued_requests", server.max_queued_requests, 1, 1 << 24),
      TESSERA_INT_KEY("server.drain_timeout_s", server.drain_timeout_s, 0, 86400),
      TESSERA_INT_KEY("server.worker_restart_wait_s", server.worker_restart_wait_s, 0, 86400),
      TESSERA_BOOL_KEY("server.warm_up", server.warm_up),
      TESSERA_STRING_KEY("server.chat_template", server.chat_template, read_string),
      TESSERA_ENUM_KEY("server.tool_call_parser", server.tool_call_parser, kToolCallParsers),
      TESSERA_ENUM_KEY("server.reasoning_parser", server.reasoning_parser, kReasoningParsers),
      TESSERA_ENUM_KEY("server.task", server.task, kTasks),
      TESSERA_INT_KEY("server.responses.max_stored", server.responses_max_stored, 0, 1000000),
      TESSERA_INT_KEY("server.responses.max_age_s", server.responses_max_age_s, 1, 30 * 86400),
      TESSERA_STRING_KEY("server.batch_dir", server.batch_dir, read_string),
      TESSERA_BOOL_KEY("server.curve.enabled", server.curve.enabled),
      TESSERA_STRING_KEY("server.curve.server_public_key_file", server.curve.server_public_key_file, read_string),
      TESSERA_STRING_KEY("server.curve.server_secret_key_file", server.curve.server_secret_key_file, read_string),
      TESSERA_STRING_KEY("server.curve.client_secret_key_file", server.curve.client_secret_key_file, read_string),
      TESSERA_STRING_KEY("server.curve.allowed_client_keys_file", server.curve.allowed_client_keys_file,
                         read_string),
      TESSERA_BOOL_KEY("server.curve.client_api", server.curve.client_api),
      TESSERA_ENUM_KEY("worker.backend", worker.backend, kBackends),
      TESSERA_INT_KEY("worker.threads", worker.threads, 0, 4096),
      KeyDef{"worker.memory_limit_bytes", false,
             [](TesseraConfig& c, const YAML::Node& n, const Where& w) {
               return read_int(n, w, 0, int64_t{1} << 50, &c.worker.memory_limit_bytes);
             },
             [](const TesseraConfig& c, YAML::Emitter& out) { out << c.worker.memory_limit_bytes; }, nullptr},
      TESSERA_STRING_KEY("worker.control_address", worker.control_address, read_optional_endpoint),
      TESSERA_ENUM_KEY("worker.collectives", worker.collectives, kCollectives),
      TESSERA_STRING_KEY("worker.collectives_address", worker.collectives_address, read_string),
      TESSERA_STRING_KEY("worker.collectives_interface", worker.collectives_interface, read_string),
      // The CPU kernels' switches (common/kernel_options.h; the TESSERA_CPU_* variables override them).
      TESSERA_ENUM_KEY("worker.cpu.isa", worker.cpu.isa, cpu_isa_names()),
      TESSERA_ENUM_KEY("worker.cpu.gemm", worker.cpu.gemm, cpu_gemm_names()),
      TESSERA_BOOL_KEY("worker.cpu.bf16_dot", worker.cpu.bf16_dot),
      TESSERA_BOOL_KEY("worker.cpu.int8_x16", worker.cpu.int8_x16),
      TESSERA_BOOL_KEY("worker.cpu.int8_dot", worker.cpu.int8_dot),
      TESSERA_ENUM_KEY("worker.cpu.attention", worker.cpu.attention, cpu_attention_names()),
      TESSERA_BOOL_KEY("worker.cpu.pin_threads", worker.cpu.pin_threads),
  };
  return keys;
}

const KeyDef* find_key(const std::string& path) {
  for (const KeyDef& k : schema()) {
    if (k.path == path) return &k;
  }
  return nullptr;
}

// Direct children of a section ("" is the root), in file order.
std::vector<std::string> children_of(const std::string& section) {
  std::vector<std::string> out;
  const std::string prefix = section.empty() ? "" : section + ".";
  for (const KeyDef& k : schema()) {
    if (k.path.rfind(prefix, 0) != 0) continue;
    std::string rest = k.path.substr(prefix.size());
    std::string child = rest.substr(0, rest.find('.'));
    if (std::find(out.begin(), out.end(), child) == out.end()) out.push_back(child);
  }
  return out;
}

bool is_section(const std::string& path) { return !path.empty() && !children_of(path).empty() && !find_key(path); }

Status walk(TesseraConfig& config, const YAML::Node& node, const std::string& section, const Where& w) {
  if (node.IsNull()) return Status::ok();  // "server:" with nothing under it
  if (!node.IsMap()) {
    std::string keys;
    for (const auto& c : children_of(section)) keys += (keys.empty() ? "" : ", ") + c;
    return w.error("expected a map with keys " + keys + ", got " + w.got(node));
  }
  std::set<std::string> seen;
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) return w.error("expected scalar keys, got " + w.got(kv.first));
    const std::string key = kv.first.Scalar();
    const std::string path = section.empty() ? key : section + "." + key;
    Where kw{w.source, path, kv.first.Mark()};
    if (!seen.insert(key).second) return kw.error("duplicate key");
    if (const KeyDef* def = find_key(path)) {
      kw.mark = kv.second.Mark().is_null() ? kv.first.Mark() : kv.second.Mark();
      TESSERA_RETURN_IF_ERROR(def->set(config, kv.second, kw));
      config.keys_given.insert(path);
    } else if (is_section(path)) {
      TESSERA_RETURN_IF_ERROR(walk(config, kv.second, path, kw));
    } else {
      return kw.error("unknown key" + suggestion(key, children_of(section)));
    }
  }
  return Status::ok();
}

}  // namespace

StatusOr<TesseraConfig> parse_config_yaml(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    std::string where = source;
    if (!e.mark.is_null()) where += ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1);
    return invalid_argument(where + ": YAML syntax error: " + e.msg);
  }
  TesseraConfig config;
  config.source = source;
  if (!root.IsNull() && !root.IsMap()) {
    return invalid_argument(source + ": expected a map of sections (model, parallel, cache, scheduler, server, "
                                     "worker) at the top level, got " + describe(root));
  }
  TESSERA_RETURN_IF_ERROR(walk(config, root, "", Where{source, "", YAML::Mark::null_mark()}));
  return config;
}

StatusOr<TesseraConfig> load_config_file(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, read_input_file(path, "the configuration file"));
  return parse_config_yaml(text, path);
}

Status apply_override(TesseraConfig& config, const std::string& dotted_key, const std::string& value) {
  // Not the value: it may be a secret; the key path (every error names it) says which flag.
  const std::string source = "--set";
  Where w{source, dotted_key, YAML::Mark::null_mark()};
  auto parse_value = [&](bool raw, YAML::Node* out) -> Status {
    if (raw) {  // a string: YAML quoting is honoured, anything else is taken verbatim
      try {
        YAML::Node n = YAML::Load(value);
        *out = n.IsScalar() ? n : YAML::Node(value);
      } catch (const YAML::Exception&) {
        *out = YAML::Node(value);
      }
      return Status::ok();
    }
    try {
      *out = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      return w.error("value is not valid YAML: " + e.msg);
    }
    return Status::ok();
  };
  if (const KeyDef* def = find_key(dotted_key)) {
    YAML::Node node;
    TESSERA_RETURN_IF_ERROR(parse_value(def->raw_string, &node));
    TESSERA_RETURN_IF_ERROR(def->set(config, node, w));
    config.keys_given.insert(dotted_key);
    return Status::ok();
  }
  for (const KeyDef& def : schema()) {
    if (def.set_entry && dotted_key.rfind(def.path + ".", 0) == 0) {
      const std::string entry = dotted_key.substr(def.path.size() + 1);
      if (entry.empty()) break;
      YAML::Node node;
      TESSERA_RETURN_IF_ERROR(parse_value(false, &node));
      TESSERA_RETURN_IF_ERROR(def.set_entry(config, entry, node, w));
      config.keys_given.insert(def.path);
      return Status::ok();
    }
  }
  if (is_section(dotted_key)) {
    std::string keys;
    for (const auto& c : children_of(dotted_key)) keys += (keys.empty() ? "" : ", ") + c;
    return w.error("is a section; set one of its keys (" + keys + ")");
  }
  // Name the first component that is not a key or section.
  std::string section;
  size_t start = 0;
  while (true) {
    size_t dot = dotted_key.find('.', start);
    std::string comp = dotted_key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    std::string path = section.empty() ? comp : section + "." + comp;
    if (dot == std::string::npos || !is_section(path)) {
      w.path = path;
      if (find_key(path)) return w.error("is not a section; it has no key '" + dotted_key.substr(dot + 1) + "'");
      return w.error("unknown key" + suggestion(comp, children_of(section)));
    }
    section = path;
    start = dot + 1;
  }
}

Status compile_tp_rule_regex(TpRuleConfig* rule) {
  StatusOr<std::shared_ptr<const tok::Regex>> re = tok::Regex::compile_pcre2(rule->match);
  if (!re.is_ok()) return invalid_argument("invalid regular expression (PCRE2 syntax): " + re.status().message());
  rule->regex = std::move(re).value();
  return Status::ok();
}

Status compile_quant_rule_regex(QuantRuleConfig* rule) {
  StatusOr<std::shared_ptr<const tok::Regex>> re = tok::Regex::compile_pcre2(rule->match);
  if (!re.is_ok()) return invalid_argument("invalid regular expression (PCRE2 syntax): " + re.status().message());
  rule->regex = std::move(re).value();
  return Status::ok();
}

QuantizationOptions quantization_options(const ModelSection& model) {
  QuantizationOptions q;
  q.kind = model.quantization;
  q.group = model.quantization_group;
  q.rules = model.quantization_rules;
  q.bf16_coding = model.bf16_coding;
  for (QuantRuleConfig& r : q.rules) {
    if (!r.regex) (void)compile_quant_rule_regex(&r);  // validate_config reported a bad one
  }
  return q;
}

Status apply_override_arg(TesseraConfig& config, const std::string& key_equals_value) {
  size_t eq = key_equals_value.find('=');
  if (eq == std::string::npos || eq == 0) {
    // Not echoed: an argument without '=' may be a misplaced secret.
    return invalid_argument("--set: expected KEY=VALUE (e.g. parallel.tensor_parallel=2), got an argument of " +
                            std::to_string(key_equals_value.size()) + " characters without '='");
  }
  return apply_override(config, key_equals_value.substr(0, eq), key_equals_value.substr(eq + 1));
}

Status validate_config(const TesseraConfig& c) {
  const std::string& src = c.source;
  if (c.model.path.empty()) {
    return invalid_argument(src + ": model.path: required (a Hugging Face model folder or a DeepSpeed "
                                  "checkpoint JSON)");
  }
  for (size_t i = 0; i < c.parallel.auto_tp.rules.size(); ++i) {
    TpRuleConfig rule = c.parallel.auto_tp.rules[i];
    if (rule.regex) continue;  // compiled when read
    if (Status st = compile_tp_rule_regex(&rule); !st.is_ok())
      return invalid_argument(src + ": parallel.auto_tp.rules[" + std::to_string(i) + "].match: " + st.message());
  }
  for (size_t i = 0; i < c.model.quantization_rules.size(); ++i) {
    QuantRuleConfig rule = c.model.quantization_rules[i];
    if (rule.regex) continue;  // compiled when read
    if (Status st = compile_quant_rule_regex(&rule); !st.is_ok())
      return invalid_argument(src + ": model.quantization_rules[" + std::to_string(i) + "].match: " + st.message());
  }
  if (Status st = validate_speculative_config(c.speculative); !st.is_ok()) return invalid_argument(src + ": " + st.message());
  if (c.server.task == "embed" && c.speculative.enabled())
    return invalid_argument(src + ": speculative.method: speculative decoding needs generation, and server.task is embed "
                                  "(set speculative.method: none, or server.task: both)");
  if (!c.model.quantization_rules.empty() && c.model.quantization != WeightQuantization::kInt8) {
    return invalid_argument(src + ": model.quantization_rules: given while model.quantization is " +
                            weight_quantization_name(c.model.quantization) +
                            " (set model.quantization: int8, or drop the rules)");
  }
  const auto& s = c.scheduler;
  if (s.max_num_batched_tokens < s.max_num_seqs) {
    return invalid_argument(src + ": scheduler.max_num_batched_tokens (" + std::to_string(s.max_num_batched_tokens) +
                            ") must be at least scheduler.max_num_seqs (" + std::to_string(s.max_num_seqs) +
                            "): every running sequence needs one token per step");
  }
  if (!s.chunked_prefill && s.max_model_len && s.max_num_batched_tokens < *s.max_model_len) {
    return invalid_argument(src + ": scheduler.max_num_batched_tokens (" + std::to_string(s.max_num_batched_tokens) +
                            ") is below scheduler.max_model_len (" + std::to_string(*s.max_model_len) +
                            ") with chunked_prefill off: a full-length prompt could never be scheduled");
  }
  // Two wildcard ports (tcp://host:*) are two different free ports.
  const bool wildcard = c.server.control.size() > 2 && c.server.control.compare(c.server.control.size() - 2, 2, ":*") == 0;
  if (c.server.zmq_client == c.server.control && !wildcard) {
    return invalid_argument(src + ": server.zmq_client and server.control must differ (both are " +
                            c.server.zmq_client + ")");
  }
  const CurveSection& cv = c.server.curve;
  if (cv.enabled) {
    // Each side checks its own files when it starts (the coordinator needs the secret key,
    // a worker the public one); the public key is what both share, so it is required here.
    if (cv.server_public_key_file.empty() && cv.server_secret_key_file.empty()) {
      return invalid_argument(src + ": server.curve.server_public_key_file: required when server.curve.enabled is "
                                    "true (the coordinator's public key, a Z85 file from tessera-curve-keygen)");
    }
  } else {
    // The file keys may stay set while CURVE is off (a deployment's config names the Secret's
    // mount paths once; turning CURVE on is then `enabled: true`).
    if (cv.client_api) {
      return invalid_argument(src + ": server.curve.client_api: true needs server.curve.enabled: true");
    }
  }
  return Status::ok();
}

std::string dump_config_yaml(const TesseraConfig& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::vector<std::string> open;  // sections currently open
  for (const KeyDef& def : schema()) {
    std::vector<std::string> parts;
    std::stringstream ss(def.path);
    for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
    size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common]) ++common;
    while (open.size() > common) {
      out << YAML::EndMap;
      open.pop_back();
    }
    for (size_t i = common; i + 1 < parts.size(); ++i) {
      out << YAML::Key << parts[i] << YAML::Value << YAML::BeginMap;
      open.push_back(parts[i]);
    }
    out << YAML::Key << parts.back() << YAML::Value;
    def.emit(config, out);
  }
  while (!open.empty()) {
    out << YAML::EndMap;
    open.pop_back();
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

const char* collectives_kind_name(CollectivesKind kind) { return enum_name(kCollectives, kind); }

bool valid_lora_name(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  return std::all_of(name.begin(), name.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) != 0 || ch == '.' || ch == '_' || ch == '-' || ch == ':' || ch == '/';
  });
}

bool is_secret_config_path(const std::string& path) {
  const std::string p = ascii_lower(path);
  return p.find("key") != std::string::npos || p.find("secret") != std::string::npos ||
         p.find("password") != std::string::npos;
}

std::vector<std::string> config_key_paths() {
  std::vector<std::string> out;
  for (const KeyDef& k : schema()) out.push_back(k.path);
  return out;
}

}  // namespace tessera
