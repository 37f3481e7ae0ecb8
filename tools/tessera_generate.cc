// tessera-generate: one process, no server, tensor-parallel size 1. Loads a model, runs the
// prompt(s) and prints the continuation (see DESIGN.md §6 for the contract).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/logging.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/backend.h"
#include "worker/generator.h"
#include "worker/transformer.h"

namespace tessera {
namespace {

struct Options {
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  int max_new_tokens = 16;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  std::string dtype = "float32";
  std::string backend = "cpu";
  bool no_kernel_inject = false;
  std::string dump_logits;
  bool json = false;
  bool stop_at_eos = false;
  int threads = 0;
};

StatusOr<std::vector<int32_t>> parse_id_list(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos) return invalid_argument(what + ": empty entry in \"" + text + "\"");
    item = item.substr(b, e - b + 1);
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < INT32_MIN || v > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      return invalid_argument(what + ": \"" + item + "\" is not an integer token id");
    }
  }
  if (ids.empty()) return invalid_argument(what + ": no token ids given");
  return ids;
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

Status run(const Options& o) {
  auto dtype = parse_dtype(o.dtype);
  if (!dtype || (*dtype != DType::kF32 && *dtype != DType::kF16 && *dtype != DType::kBF16)) {
    return invalid_argument("--dtype: unsupported \"" + o.dtype + "\" (expected float32, float16 or bfloat16)");
  }
  if (o.prompt.empty() == o.prompt_ids.empty()) {
    return invalid_argument("give exactly one of --prompt TEXT or --prompt-ids 1,2,3");
  }
  if (o.max_new_tokens < 1) return invalid_argument("--max-new-tokens must be at least 1");
  if (o.temperature < 0) return invalid_argument("--temperature must be >= 0");
  if (o.top_p <= 0 || o.top_p > 1) return invalid_argument("--top-p must be in (0, 1]");

  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, make_backend(o.backend, o.threads));
  ModelLoadOptions lo;
  lo.dtype = *dtype;
  lo.kernel_inject = !o.no_kernel_inject;
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> model, Transformer::load(o.model, lo, *backend));

  // The tokenizer is optional for --prompt-ids (random-weight test models have none).
  std::unique_ptr<Tokenizer> tokenizer;
  auto tok = Tokenizer::load(model->config_dir());
  if (tok.is_ok()) {
    tokenizer = std::move(tok).value();
  } else if (!o.prompt.empty()) {
    return tok.status().with_context("--prompt needs the model's tokenizer");
  }

  GenerationRequest req;
  if (!o.prompt.empty()) {
    req.prompt = tokenizer->encode(o.prompt, /*add_special_tokens=*/true);
  } else {
    TESSERA_ASSIGN_OR_RETURN(req.prompt, parse_id_list(o.prompt_ids, "--prompt-ids"));
  }
  req.max_new_tokens = o.max_new_tokens;
  req.sampling.temperature = o.temperature;
  req.sampling.top_k = o.top_k;
  req.sampling.top_p = o.top_p;
  req.sampling.seed = o.seed;
  req.stop_at_eos = o.stop_at_eos;

  Generator generator(*model, *backend);
  TESSERA_ASSIGN_OR_RETURN(std::vector<GenerationResult> results,
                           generator.generate({req}, !o.dump_logits.empty()));
  const GenerationResult& r = results[0];
  if (!o.dump_logits.empty()) TESSERA_RETURN_IF_ERROR(write_logits(o.dump_logits, r.logits));

  std::string text;
  if (tokenizer) text = tokenizer->decode(r.output, /*skip_special_tokens=*/true);
  if (o.json) {
    nlohmann::json j;
    j["prompt_ids"] = req.prompt;
    j["output_ids"] = r.output;
    if (tokenizer) j["text"] = text;
    // Invalid UTF-8 (a continuation cut mid-character) is replaced, never a crash.
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  } else if (tokenizer) {
    // For people: the prompt and its continuation as one text.
    std::vector<int32_t> all = req.prompt;
    all.insert(all.end(), r.output.begin(), r.output.end());
    std::cout << tokenizer->decode(all, /*skip_special_tokens=*/true) << std::endl;
  } else {
    std::cout << ids_json(r.output) << std::endl;
  }
  return Status::ok();
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::Options o;
  CLI::App app{"tessera-generate: run a model on one prompt in this process (no server)"};
  app.add_option("--model", o.model, "Hugging Face model folder or DeepSpeed checkpoint JSON")->required();
  app.add_option("--prompt", o.prompt, "prompt text (encoded with the model's tokenizer, BOS added)");
  app.add_option("--prompt-ids", o.prompt_ids, "prompt as comma-separated token ids, e.g. 1,2,3");
  app.add_option("--max-new-tokens", o.max_new_tokens, "tokens to generate")->capture_default_str();
  app.add_option("--temperature", o.temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-k", o.top_k, "sample from the k most likely tokens (0 = all)");
  app.add_option("--top-p", o.top_p, "nucleus sampling mass");
  app.add_option("--seed", o.seed, "random seed for sampling");
  app.add_option("--dtype", o.dtype, "weight storage: float32, float16 or bfloat16")->capture_default_str();
  app.add_option("--backend", o.backend, "cpu or cuda")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (0 = all cores)");
  app.add_flag("--no-kernel-inject", o.no_kernel_inject, "plain op sequence instead of fused kernels");
  app.add_option("--dump-logits", o.dump_logits,
                 "write float32 LE logits: one vocab row per generated token (row 0 = last prompt position)");
  app.add_flag("--json", o.json, "print {\"prompt_ids\",\"output_ids\",\"text\"} as one JSON line");
  app.add_flag("--stop-at-eos", o.stop_at_eos, "stop when the model emits its EOS token");
  CLI11_PARSE(app, argc, argv);

  tessera::init_logging("gen", spdlog::level::warn);
  tessera::Status st = tessera::run(o);
  if (!st.is_ok()) {
    std::cerr << "tessera-generate: " << st.to_string() << std::endl;
    return 1;
  }
  return 0;
}
