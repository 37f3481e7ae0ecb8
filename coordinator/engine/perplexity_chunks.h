#pragma once
// The scoring rule of tessera-perplexity (../shared/fixtures/README.md section 10): a document
// D = [BOS] + ids + [EOS] is cut into chunks D[s : s + context] for s = 0, context - 1,
// 2 (context - 1), ...: consecutive chunks share one token, so every token of D but the first
// is scored exactly once, each given the chunk before it (a fresh KV cache per chunk).
#include <cstdint>
#include <vector>

namespace tessera {

struct PerplexityChunk {
  int document = 0;               // index of the document
  std::vector<int32_t> tokens;    // at least 2; tokens 1.. are scored
};

// Appends the chunks of `document` (index `doc`) to *out; context >= 2. A document of one
// token has nothing to score and adds no chunk.
void append_perplexity_chunks(const std::vector<int32_t>& document, int doc, int64_t context,
                              std::vector<PerplexityChunk>* out);

}  // namespace tessera
