// tessera-generate: one process, no server, tensor-parallel size 1. Loads a model, runs the
// prompt(s) and prints the continuation (see ../shared/DESIGN.md §6 for the contract).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include <unistd.h>

#include <filesystem>
#include <map>

#include "common/config.h"
#include "common/logging.h"
#include "common/quantization_flags.h"
#include "common/tokenizer/model_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/engine/engine.h"
#include "tools/lib/local_executor.h"
#include "tools/lib/lora_flags.h"
#include "tools/lib/main_guard.h"
#include "tools/lib/prompt_ids.h"
#include "tools/lib/speculative_flags.h"
#include "tools/lib/weight_streaming_flags.h"
#include "worker/model_checkpoint.h"
#include "worker/model_config.h"

namespace tessera {
namespace {

struct Options {
  std::string model;
  WeightStreamingFlags weights;  // --weights-budget, --weights-spill-dir, --weights-cache-dir, --weights-prefetch-layers, --weights-streaming
  std::string prompt;
  std::string prompt_ids;
  std::string prompt_ids_file;
  int block_size = 16;
  int kv_blocks = 0;  // 0 = enough for every request at once
  int max_num_batched_tokens = 4096;
  int max_num_seqs = 256;
  int tensor_parallel = 1;
  bool seed_given = false;
  int max_new_tokens = 16;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  std::string dtype = "float32";
  std::string quantize = "auto";
  std::string quantize_group = "auto";
  std::vector<std::string> quantize_rules;
  std::string bf16_coding = "auto";  // --bf16-coding
  std::string backend = "cpu";
  bool no_kernel_inject = false;
  std::string dump_logits;
  bool json = false;
  bool stop_at_eos = false;
  int threads = 0;
  SpeculativeFlags speculative;  // --speculative, --speculative-tokens, --draft-model
  std::vector<std::string> lora;  // --lora NAME=PATH (lora.adapters)
  int lora_max_rank = 64;         // --lora-max-rank (lora.max_rank)
  int lora_max_loras = 0;         // --lora-max-loras (lora.max_loras)
  std::string collectives = "auto";  // --collectives (worker.collectives)
  std::string prompt_lora;        // --prompt-lora: the adapter of each prompt
};

// --prompt-lora: one adapter name for every prompt, or one per prompt ("-" = the base model).
StatusOr<std::vector<std::string>> prompt_adapters(const std::string& flag, size_t prompts,
                                                   const std::map<std::string, std::string>& adapters) {
  std::vector<std::string> names;
  if (flag.empty()) return std::vector<std::string>(prompts);
  for (size_t at = 0;;) {
    const size_t comma = flag.find(',', at);
    names.push_back(flag.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (names.size() == 1) names.resize(prompts, names[0]);
  if (names.size() != prompts)
    return invalid_argument("--prompt-lora: " + std::to_string(names.size()) + " adapter names for " +
                            std::to_string(prompts) + " prompts (give one for all, or one per prompt)");
  for (std::string& n : names) {
    if (n == "-") {
      n.clear();
    } else if (adapters.count(n) == 0) {
      return invalid_argument("--prompt-lora: \"" + n + "\" is not an adapter given with --lora NAME=PATH");
    }
  }
  return names;
}

Status write_logits(const std::string& path, const std::vector<float>& logits) {
  std::ofstream out(path, std::ios::binary);
  if (!out) return invalid_argument("--dump-logits: cannot write " + path);
  // float32 little-endian rows; x86-64 and aarch64 hosts are little-endian already.
  out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  if (!out) return data_loss("--dump-logits: failed writing " + path);
  return Status::ok();
}

std::string ids_json(const std::vector<int32_t>& ids) { return nlohmann::json(ids).dump(); }

// Keeps the raw logits of every sampled row, per sequence, for --dump-logits: asks the
// executor (in-process, or rank 0 of the worker group) to return them with each step.
class LogitRecorder final : public StepExecutor {
 public:
  explicit LogitRecorder(StepExecutor& inner) : inner_(inner) {}
  StatusOr<StepResult> execute(const StepPlan& plan) override {
    StepPlan asking = plan;
    asking.return_logits = true;
    TESSERA_ASSIGN_OR_RETURN(StepResult result, inner_.execute(asking));
    const size_t vocab = result.tokens.empty() ? 0 : result.logits.size() / result.tokens.size();
    if (!result.tokens.empty() && vocab * result.tokens.size() != result.logits.size()) {
      return internal_error("--dump-logits: the executor returned " + std::to_string(result.logits.size()) +
                            " logits for " + std::to_string(result.tokens.size()) + " sampled rows");
    }
    for (size_t i = 0; i < result.tokens.size(); ++i) {
      auto& rows = rows_[result.tokens[i].seq_id];
      rows.insert(rows.end(), result.logits.begin() + i * vocab, result.logits.begin() + (i + 1) * vocab);
    }
    result.logits.clear();
    return result;
  }
  uint64_t kv_cache_epoch() const override { return inner_.kv_cache_epoch(); }
  const std::vector<float>& rows(SeqId id) { return rows_[id]; }

 private:
  StepExecutor& inner_;
  std::map<SeqId, std::vector<float>> rows_;
};

Status run(const Options& o) {
  auto dtype = parse_float_dtype(o.dtype);
  if (!dtype) {
    return invalid_argument("--dtype: unsupported \"" + o.dtype + "\" (expected float32, float16 or bfloat16)");
  }
  const int given = !o.prompt.empty() + !o.prompt_ids.empty() + !o.prompt_ids_file.empty();
  if (given != 1) {
    return invalid_argument("give exactly one of --prompt TEXT, --prompt-ids 1,2,3 or --prompt-ids-file FILE");
  }
  if (o.max_new_tokens < 1) return invalid_argument("--max-new-tokens must be at least 1");
  if (o.temperature < 0) return invalid_argument("--temperature must be >= 0");
  if (o.top_p <= 0 || o.top_p > 1) return invalid_argument("--top-p must be in (0, 1]");
  if (o.block_size < 1) return invalid_argument("--block-size must be at least 1");
  if (o.kv_blocks < 0) return invalid_argument("--kv-blocks must be positive");
  if (o.max_num_batched_tokens < 1) return invalid_argument("--max-num-batched-tokens must be at least 1");
  if (o.max_num_seqs < 1) return invalid_argument("--max-num-seqs must be at least 1");

  if (o.tensor_parallel < 1) return invalid_argument("--tensor-parallel must be at least 1");
  // The model's shape (config.json) is all the scheduling side needs; weights are loaded
  // here only for --tensor-parallel 1, by the worker processes otherwise.
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, open_model_checkpoint(o.model));
  TESSERA_ASSIGN_OR_RETURN(const ModelConfig config,
                           parse_model_config(ckpt->config(), ckpt->config_source()));
  const std::string config_dir = ckpt->config_dir();
  ckpt.reset();

  // The tokenizer is optional for token-id prompts (random-weight test models have none).
  std::unique_ptr<Tokenizer> tokenizer;
  auto tok = load_model_tokenizer(o.model, config_dir);
  if (tok.is_ok()) {
    tokenizer = std::move(tok).value();
  } else if (!o.prompt.empty()) {
    return tok.status().with_context("--prompt needs the model's tokenizer");
  }

  std::vector<std::vector<int32_t>> prompts;
  if (!o.prompt.empty()) {
    prompts.push_back(tokenizer->encode(o.prompt, /*add_special_tokens=*/true));
  } else if (!o.prompt_ids.empty()) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, parse_id_list(o.prompt_ids, "--prompt-ids"));
    prompts.push_back(std::move(ids));
  } else {
    TESSERA_ASSIGN_OR_RETURN(prompts, read_prompt_file(o.prompt_ids_file));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    TESSERA_RETURN_IF_ERROR(check_prompt(prompts[i], o.max_new_tokens, config, "prompt " + std::to_string(i)));
  }
  if (o.lora_max_rank < 1 || o.lora_max_rank > 4096) return invalid_argument("--lora-max-rank must be 1 to 4096");
  if (o.lora_max_loras < 0 || o.lora_max_loras > 4096) return invalid_argument("--lora-max-loras must be 0 to 4096");
  TESSERA_ASSIGN_OR_RETURN(const auto adapters, lora_adapters_from_flags(o.lora));
  TESSERA_ASSIGN_OR_RETURN(const std::vector<std::string> prompt_lora,
                           prompt_adapters(o.prompt_lora, prompts.size(), adapters));

