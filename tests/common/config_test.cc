#include "common/config.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <zmq.h>

#include <filesystem>
#include <sstream>

#include "common/zmq/curve_keys.h"
#include "common/tokenizer/regex.h"
#include "tests/test_support.h"

namespace tessera {
namespace {

::testing::AssertionResult fails_with(const Status& st, const std::vector<std::string>& parts) {
  if (st.is_ok()) return ::testing::AssertionFailure() << "expected an error, got ok";
  for (const auto& p : parts) {
    if (st.message().find(p) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks \"" << p << "\": " << st.message();
    }
  }
  return ::testing::AssertionSuccess();
}

Status parse_status(const std::string& yaml) { return parse_config_yaml(yaml, "cfg.yaml").status(); }

TEST(ConfigTest, EmptyFileGivesDefaults) {
  auto c = parse_config_yaml("", "empty.yaml");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->source, "empty.yaml");
  EXPECT_EQ(c->model.dtype, DType::kF16);
  EXPECT_TRUE(c->model.kernel_inject);
  EXPECT_EQ(c->parallel.tensor_parallel, 1);
  EXPECT_TRUE(c->parallel.auto_tp.all_reduce_linear.empty());
  EXPECT_EQ(c->cache.block_size, 16);
  EXPECT_FALSE(c->cache.num_blocks.has_value());
  EXPECT_DOUBLE_EQ(c->cache.memory_fraction, 0.9);
  EXPECT_EQ(c->scheduler.max_num_seqs, 256);
  EXPECT_EQ(c->scheduler.max_num_batched_tokens, 4096);
  EXPECT_TRUE(c->scheduler.chunked_prefill);
  EXPECT_TRUE(c->scheduler.prefix_caching);
  EXPECT_FALSE(c->scheduler.max_model_len.has_value());
  EXPECT_EQ(c->scheduler.mode, BatchingMode::kContinuous);
  EXPECT_EQ(c->server.http.host, "127.0.0.1");
  EXPECT_EQ(c->server.http.port, 8000);
  EXPECT_TRUE(c->server.http.api_keys.empty());
  EXPECT_EQ(c->server.http.max_body_bytes, 1 << 20);
  EXPECT_EQ(c->server.zmq_client, "tcp://127.0.0.1:5555");
  EXPECT_EQ(c->server.control, "tcp://127.0.0.1:5560");
  EXPECT_EQ(c->server.heartbeat_ms, 1000);
  EXPECT_EQ(c->server.heartbeat_misses, 3);
  EXPECT_EQ(c->server.max_queued_requests, 1024);
  EXPECT_EQ(c->server.drain_timeout_s, 30);
  EXPECT_EQ(c->server.worker_restart_wait_s, 30);
  EXPECT_EQ(c->worker.backend, std::nullopt);
  EXPECT_EQ(c->worker.threads, 0);
  EXPECT_EQ(c->worker.memory_limit_bytes, 0);
  EXPECT_FALSE(c->cache.cpu_kv_bytes.has_value());
  // Defaults are valid once a model is named.
  EXPECT_TRUE(fails_with(validate_config(*c), {"empty.yaml", "model.path", "required"}));
  c->model.path = "m";
  EXPECT_TRUE(validate_config(*c).is_ok());
}

TEST(ConfigTest, EverySectionParses) {
  const char* yaml = R"(
model: {path: /models/x, dtype: bfloat16, kernel_inject: false, weights_huge_pages: after_start}
parallel:
  tensor_parallel: 4
  auto_tp:
    all_reduce_linear: {w2: mixtral}
    keep_linear: {gate: mixtral}
    rules:
      - {match: 'lm_head', role: keep}
      - {match: '\.experts\.\d+\.w2', role: row}
  injection_policy:
    BloomBlock: [self_attention.dense, mlp.dense_4h_to_h]
cache: {block_size: 32, num_blocks: 1000, memory_fraction: 0.5, cpu_kv_bytes: 67108864}
scheduler: {max_num_seqs: 8, max_num_batched_tokens: 512, chunked_prefill: false, prefix_caching: false,
            max_model_len: 256, mode: static}
server:
  http: {host: 0.0.0.0, port: 9000, api_keys: [k1, k2], max_body_bytes: 4096}
  zmq_client: ipc:///tmp/client
  control: tcp://10.0.0.1:7000
  heartbeat_ms: 250
  heartbeat_misses: 5
  max_queued_requests: 7
  drain_timeout_s: 12
  worker_restart_wait_s: 0
worker: {backend: cpu, threads: 6, memory_limit_bytes: 1000000}
)";
  auto c = parse_config_yaml(yaml, "full.yaml");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->model.path, "/models/x");
  EXPECT_EQ(c->model.dtype, DType::kBF16);
  EXPECT_FALSE(c->model.kernel_inject);
  EXPECT_EQ(c->model.weights_huge_pages, WeightHugePages::kAfterStart);
  EXPECT_EQ(c->parallel.tensor_parallel, 4);
  EXPECT_EQ(c->parallel.auto_tp.all_reduce_linear.at("w2"), "mixtral");
  EXPECT_EQ(c->parallel.auto_tp.keep_linear.at("gate"), "mixtral");
  ASSERT_EQ(c->parallel.auto_tp.rules.size(), 2u);
  EXPECT_EQ(c->parallel.auto_tp.rules[1].match, "\\.experts\\.\\d+\\.w2");
  EXPECT_EQ(c->parallel.auto_tp.rules[1].role, TpRole::kRow);
  EXPECT_EQ(c->parallel.injection_policy.at("BloomBlock"),
            (std::vector<std::string>{"self_attention.dense", "mlp.dense_4h_to_h"}));
  EXPECT_EQ(c->cache.block_size, 32);
  EXPECT_EQ(c->cache.num_blocks, 1000);
  EXPECT_DOUBLE_EQ(c->cache.memory_fraction, 0.5);
  EXPECT_EQ(c->scheduler.max_num_seqs, 8);
  EXPECT_FALSE(c->scheduler.chunked_prefill);
  EXPECT_FALSE(c->scheduler.prefix_caching);
  EXPECT_EQ(c->scheduler.max_model_len, 256);
  EXPECT_EQ(c->scheduler.mode, BatchingMode::kStatic);
  EXPECT_EQ(c->server.http.host, "0.0.0.0");
  EXPECT_EQ(c->server.http.port, 9000);
  EXPECT_EQ(c->server.http.api_keys, (std::vector<std::string>{"k1", "k2"}));
  EXPECT_EQ(c->server.http.max_body_bytes, 4096);
  EXPECT_EQ(c->server.zmq_client, "ipc:///tmp/client");
  EXPECT_EQ(c->server.heartbeat_ms, 250);
  EXPECT_EQ(c->server.heartbeat_misses, 5);
  EXPECT_EQ(c->server.max_queued_requests, 7);
  EXPECT_EQ(c->server.drain_timeout_s, 12);
  EXPECT_EQ(c->server.worker_restart_wait_s, 0);
  EXPECT_EQ(c->worker.backend, BackendKind::kCpu);
  EXPECT_EQ(c->worker.threads, 6);
  EXPECT_EQ(c->worker.memory_limit_bytes, 1000000);
  EXPECT_EQ(c->cache.cpu_kv_bytes, 67108864);
  EXPECT_TRUE(validate_config(*c).is_ok());

  // dump -> parse gives the same values.
  const std::string dumped = dump_config_yaml(*c);
  auto again = parse_config_yaml(dumped, "dumped.yaml");
  ASSERT_TRUE(again.is_ok()) << again.status().to_string() << "\n" << dumped;
  EXPECT_EQ(dump_config_yaml(*again), dumped);
  EXPECT_EQ(again->parallel.auto_tp.rules, c->parallel.auto_tp.rules);
  EXPECT_EQ(again->parallel.injection_policy, c->parallel.injection_policy);
  EXPECT_EQ(again->server.http.api_keys, c->server.http.api_keys);
  EXPECT_EQ(again->scheduler.max_model_len, 256);
  EXPECT_EQ(again->cache.num_blocks, 1000);
  EXPECT_EQ(again->cache.cpu_kv_bytes, 67108864);
  EXPECT_EQ(again->worker.memory_limit_bytes, 1000000);
  EXPECT_EQ(again->model.weights_huge_pages, WeightHugePages::kAfterStart);
}

