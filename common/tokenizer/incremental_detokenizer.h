#pragma once
// Streaming detokenization: feed generated ids one at a time and get text deltas that
// are always complete UTF-8. The deltas concatenate exactly to the full decode
// (decode(generated) without a prompt; decode(prompt + generated) minus the prompt's
// own text with one), so a stream never differs from the final text.
//
// It decodes a window of recent ids. The window restarts after each emitted delta once
// start-of-text effects (Metaspace's first token, Strip of the leading space) are
// settled; text is held back while it could still change: an incomplete UTF-8
// sequence, a byte-fallback run a later byte could invalidate, a strippable tail. When the
// tokenizer cleans up tokenization spaces, the deltas then pass through a CleanupStream,
// which holds back a tail such as " n" that could become " n't".
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/tokenizer/tokenization_cleanup.h"
#include "common/tokenizer/tokenizer.h"

namespace tessera {

class IncrementalDetokenizer {
 public:
  // `tok` must outlive the detokenizer. `prompt_ids` give context for the first tokens
  // (e.g. the space before the first generated word); their own text is not emitted.
  IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens, std::vector<int32_t> prompt_ids = {});

  std::string push(int32_t id);  // may return "" while text is incomplete
  std::string finish();          // flushes whatever remains

 private:
  std::string take_delta(const std::string& text);
  std::string clean(std::string delta);
  std::string finish_window();  // finish() before the clean-up  // through cleanup_ when the tokenizer cleans up

  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t window_begin_ = 0;    // first id of the window being decoded
  bool continuation_ = false;  // text before the window is non-empty and final
  std::string delivered_;      // window text already delivered (prompt text), not to repeat
  std::optional<tok::CleanupStream> cleanup_;
};

}  // namespace tessera
