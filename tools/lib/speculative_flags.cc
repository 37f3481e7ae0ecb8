#include "tools/lib/speculative_flags.h"

#include <algorithm>

#include "common/step_plan.h"

namespace tessera {

StatusOr<SpeculativeConfig> speculative_from_flags(const SpeculativeFlags& f) {
  const auto& methods = speculative_method_names();
  const auto method = std::find_if(methods.begin(), methods.end(), [&](const auto& m) { return f.method == m.first; });
  if (method == methods.end())
    return invalid_argument("--speculative: expected none, ngram or draft, got '" + f.method + "'");
  SpeculativeConfig c;
  c.method = method->second;
  c.num_tokens = f.num_tokens;
  c.draft_model = f.draft_model;
  c.draft_min_probability = f.draft_min_probability;
  if (c.method == SpeculativeConfig::Method::kDraft && f.draft_model.empty())
    return invalid_argument("--speculative draft needs --draft-model PATH (speculative.draft_model)");
  if (c.method != SpeculativeConfig::Method::kDraft && !f.draft_model.empty())
    return invalid_argument("--draft-model is given, but --speculative is " + f.method + " (use --speculative draft)");
  if (c.enabled() && (f.num_tokens < 1 || f.num_tokens > SeqStep::kMaxDraft))
    return invalid_argument("--speculative-tokens: expected 1 to " + std::to_string(SeqStep::kMaxDraft) + ", got " +
                            std::to_string(f.num_tokens));
  if (!(f.draft_min_probability >= 0.0 && f.draft_min_probability < 1.0))
    return invalid_argument("--draft-min-probability: expected a number in [0, 1), got " +
                            std::to_string(f.draft_min_probability));
  return c;
}

}  // namespace tessera