TEST(ConfigTest, DefaultsDumpRoundTrips) {
  TesseraConfig c;
  const std::string dumped = dump_config_yaml(c);
  for (const std::string& key : config_key_paths()) {
    const std::string leaf = key.substr(key.rfind('.') + 1);
    EXPECT_NE(dumped.find(leaf + ":"), std::string::npos) << key << "\n" << dumped;
  }
  auto again = parse_config_yaml(dumped, "d.yaml");
  ASSERT_TRUE(again.is_ok()) << again.status().to_string() << "\n" << dumped;
  EXPECT_EQ(dump_config_yaml(*again), dumped);
  EXPECT_FALSE(again->cache.num_blocks.has_value());
  EXPECT_FALSE(again->scheduler.max_model_len.has_value());
}

TEST(ConfigTest, UnknownKeysNameTheirPathAndSuggest) {
  EXPECT_TRUE(fails_with(parse_status("server:\n  htp: {port: 1}\n"),
                         {"cfg.yaml:2:", "server.htp: unknown key (did you mean 'http'?)"}));
  EXPECT_TRUE(fails_with(parse_status("modle: {path: x}\n"), {"cfg.yaml", "modle: unknown key (did you mean 'model'?)"}));
  EXPECT_TRUE(fails_with(parse_status("server: {http: {prot: 1}}\n"), {"server.http.prot", "did you mean 'port'"}));
  EXPECT_TRUE(fails_with(parse_status("cache: {zzzzzzzz: 1}\n"),
                         {"cache.zzzzzzzz: unknown key (expected one of: block_size, num_blocks, memory_fraction, cpu_kv_bytes)"}));
  EXPECT_TRUE(fails_with(parse_status("parallel: {auto_tp: {rules: [{match: x, role: keep, extra: 1}]}}\n"),
                         {"parallel.auto_tp.rules[0].extra: unknown key"}));
  EXPECT_TRUE(fails_with(parse_status("model: {path: a}\nmodel: {path: b}\n"), {"model: duplicate key"}));
}

