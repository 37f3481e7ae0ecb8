// Single-thread encode throughput (MB/s) of the tokenizer on ~1 MiB of mixed English,
// code and CJK text, for a byte-level (GPT-2) and a byte-fallback (Llama 2) tokenizer,
// plus streaming decode. Tokenizer folders: $TESSERA_BYTE_LEVEL_TOKENIZER and
// $TESSERA_BYTE_FALLBACK_TOKENIZER, else <fixtures>/tokenizers/{gpt2,llama2-spm} with
// fixtures from $TESSERA_FIXTURES or ../shared/fixtures; a benchmark whose files are
// absent is skipped with a message.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"

namespace {

std::string fixtures_root() {
  if (const char* env = std::getenv("TESSERA_FIXTURES")) return env;
  for (const char* candidate : {"../shared/fixtures", "../../shared/fixtures", "../../../shared/fixtures"}) {
    if (std::filesystem::is_directory(candidate)) return candidate;
  }
  return "";
}

std::string tokenizer_dir(const char* env_var, const char* fixture_name) {
  if (const char* env = std::getenv(env_var)) return env;
  const std::string root = fixtures_root();
  return root.empty() ? "" : root + "/tokenizers/" + fixture_name;
}

// Deterministic mixed text: English prose, C++ code, Chinese/Japanese, a little emoji.
const std::string& corpus() {
  static const std::string text = [] {
    const std::vector<std::string> english = {
        "In the beginning God created the heaven and the earth. ", "The quick brown fox jumps over the lazy dog; ",
        "Tokenizers split text into pieces, and models read them. ", "It's 2024, and we've shipped 3.5x faster kernels! ",
        "\"Don't panic,\" she said, \"it'll work.\" ", "Serving large language models needs batching.\n"};
    const std::vector<std::string> code = {
        "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\n", "    if (!status.is_ok()) return status;\n",
        "def forward(self, x):\n        return self.proj(x) + x\n", "std::vector<int32_t> ids = tok.encode(text, true);\n",
        "#include <unordered_map>\n", "\t\tconst auto& [key, value] = *it;  // 0x7fff\n"};
    const std::vector<std::string> cjk = {
        "\xE6\x88\x91\xE4\xBB\xAC\xE7\x9A\x84\xE6\xA8\xA1\xE5\x9E\x8B\xE5\x8F\xAF\xE4\xBB\xA5\xE5\xA4\x84\xE7\x90\x86\xE4\xB8\xAD\xE6\x96\x87\xE3\x80\x82",
        "\xE6\x9D\xB1\xE4\xBA\xAC\xE3\x81\xAF\xE6\x97\xA5\xE6\x9C\xAC\xE3\x81\xAE\xE9\xA6\x96\xE9\x83\xBD\xE3\x81\xA7\xE3\x81\x99\xE3\x80\x82",
        "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 \xED\x85\x8D\xEC\x8A\xA4\xED\x8A\xB8 ",
        "\xF0\x9F\x98\x80 \xF0\x9F\x9A\x80 "};
    std::mt19937 rng(2024);
    std::string s;
    while (s.size() < (1u << 20)) {
      const int kind = static_cast<int>(rng() % 10);
      const auto& pool = kind < 5 ? english : kind < 8 ? code : cjk;
      s += pool[rng() % pool.size()];
      if (rng() % 7 == 0) s += std::to_string(rng() % 100000) + " ";  // vary the words a little
    }
    return s;
  }();
  return text;
}

void encode_bench(benchmark::State& state, const char* env_var, const char* fixture) {
  const std::string dir = tokenizer_dir(env_var, fixture);
  auto tok = dir.empty() ? tessera::StatusOr<std::unique_ptr<tessera::Tokenizer>>(tessera::not_found("no fixtures"))
                         : tessera::Tokenizer::load(dir);
  if (!tok.is_ok()) {
    state.SkipWithError(("tokenizer not found (set " + std::string(env_var) + "): " + tok.status().to_string()).c_str());
    return;
  }
  const std::string& text = corpus();
  size_t n_tokens = 0;
  for (auto _ : state) {
    auto ids = tok.value()->encode(text, false);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["MB/s"] = benchmark::Counter(static_cast<double>(state.iterations() * text.size()) / 1e6,
                                              benchmark::Counter::kIsRate);
  state.counters["tokens"] = static_cast<double>(n_tokens);
  state.counters["input_bytes"] = static_cast<double>(text.size());
}

void stream_decode_bench(benchmark::State& state, const char* env_var, const char* fixture) {
  const std::string dir = tokenizer_dir(env_var, fixture);
  auto tok = dir.empty() ? tessera::StatusOr<std::unique_ptr<tessera::Tokenizer>>(tessera::not_found("no fixtures"))
                         : tessera::Tokenizer::load(dir);
  if (!tok.is_ok()) {
    state.SkipWithError(("tokenizer not found (set " + std::string(env_var) + ")").c_str());
    return;
  }
  const auto ids = tok.value()->encode(corpus().substr(0, 64 << 10), false);
  for (auto _ : state) {
    tessera::IncrementalDetokenizer d(*tok.value(), true);
    size_t bytes = 0;
    for (int32_t id : ids) bytes += d.push(id).size();
    bytes += d.finish().size();
    benchmark::DoNotOptimize(bytes);
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(state.iterations() * ids.size()),
                                                  benchmark::Counter::kIsRate);
}

void BM_EncodeByteLevelGpt2(benchmark::State& s) { encode_bench(s, "TESSERA_BYTE_LEVEL_TOKENIZER", "gpt2"); }
void BM_EncodeByteFallbackLlama2(benchmark::State& s) {
  encode_bench(s, "TESSERA_BYTE_FALLBACK_TOKENIZER", "llama2-spm");
}
void BM_StreamDecodeByteLevelGpt2(benchmark::State& s) {
  stream_decode_bench(s, "TESSERA_BYTE_LEVEL_TOKENIZER", "gpt2");
}
void BM_StreamDecodeByteFallbackLlama2(benchmark::State& s) {
  stream_decode_bench(s, "TESSERA_BYTE_FALLBACK_TOKENIZER", "llama2-spm");
}

BENCHMARK(BM_EncodeByteLevelGpt2)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_EncodeByteFallbackLlama2)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_StreamDecodeByteLevelGpt2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StreamDecodeByteFallbackLlama2)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
