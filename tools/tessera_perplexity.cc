// tessera-perplexity: scores a text file with a model by the rule of
// ../shared/fixtures/README.md section 10 (coordinator/engine/perplexity_chunks.h), through the
// serving engine: every chunk is one request asking its prompt logprobs (the completions
// API's echo + logprobs), batched by the scheduler like any other, computed by the
// executors (in-process, or --tensor-parallel N worker processes). Prints tokens scored,
// mean negative log-likelihood (nats) and perplexity; --json makes the last line
// {"tokens_scored", "total_nll", "mean_nll", "perplexity"}.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/input_file.h"
#include "common/logging.h"
#include "common/quantization_flags.h"
#include "common/tokenizer/model_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/engine/engine.h"
#include "coordinator/engine/perplexity_chunks.h"
#include "tools/lib/local_executor.h"
#include "tools/lib/main_guard.h"
#include "worker/model_checkpoint.h"
#include "worker/model_config.h"

namespace tessera {
namespace {

struct Options {
  std::string model;
  std::string text_file;
  int64_t context = 0;  // --context; the model's when not given
  bool context_given = false;
  std::string dtype = "float32";
  std::string quantize = "auto";
  std::string quantize_group = "auto";
  std::vector<std::string> quantize_rules;
  std::string bf16_coding = "auto";  // --bf16-coding
  int tensor_parallel = 1;
  std::string backend = "cpu";
  int threads = 0;
  bool no_kernel_inject = false;
  int max_num_seqs = 16;
  int max_num_batched_tokens = 2048;
  bool json = false;
};

// One document per line (a trailing '\r' dropped); blank lines are not documents.
StatusOr<std::vector<std::string>> read_documents(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(const std::string text, read_input_file(path, "--text-file", size_t{1} << 30));
  std::istringstream in(text);
  std::vector<std::string> docs;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) docs.push_back(std::move(line));
  }
  if (docs.empty()) return invalid_argument("--text-file: " + path + " holds no text");
  return docs;
}

// "scored 12,345 / 29,151 tokens" redrawn in place on a terminal, at most every 200 ms.
class Progress {
 public:
  Progress(int64_t total, bool enabled) : total_(total), enabled_(enabled) {}
  void update(int64_t done, bool force = false) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    const int width = 30;
    const int filled = total_ > 0 ? static_cast<int>(width * done / total_) : width;
    std::fprintf(stderr, "\r[%s%s] %lld / %lld tokens", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), static_cast<long long>(done),
                 static_cast<long long>(total_));
    std::fflush(stderr);
  }
  void finish() {
    if (enabled_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  int64_t total_;
  bool enabled_;
  std::chrono::steady_clock::time_point last_{};
};

Status run(const Options& o) {
  const auto dtype = parse_float_dtype(o.dtype);
  if (!dtype) return invalid_argument("--dtype: unsupported \"" + o.dtype + "\" (expected float32, float16 or bfloat16)");
  TESSERA_ASSIGN_OR_RETURN(const QuantizationOptions quant, quantization_from_flags(o.quantize, o.quantize_group, o.quantize_rules, o.bf16_coding));
  if (o.max_num_seqs < 1) return invalid_argument("--max-num-seqs must be at least 1");
  if (o.max_num_batched_tokens < o.max_num_seqs)
    return invalid_argument("--max-num-batched-tokens must be at least --max-num-seqs");

  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, open_model_checkpoint(o.model));
  TESSERA_ASSIGN_OR_RETURN(const ModelConfig config,
                           parse_model_config(ckpt->config(), ckpt->config_source()));
  const std::string config_dir = ckpt->config_dir();
  ckpt.reset();
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, load_model_tokenizer(o.model, config_dir));

  const int64_t context = o.context_given ? o.context : config.max_positions;
  if (context < 2) {
    return invalid_argument(o.context_given ? "--context must be at least 2, got " + std::to_string(o.context)
                                            : "the model states no context length (max_position_embeddings): give --context");
  }
  if (config.max_positions > 0 && context > config.max_positions) {
    return invalid_argument("--context " + std::to_string(context) + " exceeds the model's context of " +
                            std::to_string(config.max_positions) + " tokens");
  }

  TESSERA_ASSIGN_OR_RETURN(const std::vector<std::string> docs, read_documents(o.text_file));
  std::vector<PerplexityChunk> chunks;
  int64_t to_score = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    std::vector<int32_t> ids;
    if (config.bos_id >= 0) ids.push_back(config.bos_id);
    const std::vector<int32_t> text = tokenizer->encode(docs[d], /*add_special_tokens=*/false);
    ids.insert(ids.end(), text.begin(), text.end());
    if (config.eos_id >= 0) ids.push_back(config.eos_id);
    if (ids.size() > 1) to_score += static_cast<int64_t>(ids.size()) - 1;
    append_perplexity_chunks(ids, static_cast<int>(d), context, &chunks);
  }

  // Up to max_num_seqs chunks at once, each with room for its prompt and the one token the
  // engine samples after it (discarded).
  SchedulerConfig sc;
  sc.max_num_seqs = o.max_num_seqs;
  sc.max_num_batched_tokens = o.max_num_batched_tokens;
  sc.max_model_len = static_cast<int>(context + 1);
  sc.num_blocks = o.max_num_seqs * static_cast<int>((context + 1 + sc.block_size - 1) / sc.block_size);
  sc.sliding_window = config.kv_window();
  TESSERA_RETURN_IF_ERROR(validate_scheduler_config(sc));

  LocalExecutorOptions lo;
  lo.model = o.model;
  lo.dtype = *dtype;
  lo.kernel_inject = !o.no_kernel_inject;
  lo.tensor_parallel = o.tensor_parallel;
  lo.backend = o.backend;
  lo.threads = o.threads;
  lo.quant = quant;
  lo.program = "tessera-ppl";
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<LocalExecutor> local, LocalExecutor::start(lo, sc));
  Engine engine(sc, local->executor());

  // Chunk i is request i + 1; its logprob of token p (>= 1) lands in scores[i][p] (a chunk
  // recomputed after preemption reports positions again, with the same values).
  std::vector<std::vector<double>> scores(chunks.size());
  std::vector<std::vector<bool>> seen(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    auto req = std::make_shared<Request>();
    req->prompt = chunks[i].tokens;
    req->max_tokens = 1;
    req->sampling.temperature = 0;
    req->sampling.prompt_logprobs = 0;  // the scored token's logprob only
    req->stop.ignore_eos = true;
    scores[i].assign(chunks[i].tokens.size(), 0.0);
    seen[i].assign(chunks[i].tokens.size(), false);
    TESSERA_RETURN_IF_ERROR(engine.add_request(static_cast<RequestId>(i + 1), std::move(req)));
  }
  Progress progress(to_score, isatty(STDERR_FILENO) == 1);
  int64_t scored = 0;
  while (engine.has_work()) {
    for (const SequenceEvent& ev : engine.step()) {
      if (ev.finished && ev.reason == FinishReason::kError) return internal_error("scoring failed: " + ev.error);
      const size_t i = static_cast<size_t>(request_of(ev.seq_id) - 1);
      for (const PromptLogprob& lp : ev.prompt_logprobs) {
        const size_t p = static_cast<size_t>(lp.position);
        if (i >= chunks.size() || p < 1 || p >= scores[i].size() || chunks[i].tokens[p] != lp.token) {
          return internal_error("the engine returned a logprob for position " + std::to_string(lp.position) +
                                " of sequence " + std::to_string(ev.seq_id) + " that it was not asked for");
        }
        if (!seen[i][p]) ++scored;
        seen[i][p] = true;
        scores[i][p] = lp.logprob;
      }
    }
    progress.update(scored);
  }
  progress.update(scored, /*force=*/true);
  progress.finish();
  double total = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (size_t p = 1; p < scores[i].size(); ++p) {
      if (!seen[i][p]) {
        return internal_error("document " + std::to_string(chunks[i].document + 1) + ": no logprob came back for a token");
      }
      total -= scores[i][p];
    }
  }
  if (scored != to_score) return internal_error("scored " + std::to_string(scored) + " of " + std::to_string(to_score) + " tokens");
  const double mean = scored > 0 ? total / static_cast<double>(scored) : 0.0;
  const double ppl = std::exp(mean);
  std::cout << "documents:     " << docs.size() << "\n"
            << "tokens scored: " << scored << "\n"
            << "mean NLL:      " << mean << " nats/token\n"
            << "perplexity:    " << ppl << std::endl;
  if (o.json) {
    nlohmann::json j;
    j["tokens_scored"] = scored;
    j["total_nll"] = total;
    j["mean_nll"] = mean;
    j["perplexity"] = ppl;
    std::cout << j.dump() << std::endl;
  }
  return Status::ok();
}

}  // namespace
}  // namespace tessera