TEST(ConfigTest, WrongTypesAndValuesNameThePathAndExpectation) {
  struct Case {
    const char* yaml;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"parallel: {tensor_parallel: two}", {"cfg.yaml:1:", "parallel.tensor_parallel", "expected an integer in [1, 1024], got 'two'"}},
      {"parallel: {tensor_parallel: 0}", {"parallel.tensor_parallel", "[1, 1024]", "got '0'"}},
      {"parallel: {tensor_parallel: 1.5}", {"parallel.tensor_parallel", "got '1.5'"}},
      {"cache: {cpu_kv_bytes: 0}", {"cache.cpu_kv_bytes", "expected \"auto\" or a byte count from 1 to 2^50", "got '0'"}},
      {"cache: {cpu_kv_bytes: 2GiB}", {"cache.cpu_kv_bytes", "byte count", "got '2GiB'"}},
      {"cache: {cpu_kv_bytes: -5}", {"cache.cpu_kv_bytes", "got '-5'"}},
      {"worker: {memory_limit_bytes: -1}", {"worker.memory_limit_bytes", "expected an integer in [0, ", "got '-1'"}},
      {"model: {dtype: float8}", {"model.dtype", "expected float32 | float16 | bfloat16, got 'float8'"}},
      {"model: {kernel_inject: maybe}", {"model.kernel_inject", "expected true or false"}},
      {"model: {weights_huge_pages: later}", {"model.weights_huge_pages", "auto | load | after_start", "got 'later'"}},
      {"model: {path: [a]}", {"model.path", "expected a string, got a list"}},
      {"cache: {num_blocks: lots}", {"cache.num_blocks", "expected \"auto\" or an integer >= 1, got 'lots'"}},
      {"cache: {memory_fraction: 1.5}", {"cache.memory_fraction", "expected a number in (0, 1], got '1.5'"}},
      {"scheduler: {mode: batch}", {"scheduler.mode", "continuous | static"}},
      {"scheduler: {max_model_len: -1}", {"scheduler.max_model_len", "integer"}},
      {"server: {http: {port: 70000}}", {"server.http.port", "[0, 65535]"}},
      {"server: {http: {api_keys: key}}", {"server.http.api_keys", "expected a list of strings, got a string of 3 characters (not shown"}},
      {"server: {zmq_client: localhost:5555}", {"server.zmq_client", "ZeroMQ endpoint"}},
      {"server: {heartbeat_misses: 0}", {"server.heartbeat_misses", "[1, 1000]"}},
      {"server: {max_queued_requests: 0}", {"server.max_queued_requests", "[1, 16777216]", "got '0'"}},
      {"server: {drain_timeout_s: -1}", {"server.drain_timeout_s", "[0, 86400]", "got '-1'"}},
      {"server: {worker_restart_wait_s: 1.5}", {"server.worker_restart_wait_s", "integer"}},
      {"server: {worker_restart_wait_s: 90000}", {"server.worker_restart_wait_s", "[0, 86400]"}},
      {"worker: {backend: tpu}", {"worker.backend", "auto | cpu | cuda"}},
      {"worker: 3", {"worker", "expected a map with keys backend, threads"}},
      {"parallel: {auto_tp: {keep_linear: [gate]}}", {"parallel.auto_tp.keep_linear", "expected a map"}},
      {"parallel: {auto_tp: {rules: [{match: '(', role: keep}]}}", {"parallel.auto_tp.rules[0].match", "invalid regular expression"}},
      {"parallel: {auto_tp: {rules: [{match: x, role: split}]}}", {"parallel.auto_tp.rules[0].role", "column | row | keep"}},
      {"parallel: {auto_tp: {rules: [{match: x}]}}", {"parallel.auto_tp.rules[0]", "missing key 'role'"}},
      {"parallel: {injection_policy: {BloomBlock: []}}", {"parallel.injection_policy.BloomBlock", "non-empty list"}},
      {"- a\n- b", {"cfg.yaml", "top level"}},
      {"model: {path: x\n", {"cfg.yaml:", "YAML syntax error"}},
  };
  for (const Case& c : cases) EXPECT_TRUE(fails_with(parse_status(c.yaml), c.parts)) << c.yaml;
}

