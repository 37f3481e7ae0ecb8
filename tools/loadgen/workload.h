#pragma once
// The requests of a load-generator run, made from a seed: synthetic prompt and output
// lengths (fixed, uniform or log-normal) with token-id or word prompts, or prompts from a
// JSONL file. Request i depends only on (options, seed, i).
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "tools/loadgen/random.h"

namespace tessera::loadgen {

// A length distribution: "128" (fixed), "uniform:MIN:MAX" (inclusive), or
// "lognormal:MEDIAN:SIGMA[:MAX]" (round(MEDIAN * exp(SIGMA * z)), z standard normal,
// clamped to [1, MAX]; MAX defaults to 10 x MEDIAN).
struct LengthDist {
  enum class Kind { kFixed, kUniform, kLogNormal };
  Kind kind = Kind::kFixed;
  int a = 0, b = 0;    // fixed: a; uniform: [a, b]; log-normal: median a, max b
  double sigma = 0;    // log-normal
  std::string text;    // as given
};
// InvalidArgument naming `flag` for a malformed or non-positive length.
StatusOr<LengthDist> parse_length(const std::string& flag, const std::string& text);

struct WorkloadOptions {
  LengthDist input_len, output_len;
  uint64_t seed = 0;
  bool text_prompts = false;       // words instead of token ids
  int token_min = 10, token_max = 500;  // range of random prompt token ids (inclusive)
};

struct DatasetEntry {
  std::vector<int32_t> prompt_ids;  // "prompt": [ids]
  std::string prompt_text;          // "prompt": "text"
  int output_len = 0;               // "output_len" or "max_tokens"; 0 = use --output-len
};
// One JSON object per line: {"prompt": "text" | [ids], "output_len" | "max_tokens": n};
// blank lines skipped. InvalidArgument naming file and line.
StatusOr<std::vector<DatasetEntry>> read_dataset(const std::string& path);

struct RequestSpec {
  int index = 0;
  std::vector<int32_t> prompt_ids;  // exact-length token prompt (when not empty)
  std::string prompt_text;          // else a text prompt
  int input_len = 0;                // prompt length asked for: tokens for ids, words for text
  int output_len = 0;               // max_tokens, with ignore_eos
};

class Workload {
 public:
  // `dataset` empty = synthetic. Dataset requests go through the file in order (cycling);
  // their output length comes from the file, else from options.output_len.
  Workload(WorkloadOptions options, std::vector<DatasetEntry> dataset = {});
  RequestSpec request(int index) const;
  const WorkloadOptions& options() const { return options_; }
  bool synthetic() const { return dataset_.empty(); }

 private:
  WorkloadOptions options_;
  std::vector<DatasetEntry> dataset_;
};

// Draws one value of `dist` with a random stream.
int draw_length(const LengthDist& dist, Random& rng);

}  // namespace tessera::loadgen