namespace {

int perplexity_main(int argc, char** argv) {
  tessera::Options o;
  CLI::App app{"tessera-perplexity: score a text file (one document per line) with a model, through the serving engine"};
  app.add_option("--model", o.model, "Hugging Face model folder, DeepSpeed checkpoint JSON or GGUF file")->required();
  app.add_option("--text-file", o.text_file, "UTF-8 text, one document per line")->required();
  auto* context_opt =
      app.add_option("--context", o.context, "tokens per chunk (default: the model's context); chunks share one token");
  app.add_option("--dtype", o.dtype, "weight storage: float32, float16 or bfloat16")->capture_default_str();
  app.add_option("--quantize", o.quantize, tessera::kQuantizeFlagHelp)->capture_default_str();
  app.add_option("--quantize-group", o.quantize_group, tessera::kQuantizeGroupHelp)
      ->capture_default_str();
  app.add_option("--bf16-coding", o.bf16_coding, tessera::kBf16CodingFlagHelp)->capture_default_str();
  app.add_option("--quantize-rule", o.quantize_rules,
                 "REGEX=int8|int4|none, repeatable: the first whose regex is found in a linear weight's name decides (default: none)");
  app.add_option("--tensor-parallel", o.tensor_parallel, "run through N tessera-worker processes")->capture_default_str();
  app.add_option("--backend", o.backend, "cpu or cuda")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (0 = all cores)")->capture_default_str();
  app.add_flag("--no-kernel-inject", o.no_kernel_inject, "plain op sequence instead of fused kernels");
  app.add_option("--max-num-seqs", o.max_num_seqs, "chunks computed together")->capture_default_str();
  app.add_option("--max-num-batched-tokens", o.max_num_batched_tokens, "token budget of one step")->capture_default_str();
  app.add_flag("--json", o.json, "print {\"tokens_scored\",\"total_nll\",\"mean_nll\",\"perplexity\"} as the last line");
  CLI11_PARSE(app, argc, argv);
  o.context_given = context_opt->count() > 0;

  tessera::init_logging("ppl", spdlog::level::warn);
  tessera::Status st = tessera::run(o);
  if (!st.is_ok()) {
    std::cerr << "tessera-perplexity: " << st.to_string() << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run_guarded("tessera-perplexity", [&] { return perplexity_main(argc, argv); });
}
