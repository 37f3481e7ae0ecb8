#pragma once
// Speculative decoding's settings (YAML `speculative.*`, docs/configuration.md): which
// proposer makes proposals (coordinator/engine/proposer.h) and how many a step may check.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tessera {

struct SpeculativeConfig {
  // kNgram: prompt lookup on the coordinator; kDraft: a draft model on the executors
  // (worker/draft_model.h), whose proposals come back with each step's result.
  enum class Method : uint8_t { kNone, kNgram, kDraft };
  Method method = Method::kNone;
  int num_tokens = 4;  // proposals per step, at most (k); 1..SeqStep::kMaxDraft
  int ngram_min = 1;   // the shortest suffix matched
  int ngram_max = 4;   // the longest suffix matched (tried first)
  // kDraft: the draft model (as model.path: a Hugging Face folder, a DeepSpeed checkpoint
  // JSON or a GGUF file), loaded in every worker beside the target.
  std::string draft_model;
  // kDraft: a sequence's proposals end at the first token the draft gives less than this
  // probability (llama.cpp's --draft-p-min); 0 = the draft always proposes what it is asked.
  // 0.1 (measured, bench/speculative_bench.sh): a random-weight draft then proposes nothing
  // (0.92x plain became 1.0x) and the kjv draft fixture gained 2-4%.
  double draft_min_probability = 0.1;
  bool enabled() const { return method != Method::kNone; }
};

// An error naming the key that is wrong (speculative.num_tokens, ngram_min, ngram_max,
// draft_model: required by method draft, refused with any other).
Status validate_speculative_config(const SpeculativeConfig& config);
// Each method's name, as `speculative.method` and --speculative spell it.
const std::vector<std::pair<const char*, SpeculativeConfig::Method>>& speculative_method_names();

}  // namespace tessera