TEST(ConfigTest, AutoTpRuleRegexesArePcre2CompiledOnceWithErrorsNamingTheRule) {
  // A bad regex in the second rule: the error names the file, line, rule and PCRE2's reason.
  Status st = parse_status(R"(
parallel:
  auto_tp:
    rules:
      - {match: 'lm_head', role: keep}
      - {match: 'experts\.(\d+\.w2', role: row}
)");
  EXPECT_TRUE(fails_with(st, {"cfg.yaml:6:", "parallel.auto_tp.rules[1].match", "invalid regular expression",
                              "experts\\.(\\d+\\.w2", "missing closing parenthesis"}));
  // --set goes through the same reader.
  TesseraConfig c;
  EXPECT_TRUE(fails_with(apply_override(c, "parallel.auto_tp.rules", "[{match: 'a[b', role: keep}]"),
                         {"parallel.auto_tp.rules[0].match", "missing terminating ]"}));

  // PCRE2 syntax (a lookbehind, which ECMAScript regexes lack), compiled when read and
  // searched anywhere in the name.
  auto ok = parse_config_yaml("parallel: {auto_tp: {rules: [{match: '(?<=\\.)w2\\.', role: row}]}}", "r.yaml");
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  const TpRuleConfig& rule = ok->parallel.auto_tp.rules[0];
  ASSERT_NE(rule.regex, nullptr);
  EXPECT_TRUE(rule.regex->search("model.layers.1.block_sparse_moe.experts.3.w2.weight"));
  EXPECT_FALSE(rule.regex->search("w2.weight"));  // nothing before the '.'

  // A rule built in code is compiled by validate_config's check (and the planner), not trusted.
  TesseraConfig coded;
  coded.model.path = "m";
  coded.parallel.auto_tp.rules.emplace_back().match = "(?<!x";
  EXPECT_TRUE(fails_with(validate_config(coded), {"parallel.auto_tp.rules[0].match", "invalid regular expression"}));
}

TEST(ConfigTest, SpeculativeKeysAreReadAndCheckedNamingTheKey) {
  auto c = parse_config_yaml("model: {path: m}\nspeculative: {method: ngram, num_tokens: 6, ngram_min: 2, ngram_max: 5}\n",
                             "s.yaml");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->speculative.method, SpeculativeConfig::Method::kNgram);
  EXPECT_EQ(c->speculative.num_tokens, 6);
  EXPECT_TRUE(validate_config(*c).is_ok());
  c = parse_config_yaml("model: {path: m}\nspeculative: {ngram_min: 5, ngram_max: 2}\n", "s.yaml");
  ASSERT_TRUE(c.is_ok());
  EXPECT_TRUE(fails_with(validate_config(*c), {"s.yaml", "speculative.ngram_max (2) must be at least speculative.ngram_min (5)"}));
  EXPECT_TRUE(fails_with(parse_config_yaml("speculative: {method: eagle}\n", "s.yaml").status(),
                         {"speculative.method", "none", "ngram", "draft"}));
  c = parse_config_yaml("model: {path: m}\nspeculative: {method: draft, draft_model: /d}\n", "s.yaml");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->speculative.draft_model, "/d");
  EXPECT_TRUE(validate_config(*c).is_ok());
  c = parse_config_yaml("model: {path: m}\nspeculative: {method: draft}\n", "s.yaml");
  ASSERT_TRUE(c.is_ok());
  EXPECT_TRUE(fails_with(validate_config(*c), {"s.yaml", "speculative.draft_model: required"}));
  c = parse_config_yaml("model: {path: m}\nspeculative: {draft_model: /d}\n", "s.yaml");
  ASSERT_TRUE(c.is_ok());
  EXPECT_TRUE(fails_with(validate_config(*c), {"s.yaml", "speculative.draft_model: given while"}));
  EXPECT_TRUE(fails_with(parse_config_yaml("speculative: {num_tokens: 17}\n", "s.yaml").status(), {"speculative.num_tokens"}));
  EXPECT_TRUE(fails_with(parse_config_yaml("speculative: {draft_min_probability: 1}\n", "s.yaml").status(),
                         {"speculative.draft_min_probability", "[0, 1)"}));
  c = parse_config_yaml("model: {path: m}\nspeculative: {draft_min_probability: 0.25}\n", "s.yaml");
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->speculative.draft_min_probability, 0.25);
  TesseraConfig d;
  EXPECT_TRUE(fails_with(apply_override(d, "speculative.num_tokens", "0"), {"speculative.num_tokens"}));
}