  // By default the KV pool holds every request at full length at once; --kv-blocks smaller
  // than that makes the scheduler preempt.
  SchedulerConfig sc;
  sc.block_size = o.block_size;
  sc.max_num_seqs = o.max_num_seqs;
  sc.max_num_batched_tokens = o.max_num_batched_tokens;
  sc.max_loras = o.lora_max_loras;
  int64_t needed = 0, longest = 0;
  // Room for the proposals too (and the draft's scratch), so a pool sized for the run lets
  // speculation go on to the last token.
  const int64_t spec_slots = o.speculative.method != "none" ? o.speculative.num_tokens + 1 : 0;
  for (const auto& p : prompts) {
    const int64_t total = static_cast<int64_t>(p.size()) + o.max_new_tokens;
    needed += (total + spec_slots + o.block_size - 1) / o.block_size;
    longest = std::max(longest, total);
  }
  sc.num_blocks = o.kv_blocks > 0 ? o.kv_blocks : static_cast<int>(needed);
  sc.max_model_len = static_cast<int>(std::max<int64_t>(longest, config.max_positions));
  sc.sliding_window = config.kv_window();  // blocks the window has left are freed
  TESSERA_ASSIGN_OR_RETURN(sc.speculative, speculative_from_flags(o.speculative));
  if (sc.speculative.enabled() && !o.dump_logits.empty())
    return invalid_argument("--dump-logits needs --speculative none: a step checking proposals scores several rows "
                            "per sequence, not one per generated token");
  TESSERA_RETURN_IF_ERROR(validate_scheduler_config(sc));

