#include "coordinator/engine/proposer.h"

#include <algorithm>


namespace tessera {

std::vector<int32_t> NgramProposer::propose(std::span<const int32_t> tokens, std::span<const int32_t>,
                                            int max_tokens) const {
  const auto len = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0) return {};
  for (int64_t n = std::min<int64_t>(ngram_max_, len - 1); n >= ngram_min_; --n) {
    const std::span<const int32_t> suffix = tokens.subspan(static_cast<size_t>(len - n));
    // Latest earlier occurrence first: start positions p with p + n < len (something follows).
    for (int64_t p = len - n - 1; p >= 0; --p) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + p)) continue;
      const int64_t from = p + n;
      const int64_t count = std::min<int64_t>(max_tokens, len - from);
      return {tokens.begin() + from, tokens.begin() + from + count};
    }
  }
  return {};
}

std::vector<int32_t> ExecutorProposer::propose(std::span<const int32_t>, std::span<const int32_t> from_executors,
                                               int max_tokens) const {
  const size_t n = std::min(from_executors.size(), static_cast<size_t>(std::max(max_tokens, 0)));
  return {from_executors.begin(), from_executors.begin() + static_cast<std::ptrdiff_t>(n)};
}

std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& config) {
  switch (config.method) {
    case SpeculativeConfig::Method::kNone: return nullptr;
    case SpeculativeConfig::Method::kNgram: return std::make_unique<NgramProposer>(config.ngram_min, config.ngram_max);
    case SpeculativeConfig::Method::kDraft: return std::make_unique<ExecutorProposer>();
  }
  return nullptr;
}

}  // namespace tessera