TEST(ConfigTest, ReasoningAndToolCallParsersTakeTheHarmonyNamesAndRefuseOthers) {
  auto c = parse_config_yaml("model: {path: m}\nserver: {reasoning_parser: gpt_oss, tool_call_parser: openai}\n", "p.yaml");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->server.reasoning_parser, "gpt_oss");
  EXPECT_EQ(c->server.tool_call_parser, "openai");
  EXPECT_TRUE(fails_with(parse_config_yaml("server: {reasoning_parser: gpt-oss}\n", "p.yaml").status(),
                         {"server.reasoning_parser", "gpt_oss", "qwen3"}));
  EXPECT_TRUE(fails_with(parse_config_yaml("server: {tool_call_parser: harmony}\n", "p.yaml").status(),
                         {"server.tool_call_parser", "openai", "hermes"}));
}

TEST(ConfigTest, ValidateChecksAcrossKeys) {
  auto c = parse_config_yaml("model: {path: m}\nscheduler: {max_num_seqs: 64, max_num_batched_tokens: 32}\n", "v.yaml");
  ASSERT_TRUE(c.is_ok());
  EXPECT_TRUE(fails_with(validate_config(*c), {"v.yaml", "scheduler.max_num_batched_tokens (32)", "max_num_seqs (64)"}));
  c = parse_config_yaml("model: {path: m}\nscheduler: {chunked_prefill: false, max_model_len: 8192}\n", "v.yaml");
  ASSERT_TRUE(c.is_ok());
  EXPECT_TRUE(fails_with(validate_config(*c), {"v.yaml", "max_model_len (8192)", "chunked_prefill off"}));
  c = parse_config_yaml("model: {path: m}\nserver: {zmq_client: 'tcp://a:1', control: 'tcp://a:1'}\n", "v.yaml");
  ASSERT_TRUE(c.is_ok());
  EXPECT_TRUE(fails_with(validate_config(*c), {"v.yaml", "server.zmq_client and server.control must differ"}));
}

TEST(ConfigTest, EmptyZmqClientTurnsTheClientApiOff) {
  auto c = parse_config_yaml("model: {path: m}\nserver: {zmq_client: ''}\n", "z.yaml");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->server.zmq_client, "");
  EXPECT_TRUE(validate_config(*c).is_ok());
  TesseraConfig d;
  ASSERT_TRUE(apply_override_arg(d, "server.zmq_client=").is_ok());
  EXPECT_EQ(d.server.zmq_client, "");
  auto back = parse_config_yaml(dump_config_yaml(d), "dump.yaml");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->server.zmq_client, "");
  EXPECT_FALSE(apply_override_arg(d, "server.zmq_client=http://x").is_ok());
}

TEST(ConfigTest, OverridesSetEveryKind) {
  TesseraConfig c;
  ASSERT_TRUE(apply_override(c, "parallel.tensor_parallel", "2").is_ok());
  EXPECT_EQ(c.parallel.tensor_parallel, 2);
  ASSERT_TRUE(apply_override_arg(c, "model.path=/m/tiny-llama").is_ok());
  EXPECT_EQ(c.model.path, "/m/tiny-llama");
  ASSERT_TRUE(apply_override(c, "model.dtype", "float32").is_ok());
  EXPECT_EQ(c.model.dtype, DType::kF32);
  ASSERT_TRUE(apply_override(c, "model.kernel_inject", "false").is_ok());
  EXPECT_FALSE(c.model.kernel_inject);
  ASSERT_TRUE(apply_override(c, "cache.num_blocks", "128").is_ok());
  EXPECT_EQ(c.cache.num_blocks, 128);
  ASSERT_TRUE(apply_override(c, "cache.num_blocks", "auto").is_ok());
  EXPECT_FALSE(c.cache.num_blocks.has_value());
  ASSERT_TRUE(apply_override(c, "scheduler.max_model_len", "1024").is_ok());
  EXPECT_EQ(c.scheduler.max_model_len, 1024);
  ASSERT_TRUE(apply_override(c, "scheduler.max_model_len", "null").is_ok());
  EXPECT_FALSE(c.scheduler.max_model_len.has_value());
  ASSERT_TRUE(apply_override(c, "server.http.api_keys", "[a, 'b c']").is_ok());
  EXPECT_EQ(c.server.http.api_keys, (std::vector<std::string>{"a", "b c"}));
  ASSERT_TRUE(apply_override(c, "server.zmq_client", "tcp://0.0.0.0:6000").is_ok());
  EXPECT_EQ(c.server.zmq_client, "tcp://0.0.0.0:6000");
  ASSERT_TRUE(apply_override(c, "server.max_queued_requests", "2").is_ok());
  EXPECT_EQ(c.server.max_queued_requests, 2);
  EXPECT_FALSE(apply_override_arg(c, "server.max_queued_requests=-1").is_ok());
  ASSERT_TRUE(apply_override(c, "server.http.host", "::1").is_ok());
  EXPECT_EQ(c.server.http.host, "::1");
  ASSERT_TRUE(apply_override(c, "parallel.auto_tp.keep_linear", "{gate: mixtral}").is_ok());
  ASSERT_TRUE(apply_override(c, "parallel.auto_tp.keep_linear.w2", "mixtral").is_ok());
  EXPECT_EQ(c.parallel.auto_tp.keep_linear,
            (std::map<std::string, std::string>{{"gate", "mixtral"}, {"w2", "mixtral"}}));
  ASSERT_TRUE(apply_override(c, "parallel.auto_tp.all_reduce_linear.mlp.dense_4h_to_h", "bloom").is_ok());
  EXPECT_EQ(c.parallel.auto_tp.all_reduce_linear.at("mlp.dense_4h_to_h"), "bloom");
  ASSERT_TRUE(apply_override(c, "parallel.injection_policy.BloomBlock", "[self_attention.dense]").is_ok());
  EXPECT_EQ(c.parallel.injection_policy.at("BloomBlock"), std::vector<std::string>{"self_attention.dense"});
  ASSERT_TRUE(apply_override(c, "parallel.auto_tp.rules", "[{match: 'lm_head', role: keep}]").is_ok());
  ASSERT_EQ(c.parallel.auto_tp.rules.size(), 1u);
  ASSERT_TRUE(apply_override(c, "worker.backend", "cuda").is_ok());
  EXPECT_EQ(c.worker.backend, BackendKind::kCuda);
  ASSERT_TRUE(apply_override(c, "scheduler.mode", "static").is_ok());
  EXPECT_EQ(c.scheduler.mode, BatchingMode::kStatic);
}