  // In this process (TP 1), or through the coordinator/worker runtime (TP > 1).
  LocalExecutorOptions lo;
  lo.model = o.model;
  lo.dtype = *dtype;
  lo.kernel_inject = !o.no_kernel_inject;
  lo.tensor_parallel = o.tensor_parallel;
  if (o.collectives == "auto" || o.collectives == "shm" || o.collectives == "gloo" || o.collectives == "nccl") {
    lo.collectives = o.collectives == "auto"   ? CollectivesKind::kAuto
                     : o.collectives == "shm"  ? CollectivesKind::kShm
                     : o.collectives == "gloo" ? CollectivesKind::kGloo
                                               : CollectivesKind::kNccl;
  } else {
    return invalid_argument("--collectives: \"" + o.collectives + "\" is not auto, shm, gloo or nccl");
  }
  lo.backend = o.backend;
  lo.threads = o.threads;
  lo.program = "tessera-gen";
  lo.draft_model = o.speculative.draft_model;
  lo.lora_adapters = adapters;
  lo.lora_max_rank = o.lora_max_rank;
  TESSERA_ASSIGN_OR_RETURN(lo.quant, quantization_from_flags(o.quantize, o.quantize_group, o.quantize_rules, o.bf16_coding));
  TESSERA_ASSIGN_OR_RETURN(lo.residency, weight_residency_from_flags(o.weights));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<LocalExecutor> local, LocalExecutor::start(lo, sc));
  std::unique_ptr<LogitRecorder> recorder;
  StepExecutor* runner = &local->executor();
  if (!o.dump_logits.empty()) {
    recorder = std::make_unique<LogitRecorder>(*runner);
    runner = recorder.get();
  }
  Engine engine(sc, *runner);

