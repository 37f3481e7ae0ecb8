// tessera-bench: the engine benchmark. Generates random prompt ids (any checkpoint works),
// times prefill and decode, and relates them to this machine's two rooflines:
//  - memory: roofline_fraction = decode steps/s × weight bytes per step ÷ bandwidth (CPU: the
//    measured read bandwidth, since a decode step reads its weights and writes almost
//    nothing, so the fraction cannot exceed 1 by more than noise; CUDA: the device's peak);
//  - compute: achieved GFLOP/s of prefill and of decode (bench/model_flops.h) ÷ the measured
//    peak rate of the arithmetic the linear layers run (bench/peak_flops.h; CPU only): f32
//    FMAs, or bf16 dot products for bf16 weights on AVX512_BF16 CPUs ("peak_arithmetic").
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <random>

#include "bench/memory_bandwidth.h"
#include "bench/model_flops.h"
#include "bench/peak_flops.h"
#include "common/logging.h"
#include "common/quantization_flags.h"
#include "kernels/backend.h"
#include "kernels/cpu/linear_cpu.h"
#ifdef TESSERA_WITH_CUDA
#include "kernels/cuda/cuda_probe.h"
#endif
#include "bench/engine_run.h"
#include "tools/lib/prompt_ids.h"
#include "tools/lib/lora_flags.h"
#include "tools/lib/speculative_flags.h"
#include "tools/lib/weight_streaming_flags.h"
#include "worker/draft_model.h"
#include "worker/generator.h"
#include "worker/model_checkpoint.h"
#include "worker/transformer.h"
#include "worker/weight_quantization.h"