TEST(ConfigTest, EveryKeyIsOverridableWithItsDumpedValue) {
  auto src = parse_config_yaml(R"(
model: {path: /m, dtype: bfloat16, kernel_inject: false}
parallel: {tensor_parallel: 2, auto_tp: {keep_linear: {gate: mixtral}, rules: [{match: 'a\.b', role: row}]},
           injection_policy: {BloomBlock: [x]}}
cache: {num_blocks: 9, memory_fraction: 0.25}
scheduler: {max_model_len: 77, mode: static}
server: {http: {host: '::1', api_keys: [k]}, zmq_client: 'ipc:///tmp/z', max_queued_requests: 5}
worker: {backend: cpu, threads: 3}
)", "src.yaml");
  ASSERT_TRUE(src.is_ok()) << src.status().to_string();
  const YAML::Node dumped = YAML::Load(dump_config_yaml(*src));
  TesseraConfig c;
  for (const std::string& key : config_key_paths()) {
    YAML::Node n = YAML::Clone(dumped);
    std::stringstream ss(key);
    for (std::string part; std::getline(ss, part, '.');) n = n[part];
    YAML::Emitter e;
    e << YAML::Flow << n;
    ASSERT_TRUE(apply_override(c, key, e.c_str()).is_ok()) << key << "=" << e.c_str() << ": "
                                                            << apply_override(c, key, e.c_str()).to_string();
  }
  c.source = src->source;
  EXPECT_EQ(dump_config_yaml(c), dump_config_yaml(*src));
}

TEST(ConfigTest, SecretValuesAreDescribedNeverShown) {
  TesseraConfig c;
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"server.http.api_keys", "sk-live-SECRET1"},            // a scalar where a list belongs
           {"server.http.api_keys", "[sk-live-SECRET1, [x]]"},     // a list inside the list
           {"server.http.api_key", "sk-live-SECRET1"},             // a mistyped key
           {"server.http.api_keys", "{a: sk-live-SECRET1}"}}) {
    const Status st = apply_override(c, key, value);
    ASSERT_FALSE(st.is_ok()) << key << "=" << value;
    EXPECT_EQ(st.message().find("SECRET1"), std::string::npos) << st.message();
  }
  const Status no_equals = apply_override_arg(c, "sk-live-SECRET1");
  ASSERT_FALSE(no_equals.is_ok());
  EXPECT_EQ(no_equals.message().find("SECRET1"), std::string::npos) << no_equals.message();
  auto from_file = parse_config_yaml("server:\n  http:\n    api_keys: sk-live-SECRET1\n", "keys.yaml");
  ASSERT_FALSE(from_file.is_ok());
  EXPECT_TRUE(fails_with(from_file.status(), {"keys.yaml:3:15: server.http.api_keys", "15 characters", "not shown"}));
  EXPECT_EQ(from_file.status().message().find("SECRET1"), std::string::npos) << from_file.status().message();
  // Other keys still show what they were given.
  EXPECT_TRUE(fails_with(apply_override(c, "server.http.port", "eighty"), {"got 'eighty'"}));
  EXPECT_TRUE(is_secret_config_path("server.http.api_keys"));
  EXPECT_TRUE(is_secret_config_path("server.curve.client_secret_key_file"));
  EXPECT_FALSE(is_secret_config_path("scheduler.max_num_batched_tokens"));
}