  std::vector<RequestId> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto req = std::make_shared<Request>();
    req->prompt = prompts[i];
    req->max_tokens = o.max_new_tokens;
    req->sampling.temperature = o.temperature;
    req->sampling.top_k = o.top_k;
    req->sampling.top_p = o.top_p;
    if (o.seed_given) req->sampling.seed = o.seed + i;
    if (config.eos_id >= 0) req->stop.eos_token_id = config.eos_id;
    req->stop.ignore_eos = !o.stop_at_eos;
    req->lora = prompt_lora[i];
    const RequestId id = i + 1;  // input line i + 1 (its one sequence has the same id)
    if (Status st = engine.add_request(id, std::move(req)); !st.is_ok())
      return st.with_context("prompt " + std::to_string(i));
    ids.push_back(id);
  }
  std::map<SeqId, std::vector<int32_t>> outputs;
  while (engine.has_work()) {
    for (const SequenceEvent& ev : engine.step()) {
      for (const SampledToken& t : ev.new_tokens) outputs[ev.seq_id].push_back(t.token);
      if (ev.finished && ev.reason == FinishReason::kError) {
        return internal_error("generation failed: " + ev.error);
      }
    }
  }

  if (!o.dump_logits.empty()) {
    std::vector<float> all;
    for (SeqId id : ids) all.insert(all.end(), recorder->rows(id).begin(), recorder->rows(id).end());
    TESSERA_RETURN_IF_ERROR(write_logits(o.dump_logits, all));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t>& out = outputs[ids[i]];
    if (o.json) {
      nlohmann::json j;
      j["prompt_ids"] = prompts[i];
      j["output_ids"] = out;
      if (tokenizer) j["text"] = tokenizer->decode(out, /*skip_special_tokens=*/true);
      // Invalid UTF-8 (a continuation cut mid-character) is replaced, never a crash.
      std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
    } else if (tokenizer) {
      // For people: the prompt and its continuation as one text.
      std::vector<int32_t> all = prompts[i];
      all.insert(all.end(), out.begin(), out.end());
      std::cout << tokenizer->decode(all, /*skip_special_tokens=*/true) << std::endl;
    } else {
      std::cout << ids_json(out) << std::endl;
    }
  }
  return Status::ok();
}

}  // namespace
}  // namespace tessera

