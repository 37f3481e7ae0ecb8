#include "common/speculative_config.h"

#include <string>

#include "common/step_plan.h"

namespace tessera {

Status validate_speculative_config(const SpeculativeConfig& config) {
  if (config.num_tokens < 1 || config.num_tokens > SeqStep::kMaxDraft)
    return invalid_argument("speculative.num_tokens must be in [1, " + std::to_string(SeqStep::kMaxDraft) + "], got " +
                            std::to_string(config.num_tokens));
  if (config.ngram_min < 1)
    return invalid_argument("speculative.ngram_min must be at least 1, got " + std::to_string(config.ngram_min));
  if (config.ngram_max < config.ngram_min)
    return invalid_argument("speculative.ngram_max (" + std::to_string(config.ngram_max) +
                            ") must be at least speculative.ngram_min (" + std::to_string(config.ngram_min) + ")");
  if (!(config.draft_min_probability >= 0.0 && config.draft_min_probability < 1.0))
    return invalid_argument("speculative.draft_min_probability must be in [0, 1), got " +
                            std::to_string(config.draft_min_probability));
  const bool draft = config.method == SpeculativeConfig::Method::kDraft;
  if (draft && config.draft_model.empty())
    return invalid_argument("speculative.draft_model: required with speculative.method draft (the draft model's folder or file)");
  if (!draft && !config.draft_model.empty())
    return invalid_argument("speculative.draft_model: given while speculative.method is not draft (set "
                            "speculative.method: draft, or drop the draft model)");
  return Status::ok();
}

const std::vector<std::pair<const char*, SpeculativeConfig::Method>>& speculative_method_names() {
  static const std::vector<std::pair<const char*, SpeculativeConfig::Method>> names = {
      {"none", SpeculativeConfig::Method::kNone}, {"ngram", SpeculativeConfig::Method::kNgram},
      {"draft", SpeculativeConfig::Method::kDraft}};
  return names;
}

}  // namespace tessera
