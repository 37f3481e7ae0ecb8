#include "coordinator/engine/perplexity_chunks.h"

#include <algorithm>

namespace tessera {

void append_perplexity_chunks(const std::vector<int32_t>& document, int doc, int64_t context,
                              std::vector<PerplexityChunk>* out) {
  const int64_t n = static_cast<int64_t>(document.size());
  // A chunk starting at s scores tokens s+1 .. min(s + context, n) - 1; the next starts at
  // its last token.
  for (int64_t s = 0; s + 1 < n; s += context - 1) {
    const int64_t end = std::min(s + context, n);
    out->push_back(PerplexityChunk{doc, std::vector<int32_t>(document.begin() + s, document.begin() + end)});
  }
}

}  // namespace tessera