TEST(ConfigTest, OverrideErrorsNameFlagPathAndType) {
  TesseraConfig c;
  EXPECT_TRUE(fails_with(apply_override(c, "parallel.tensor_parallel", "two"),
                         {"--set: parallel.tensor_parallel: expected an integer", "got 'two'"}));
  EXPECT_TRUE(fails_with(apply_override(c, "server.htp.port", "1"), {"server.htp: unknown key (did you mean 'http'?)"}));
  EXPECT_TRUE(fails_with(apply_override(c, "server.http", "1"), {"server.http: is a section", "host, port"}));
  EXPECT_TRUE(fails_with(apply_override(c, "model.path.x", "1"), {"model.path: is not a section"}));
  EXPECT_TRUE(fails_with(apply_override(c, "cache.memory_fraction", "0"), {"cache.memory_fraction", "(0, 1]"}));
  EXPECT_TRUE(fails_with(apply_override(c, "server.http.api_keys", "[a"), {"server.http.api_keys", "not valid YAML"}));
  EXPECT_TRUE(fails_with(apply_override_arg(c, "tensor_parallel"), {"expected KEY=VALUE"}));
  EXPECT_TRUE(fails_with(apply_override(c, "tensor_parallel", "2"),
                         {"tensor_parallel: unknown key", "model, parallel, cache, scheduler, speculative, lora, server, worker"}));
  EXPECT_EQ(c.parallel.tensor_parallel, 1);  // failed overrides change nothing
}

TEST(ConfigTest, ExampleFileLoadsAndValidates) {
  const std::string path = tessera::testing::source_dir() + "/config/tessera.example.yaml";
  auto c = load_config_file(path);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_TRUE(validate_config(*c).is_ok()) << validate_config(*c).to_string();
  EXPECT_EQ(c->parallel.tensor_parallel, 2);
  EXPECT_EQ(c->parallel.auto_tp.all_reduce_linear.at("w2"), "mixtral");
  EXPECT_EQ(c->parallel.auto_tp.keep_linear.at("gate"), "mixtral");
  // The example's other values are the defaults.
  TesseraConfig defaults;
  defaults.model.path = c->model.path;
  defaults.parallel = c->parallel;
  defaults.source = c->source;
  EXPECT_EQ(dump_config_yaml(*c), dump_config_yaml(defaults));
}

TEST(ConfigTest, MissingFileIsNotFound) {
  auto c = load_config_file("/nonexistent/tessera.yaml");
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("/nonexistent/tessera.yaml"), std::string::npos);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

TEST(ConfigTest, CurveKeysAreFilesAndChecked) {
  auto c = parse_config_yaml(R"(
model: {path: m}
server:
  curve:
    enabled: true
    server_public_key_file: /etc/tessera/curve/server.pub
    server_secret_key_file: /etc/tessera/curve/server.key
    client_secret_key_file: /etc/tessera/curve/worker.key
    allowed_client_keys_file: /etc/tessera/curve/allowed_clients
    client_api: true
worker: {control_address: 'tcp://tessera-coordinator:5560'}
)", "cfg.yaml");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_TRUE(c->server.curve.enabled);
  EXPECT_EQ(c->server.curve.server_public_key_file, "/etc/tessera/curve/server.pub");
  EXPECT_EQ(c->server.curve.server_secret_key_file, "/etc/tessera/curve/server.key");
  EXPECT_EQ(c->server.curve.client_secret_key_file, "/etc/tessera/curve/worker.key");
  EXPECT_EQ(c->server.curve.allowed_client_keys_file, "/etc/tessera/curve/allowed_clients");
  EXPECT_TRUE(c->server.curve.client_api);
  EXPECT_EQ(c->worker.control_address, "tcp://tessera-coordinator:5560");
  EXPECT_TRUE(validate_config(*c).is_ok()) << validate_config(*c).to_string();
  auto again = parse_config_yaml(dump_config_yaml(*c), "d.yaml");
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(dump_config_yaml(*again), dump_config_yaml(*c));

  // Errors name the key path.
  EXPECT_TRUE(fails_with(parse_status("server: {curve: {enabled: maybe}}"),
                         {"cfg.yaml:1:", "server.curve.enabled: expected true or false"}));
  EXPECT_TRUE(fails_with(parse_status("server: {curve: {public_key: x}}"),
                         {"server.curve.public_key: unknown key"}));
  EXPECT_TRUE(fails_with(parse_status("worker: {control_address: 'http://x'}"),
                         {"worker.control_address: expected a ZeroMQ endpoint"}));
  TesseraConfig v;
  v.model.path = "m";
  v.server.curve.enabled = true;
  EXPECT_TRUE(fails_with(validate_config(v), {"server.curve.server_public_key_file: required"}));
  v.server.curve.enabled = false;
  v.server.curve.server_secret_key_file = "/s";  // paths may wait for `enabled: true`
  EXPECT_TRUE(validate_config(v).is_ok()) << validate_config(v).to_string();
  v.server.curve.server_secret_key_file.clear();
  v.server.curve.client_api = true;
  EXPECT_TRUE(fails_with(validate_config(v), {"server.curve.client_api"}));
  EXPECT_TRUE(apply_override(v, "server.curve.enabled", "on").is_ok());
  EXPECT_TRUE(apply_override(v, "server.curve.server_public_key_file", "/p").is_ok());
  EXPECT_TRUE(validate_config(v).is_ok()) << validate_config(v).to_string();
}