namespace tessera {
namespace {

struct Options {
  std::string model;
  WeightStreamingFlags weights;  // --weights-budget, --weights-spill-dir, --weights-cache-dir, --weights-prefetch-layers, --weights-streaming
  std::string dtype = "float32";
  std::string quantize = "auto";            // --quantize auto|none|int8|int4 (docs/quantization.md)
  std::string quantize_group = "auto";  // --quantize-group
  std::vector<std::string> quantize_rules;  // --quantize-rule REGEX=int8|int4|none
  std::string bf16_coding = "auto";  // --bf16-coding
  int prompt_len = 64;
  int gen_len = 32;
  int repetitions = 1;  // timed runs after the warm-up, their tokens and seconds summed (llama-bench -r)
  int batch = 1;
  int threads = 0;
  std::string backend = "cpu";
  bool no_kernel_inject = false;
  bool json = false;
  // The serving path (bench/engine_run.h): --engine, or any --speculative method.
  bool engine = false;
  SpeculativeFlags speculative;  // --speculative, --speculative-tokens, --draft-model, --draft-min-probability
  std::vector<std::string> lora;  // --lora NAME=PATH: adapters the sequences take in turn (serving path)
  std::string prompt_ids_file;       // real prompts instead of random ids (batch at a time)
};

int64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

// What the report says of the weights' quantization (resolved against the checkpoint).
std::string quantization_label(const QuantizationOptions& q) {
  if (q.kind == WeightQuantization::kInt4) return ", int4 weights";
  if (q.kind != WeightQuantization::kInt8) return "";
  return q.keep_blocks ? ", its quantized matrices in their own bits (int8 for q8_0)" : ", int8 weights";
}

Status run(const Options& o) {
  auto dtype = parse_float_dtype(o.dtype);
  if (!dtype) {
    return invalid_argument("--dtype: unsupported \"" + o.dtype + "\" (expected float32, float16 or bfloat16)");
  }
  if (o.prompt_len < 1 || o.gen_len < 2 || o.batch < 1) {
    return invalid_argument("--prompt-len and --batch must be >= 1, --gen-len >= 2");
  }
  if (o.repetitions < 1) return invalid_argument("--repetitions must be >= 1, not " + std::to_string(o.repetitions));
  TESSERA_ASSIGN_OR_RETURN(const QuantizationOptions quant,
                           quantization_from_flags(o.quantize, o.quantize_group, o.quantize_rules, o.bf16_coding));
  // No configuration: the kernels' defaults with the TESSERA_CPU_* variables over them.
  TESSERA_ASSIGN_OR_RETURN(const KernelOptions kernels, kernel_options_from_environment());
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, make_backend(o.backend, BackendOptions{o.threads, 0, kernels}));
  ModelLoadOptions lo;
  {
    // What --quantize auto becomes for this model (4-bit and int8 weights for a GGUF file of quantized blocks),
    // decided once, before loading, so that the report below can say it.
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, open_model_checkpoint(o.model));
    lo.quant = resolve_quantization(quant, *ckpt);
  }
  lo.dtype = *dtype;
  lo.kernel_inject = !o.no_kernel_inject;
  TESSERA_ASSIGN_OR_RETURN(lo.residency, weight_residency_from_flags(o.weights));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> model, Transformer::load(o.model, lo, *backend));
  if (const WeightResidency* r = model->residency()) std::cerr << r->plan() << "\n";
  const ModelConfig& c = model->config();
  // What model.bf16_coding auto became: the report says which bf16 ran.
  const std::string coding_label = coded_bf16_linears(model->weights()) > 0 ? ", coded bf16 linears" : "";

  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> id(std::min<int64_t>(3, c.vocab - 1), static_cast<int32_t>(c.vocab - 1));
  std::vector<std::vector<int32_t>> prompts;
  if (!o.prompt_ids_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(prompts, read_prompt_file(o.prompt_ids_file));
  } else {
    prompts.resize(static_cast<size_t>(o.batch));
    for (auto& p : prompts)
      for (int i = 0; i < o.prompt_len; ++i) p.push_back(id(rng));
  }
  TESSERA_ASSIGN_OR_RETURN(const SpeculativeConfig spec, speculative_from_flags(o.speculative));
  const bool via_engine = o.engine || spec.enabled() || !o.prompt_ids_file.empty() || !o.lora.empty();
  if (via_engine && o.repetitions != 1) {
    return invalid_argument("--repetitions is for the bare generation loop, not the serving path (--engine, --speculative, "
                            "--lora, --prompt-ids-file)");
  }
  TESSERA_ASSIGN_OR_RETURN(const auto lora_flags, lora_adapters_from_flags(o.lora));
  std::vector<LoraWeights> adapters;
  for (const auto& [name, dir] : lora_flags) {
    TESSERA_ASSIGN_OR_RETURN(LoraWeights a, load_lora_weights(name, dir, o.model, model->weights(), model->dtype(), 4096));
    adapters.push_back(std::move(a));
  }
  std::unique_ptr<Transformer> draft;
  if (spec.method == SpeculativeConfig::Method::kDraft) {
    TESSERA_RETURN_IF_ERROR(check_draft_model(spec.draft_model, c, c.max_positions > 0 ? c.max_positions : 4096).status());
    TESSERA_ASSIGN_OR_RETURN(draft, load_draft_model(spec.draft_model, lo, *backend));
  }
  GenerationTimings t;
  SpecDecodeStats spec_stats;
  RowCostCurve row_costs;  // with speculation (bench/engine_run.h)
  if (via_engine) {
    EngineRunOptions eo;
    eo.batch = o.batch;
    eo.gen_len = o.gen_len;
    eo.speculative = spec;
    eo.adapters = adapters;
    // Warm-up: the first group, 2 new tokens (pages in the weights and the buffers).
    EngineRunOptions warm = eo;
    warm.gen_len = 2;
    const std::vector<std::vector<int32_t>> first(prompts.begin(),
                                                  prompts.begin() + std::min<size_t>(prompts.size(), o.batch));
    TESSERA_ASSIGN_OR_RETURN(const EngineRunResult warmed, run_through_engine(*model, draft.get(), *backend, first, warm));
    eo.row_costs = warmed.row_costs;  // measured once, after the weights were paged in
    TESSERA_ASSIGN_OR_RETURN(const EngineRunResult run, run_through_engine(*model, draft.get(), *backend, prompts, eo));
    t = run.timings;
    spec_stats = run.spec;
    row_costs = run.row_costs;
  } else {
    std::vector<GenerationRequest> reqs(prompts.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].prompt = prompts[i];
      reqs[i].max_new_tokens = o.gen_len;
    }
    Generator gen(*model, *backend);
    // Warm-up with the timed run's own shape (every prompt, 2 new tokens), as llama-bench
    // warms up each test: it pages in the weights, and the activation buffers and per-thread
    // GEMM scratch of this prompt length and batch. An 8-token warm-up left those cold (8
    // rows take the GEMV), so the timed prefill paid their page faults.
    std::vector<GenerationRequest> warm = reqs;
    for (GenerationRequest& r : warm) r.max_new_tokens = 2;
    TESSERA_RETURN_IF_ERROR(gen.generate(warm, false).status());
    for (int r = 0; r < o.repetitions; ++r) {
      GenerationTimings one;
      TESSERA_RETURN_IF_ERROR(gen.generate(reqs, false, &one).status());
      t.prefill_seconds += one.prefill_seconds;
      t.decode_seconds += one.decode_seconds;
      t.prefill_tokens += one.prefill_tokens;
      t.decode_tokens += one.decode_tokens;
      t.decode_steps += one.decode_steps;
    }
  }
  // Peak RSS of loading + generating, taken before the bandwidth probe allocates its arrays.
  const int64_t peak_rss = peak_rss_bytes();
  // The roofline's bandwidth: on the CPU, what a large read-and-sum achieves here (decode
  // reads weights; the copy figure, read + write, is reported beside it for comparison
  // with older runs); on a GPU, the device's theoretical peak, as the target
  // ("fraction of the device's peak memory bandwidth") is stated.
  const bool cpu = backend->kind() == BackendKind::kCpu;
  double bandwidth = 0.0;