namespace {

int generate_main(int argc, char** argv) {
  tessera::Options o;
  CLI::App app{"tessera-generate: run a model on prompts in this process (no server)"};
  app.add_option("--model", o.model, "Hugging Face model folder, DeepSpeed checkpoint JSON or GGUF file")->required();
  app.add_option("--prompt", o.prompt, "prompt text (encoded with the model's tokenizer, BOS added)");
  app.add_option("--prompt-ids", o.prompt_ids, "prompt as comma-separated token ids, e.g. 1,2,3");
  app.add_option("--prompt-ids-file", o.prompt_ids_file,
                 "one comma-separated id list per line, all submitted together; one JSON line per input line");
  app.add_option("--block-size", o.block_size, "tokens per KV block")->capture_default_str();
  app.add_option("--kv-blocks", o.kv_blocks, "KV blocks in the pool (default: enough for all requests at once)");
  app.add_option("--max-num-batched-tokens", o.max_num_batched_tokens, "token budget of one step (chunked prefill)")
      ->capture_default_str();
  app.add_option("--max-num-seqs", o.max_num_seqs, "sequences in one step")->capture_default_str();
  app.add_option("--tensor-parallel", o.tensor_parallel,
                 "run through N tessera-worker processes (CPU ranks without a GPU); prints what N = 1 prints")
      ->capture_default_str();
  app.add_option("--max-new-tokens", o.max_new_tokens, "tokens to generate")->capture_default_str();
  app.add_option("--temperature", o.temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-k", o.top_k, "sample from the k most likely tokens (0 = all)")->capture_default_str();
  app.add_option("--top-p", o.top_p, "nucleus sampling mass")->capture_default_str();
  auto* seed_opt = app.add_option("--seed", o.seed,
                                  "random seed for sampling (prompt i uses seed + i) (default: none, each sequence "
                                  "seeded from its id)");
  app.add_option("--dtype", o.dtype, "weight storage: float32, float16 or bfloat16")->capture_default_str();
  app.add_option("--quantize", o.quantize, std::string(tessera::kQuantizeFlagHelp) + " (model.quantization)")
      ->capture_default_str();
  app.add_option("--quantize-group", o.quantize_group, tessera::kQuantizeGroupHelp)
      ->capture_default_str();
  app.add_option("--bf16-coding", o.bf16_coding, tessera::kBf16CodingFlagHelp)->capture_default_str();
  app.add_option("--quantize-rule", o.quantize_rules,
                 "REGEX=int8|int4|none, repeatable: the first whose regex is found in a linear weight's name decides (default: none)");
  add_weight_streaming_flags(app, o.weights);
  app.add_option("--backend", o.backend, "cpu or cuda")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (0 = all cores)")->capture_default_str();
  app.add_flag("--no-kernel-inject", o.no_kernel_inject, "plain op sequence instead of fused kernels");
  app.add_option("--dump-logits", o.dump_logits,
                 "write float32 LE logits: one vocab row per generated token (row 0 = last prompt position)");
  app.add_flag("--json", o.json, "print {\"prompt_ids\",\"output_ids\",\"text\"} as one JSON line");
  app.add_flag("--stop-at-eos", o.stop_at_eos, "stop when the model emits its EOS token");
  app.add_option("--speculative", o.speculative.method,
                 "speculative decoding: none, ngram (prompt lookup) or draft (a draft model, --draft-model); greedy "
                 "tokens do not change (speculative.method)")
      ->capture_default_str();
  app.add_option("--draft-model", o.speculative.draft_model,
                 "the draft model for --speculative draft: a folder, DeepSpeed JSON or GGUF file sharing the model's "
                 "vocabulary (speculative.draft_model) (default: none)");
  app.add_option("--speculative-tokens", o.speculative.num_tokens, "proposals checked per step, 1 to 16 (speculative.num_tokens)")
      ->capture_default_str();
  app.add_option("--lora", o.lora,
                 "NAME=PATH, repeatable: a LoRA adapter (PEFT folder or GGUF adapter file) loaded beside the model (lora.adapters); "
                 "--prompt-lora says which prompts use it (default: none)");
  app.add_option("--lora-max-rank", o.lora_max_rank, "the largest adapter rank accepted (lora.max_rank)")
      ->capture_default_str();
  app.add_option("--collectives", o.collectives,
                 "how the ranks reduce with --tensor-parallel: auto, shm, gloo (TCP over loopback here) or nccl "
                 "(worker.collectives)")
      ->capture_default_str();
  app.add_option("--lora-max-loras", o.lora_max_loras,
                 "adapters resident at once, and so running at once; 0: all (lora.max_loras)")
      ->capture_default_str();
  app.add_option("--prompt-lora", o.prompt_lora,
                 "the adapter of each prompt: one NAME for all, or NAME,-,NAME,... one per prompt (- = the base model) "
                 "(default: the base model)");
  CLI11_PARSE(app, argc, argv);
  o.seed_given = seed_opt->count() > 0;

  tessera::init_logging("gen", spdlog::level::warn);
  tessera::Status st = tessera::run(o);
  if (!st.is_ok()) {
    std::cerr << "tessera-generate: " << st.to_string() << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run_guarded("tessera-generate", [&] { return generate_main(argc, argv); });
}