TEST(ConfigTest, CurveKeyFilesAreReadAndMatched) {
  if (!zmq_has("curve")) GTEST_SKIP() << "SKIPPED: libzmq built without CURVE";
  const std::string dir = testing::make_temp_dir("tessera-curve-keys");
  auto server = make_curve_keypair();
  auto worker = make_curve_keypair();
  auto other = make_curve_keypair();
  ASSERT_TRUE(server.is_ok() && worker.is_ok() && other.is_ok());
  testing::write_file(dir + "/server.key", server->secret_key + "\n");
  testing::write_file(dir + "/server.pub", server->public_key + "\n");
  testing::write_file(dir + "/other.pub", other->public_key);
  testing::write_file(dir + "/worker.key", worker->secret_key);
  testing::write_file(dir + "/allowed", "# workers\n" + worker->public_key + "\n\n" + other->public_key + "\n");
  testing::write_file(dir + "/empty", "# nobody\n");
  testing::write_file(dir + "/bad", "not-a-key\n");

  CurveSection c;
  c.enabled = true;
  c.server_secret_key_file = dir + "/server.key";
  c.server_public_key_file = dir + "/server.pub";
  c.allowed_client_keys_file = dir + "/allowed";
  auto s = load_curve_server_keys(c);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->server.public_key, server->public_key);
  EXPECT_EQ(s->allowed_client_keys, (std::vector<std::string>{worker->public_key, other->public_key}));
  c.client_secret_key_file = dir + "/worker.key";
  auto w = load_curve_client_keys(c);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ(w->server_public_key, server->public_key);
  EXPECT_EQ(w->client.public_key, worker->public_key);
  c.client_secret_key_file.clear();
  w = load_curve_client_keys(c);
  ASSERT_TRUE(w.is_ok());
  EXPECT_TRUE(is_z85_key(w->client.public_key));  // a fresh keypair
  EXPECT_NE(w->client.public_key, worker->public_key);

  CurveSection bad = c;
  bad.server_public_key_file = dir + "/other.pub";
  EXPECT_TRUE(fails_with(load_curve_server_keys(bad).status(), {"not one keypair"}));
  bad = c;
  bad.allowed_client_keys_file = dir + "/empty";
  EXPECT_TRUE(fails_with(load_curve_server_keys(bad).status(), {"server.curve.allowed_client_keys_file", "no keys"}));
  bad = c;
  bad.allowed_client_keys_file = dir + "/bad";
  EXPECT_TRUE(fails_with(load_curve_server_keys(bad).status(), {"allowed_client_keys_file", "bad:1", "40 Z85"}));
  bad = c;
  bad.server_secret_key_file = dir + "/missing.key";
  EXPECT_TRUE(fails_with(load_curve_server_keys(bad).status(), {"server.curve.server_secret_key_file", "missing.key",
                                                                "Secret mounted"}));
  bad.server_secret_key_file.clear();
  EXPECT_TRUE(fails_with(load_curve_server_keys(bad).status(), {"server_secret_key_file: required on the coordinator"}));
  CurveSection off;
  EXPECT_TRUE(load_curve_server_keys(off)->server.secret_key.empty());
  EXPECT_TRUE(load_curve_client_keys(off)->server_public_key.empty());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// The configurations the Kubernetes manifests ship (ConfigMaps) are valid Tessera YAML.
TEST(ConfigTest, KubernetesConfigMapsLoadAndValidate) {
  for (const char* rel : {"k8s/base/tessera.yaml", "k8s/overlays/cpu-demo/tessera.yaml", "k8s/overlays/multi-node-cpu/tessera.yaml",
                          "k8s/lws/tessera.yaml"}) {
    const std::string path = testing::source_dir() + "/" + rel;
    auto c = load_config_file(path);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_TRUE(validate_config(*c).is_ok()) << validate_config(*c).to_string();
    EXPECT_EQ(c->server.http.host, "0.0.0.0") << rel;
    EXPECT_EQ(c->server.control, "tcp://0.0.0.0:5560") << rel;
  }
}

}  // namespace
}  // namespace tessera