#ifdef TESSERA_WITH_CUDA
  if (backend->kind() == BackendKind::kCuda) bandwidth = cuda::peak_memory_bandwidth_gb_s(0);
#endif
  const double copy_bandwidth = cpu ? measure_copy_bandwidth_gb_s() : 0.0;
  const double read_bandwidth = cpu ? measure_read_bandwidth_gb_s() : 0.0;
  if (bandwidth <= 0.0) bandwidth = read_bandwidth;
  // The peak of the arithmetic the linear layers run: bf16 weights on an AVX512_BF16 CPU
  // multiply with bf16 dot products (unless TESSERA_CPU_BF16_DOT=0), whose rate is twice the
  // f32 FMA rate; against the FMA peak their fraction would read above 1.
  const bool bf16_dot = cpu && *dtype == DType::kBF16 && !lo.quant.enabled() && kernels.cpu.bf16_dot &&
                        cpu::usable_cpu_isa(kernels.cpu.isa) == cpu::CpuIsa::kAvx512 && cpu_has_bf16_dot_probe();
  const double fma_gflop_s = cpu ? measure_peak_fma_gflop_s() : 0.0;
  const double peak_gflop_s = bf16_dot ? measure_peak_bf16_dot_gflop_s() : fma_gflop_s;
  const ModelFlops flops = model_flops(model->weights(), c, model->shard().q_heads);
  // (With a prompt file, its mean length; with speculation the decode steps also score the
  // proposals, which these figures leave out.)
  // (With --repetitions, the figures of one run times their count over the summed seconds.)
  const int64_t runs = via_engine ? 1 : o.repetitions;
  const int mean_prompt = static_cast<int>(t.prefill_tokens / static_cast<int64_t>(prompts.size()) / runs);
  const double prefill_gflop_s = runs * prefill_flops(flops, o.batch, mean_prompt) / t.prefill_seconds / 1e9;
  const double decode_gflop_s =
      runs * decode_flops(flops, o.batch, mean_prompt, t.decode_steps / runs) / t.decode_seconds / 1e9;
  auto of_peak = [&](double gflop_s) { return peak_gflop_s > 0 ? gflop_s / peak_gflop_s : 0.0; };

  const double prefill_tok_s = t.prefill_tokens / t.prefill_seconds;
  const double decode_tok_s = t.decode_tokens / t.decode_seconds;
  const double steps_s = t.decode_steps / t.decode_seconds;
  const int64_t weight_bytes = model->weights().decode_bytes_per_token;
  const double roofline = steps_s * static_cast<double>(weight_bytes) / (bandwidth * 1e9);
  nlohmann::json j;
  j["prefill_tok_s"] = prefill_tok_s;
  j["decode_tok_s"] = decode_tok_s;
  j["weight_bytes"] = weight_bytes;
  j["bandwidth_gb_s"] = bandwidth;
  j["roofline_fraction"] = roofline;
  j["peak_rss_bytes"] = peak_rss;
  // Weight streaming (--weights-budget): the budget, what a step streams, the most held.
  const WeightResidency* residency = model->residency();
  j["weights_budget_bytes"] = residency ? residency->budget_bytes() : model->weights().total_bytes;
  j["weights_streamed_bytes"] = residency ? residency->streamed_bytes() : 0;
  j["weights_peak_resident_bytes"] = residency ? residency->peak_resident_bytes() : model->weights().total_bytes;
  // Added by issue 17 (the fields above keep their names and meaning; bandwidth_gb_s is now
  // the read bandwidth on the CPU). 0 where not measured (copy/read/peak on a GPU).
  j["read_bandwidth_gb_s"] = read_bandwidth;
  j["copy_bandwidth_gb_s"] = copy_bandwidth;
  j["peak_gflop_s"] = peak_gflop_s;
  j["peak_arithmetic"] = !cpu ? "none" : (bf16_dot ? "bf16_dot" : "f32_fma");
  j["peak_fma_gflop_s"] = fma_gflop_s;
  j["prefill_gflop_s"] = prefill_gflop_s;
  j["prefill_compute_fraction"] = of_peak(prefill_gflop_s);
  j["decode_gflop_s"] = decode_gflop_s;
  j["decode_compute_fraction"] = of_peak(decode_gflop_s);
  j["batch"] = o.batch;
  // The serving path's and speculative decoding's figures (bench/engine_run.h).
  j["path"] = via_engine ? "engine" : "generator";
  j["speculative"] = o.speculative.method;
  j["speculative_tokens"] = spec.enabled() ? spec.num_tokens : 0;
  j["draft_model"] = spec.draft_model;
  j["lora_adapters"] = adapters.size();  // --lora: the sequences took them in turn
  j["decode_tokens"] = t.decode_tokens;
  j["decode_steps"] = t.decode_steps;
  j["repetitions"] = runs;
  j["spec_num_drafts"] = spec_stats.num_drafts;
  j["spec_num_draft_tokens"] = spec_stats.num_draft_tokens;
  j["spec_num_accepted_tokens"] = spec_stats.num_accepted_tokens;
  // Accepted proposals of those checked, and tokens a speculating step yields (1 + accepted).
  j["acceptance_rate"] = spec_stats.num_draft_tokens > 0 ? static_cast<double>(spec_stats.num_accepted_tokens) /
                                                               static_cast<double>(spec_stats.num_draft_tokens)
                                                         : 0.0;
  j["mean_accepted_length"] = spec_stats.num_drafts > 0 ? 1.0 + static_cast<double>(spec_stats.num_accepted_tokens) /
                                                                    static_cast<double>(spec_stats.num_drafts)
                                                        : 0.0;
  // A step's time by its rows as measured for the speculation back-off: [[rows, seconds], ...].
  j["row_costs"] = nlohmann::json::array();
  for (const auto& [rows, seconds] : row_costs.measured()) j["row_costs"].push_back({rows, seconds});
  j["nearly_free_rows"] = row_costs.nearly_free_rows();
  if (o.json) {
    std::cout << j.dump() << std::endl;
  } else {
    std::cout << "model " << o.model << " (" << c.model_type << ", " << dtype_name(*dtype)
              << quantization_label(lo.quant) << coding_label << (lo.kernel_inject ? ", fused" : ", plain") << ")\n"
              << "prefill: " << prefill_tok_s << " tok/s (" << t.prefill_tokens << " tokens)\n"
              << "decode:  " << decode_tok_s << " tok/s (batch " << o.batch << ", " << t.decode_steps << " steps"
              << (via_engine ? ", serving path" : "") << ")\n"
              << "weights read per step: " << weight_bytes / 1e6 << " MB; bandwidth " << bandwidth
              << (backend->kind() == BackendKind::kCuda ? " GB/s (device peak)" : " GB/s (host read)")
              << "; roofline fraction " << roofline << "\n";
    if (cpu) {
      std::cout << "host copy bandwidth " << copy_bandwidth << " GB/s (read + write); peak FMA " << fma_gflop_s
                << " GFLOP/s (" << peak_fma_isa() << ")";
      if (bf16_dot) std::cout << "; peak bf16 dot " << peak_gflop_s << " GFLOP/s (the linears' arithmetic here)";
      std::cout << "\n"
                << "prefill compute: " << prefill_gflop_s << " GFLOP/s = " << of_peak(prefill_gflop_s)
                << " of peak; decode compute: " << decode_gflop_s << " GFLOP/s = " << of_peak(decode_gflop_s)
                << " of peak\n";
    }
    std::cout
              << "peak RSS: " << peak_rss / 1e6 << " MB" << std::endl;
  }
  return Status::ok();
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::Options o;
  CLI::App app{"tessera-bench: prefill/decode throughput, memory-bandwidth roofline (read bandwidth) and compute roofline (measured peak FMA rate)"};
  app.add_option("--model", o.model, "Hugging Face model folder or DeepSpeed checkpoint JSON")->required();
  app.add_option("--dtype", o.dtype, "float32, bfloat16 or float16")->capture_default_str();
  add_weight_streaming_flags(app, o.weights);
  app.add_option("--quantize", o.quantize, tessera::kQuantizeFlagHelp)->capture_default_str();
  app.add_option("--quantize-group", o.quantize_group, tessera::kQuantizeGroupHelp)
      ->capture_default_str();
  app.add_option("--bf16-coding", o.bf16_coding, tessera::kBf16CodingFlagHelp)->capture_default_str();
  app.add_option("--quantize-rule", o.quantize_rules, "REGEX=int8|int4|none, repeatable, e.g. lm_head=int8 (default: none)");
  app.add_option("--prompt-len", o.prompt_len, "prompt tokens per sequence")->capture_default_str();
  app.add_option("--gen-len", o.gen_len, "generated tokens per sequence")->capture_default_str();
  app.add_option("--batch", o.batch, "sequences run together")->capture_default_str();
  app.add_option("--repetitions", o.repetitions,
                 "timed runs of the bare generation loop after the warm-up, their tokens and seconds summed (as "
                 "llama-bench -r)")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (0 = all cores)")->capture_default_str();
  app.add_option("--backend", o.backend, "cpu or cuda")->capture_default_str();
  app.add_flag("--no-kernel-inject", o.no_kernel_inject, "plain op sequence instead of fused kernels");
  app.add_flag("--json", o.json, "print one JSON object");
  app.add_flag("--engine", o.engine,
               "run through the serving path (Engine + Scheduler + Executor) instead of the bare generation loop");
  app.add_option("--lora", o.lora,
                 "NAME=PATH, repeatable: LoRA adapters on the serving path; sequence i of a batch runs with the "
                 "(i mod N)-th (default: none)");
  app.add_option("--speculative", o.speculative.method,
                 "speculative decoding on the serving path: none, ngram or draft (--draft-model)")
      ->capture_default_str();
  app.add_option("--speculative-tokens", o.speculative.num_tokens, "proposals checked per step, 1 to 16")
      ->capture_default_str();
  app.add_option("--draft-model", o.speculative.draft_model, "the draft model of --speculative draft (default: none)");
  app.add_option("--draft-min-probability", o.speculative.draft_min_probability,
                 "proposals end at the first the draft gives less than this probability "
                 "(speculative.draft_min_probability)")
      ->capture_default_str();
  app.add_option("--prompt-ids-file", o.prompt_ids_file,
                 "prompts as token ids, one comma-separated list per line, run --batch at a time on the serving "
                 "path (default: none: --batch random prompts of --prompt-len)");
  CLI11_PARSE(app, argc, argv);
  tessera::init_logging("bench", spdlog::level::warn);
  tessera::Status st = tessera::run(o);
  if (!st.is_ok()) {
    std::cerr << "tessera-bench: " << st.to_string() << std::endl;
    return 1;
  }
  return 0;
}
