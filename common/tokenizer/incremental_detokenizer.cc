#include "common/tokenizer/incremental_detokenizer.h"

namespace tessera {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens,
                                               std::vector<int32_t> prompt_ids)
    : tok_(tok), skip_special_(skip_special_tokens), ids_(std::move(prompt_ids)) {
  if (tok_.cleans_up_tokenization_spaces()) cleanup_.emplace();
  if (ids_.empty()) return;
  // Start the window at the last prompt position where the text so far is final; the
  // prompt text inside the window is remembered so it is not emitted again.
  const size_t n = ids_.size();
  for (size_t k = n; k + 8 >= n && k > 0; --k) {
    bool unstable = false;
    const std::string head = tok_.decode_window(ids_, 0, k, skip_special_, false, false, &unstable);
    if (unstable || head.empty()) continue;
    window_begin_ = k;
    continuation_ = true;
    delivered_ = tok_.decode_window(ids_, k, n, skip_special_, true, false, nullptr);
    return;
  }
  // No settled point (e.g. the prompt decodes to nothing): decode from the start.
  delivered_ = tok_.decode_window(ids_, 0, n, skip_special_, false, false, nullptr);
}

// The part of `text` after what was already delivered; when the window's text changed
// under the delivered part (a completed character), only the common prefix is skipped.
std::string IncrementalDetokenizer::take_delta(const std::string& text) {
  size_t common = 0;
  while (common < text.size() && common < delivered_.size() && text[common] == delivered_[common]) ++common;
  while (common > 0 && common < text.size() && (static_cast<unsigned char>(text[common]) & 0xC0) == 0x80) --common;
  return text.substr(common);
}

std::string IncrementalDetokenizer::clean(std::string delta) {
  return cleanup_ ? cleanup_->push(delta) : delta;
}

std::string IncrementalDetokenizer::push(int32_t id) {
  ids_.push_back(id);
  bool unstable = false;
  const std::string text =
      tok_.decode_window(ids_, window_begin_, ids_.size(), skip_special_, continuation_, false, &unstable);
  if (unstable) return "";
  std::string delta = take_delta(text);
  if (continuation_ || !text.empty()) {
    window_begin_ = ids_.size();
    continuation_ = true;
    delivered_.clear();
  } else {
    delivered_ = text;
  }
  return clean(std::move(delta));
}

std::string IncrementalDetokenizer::finish() {
  std::string delta = finish_window();
  if (!cleanup_) return delta;
  return cleanup_->push(delta) + cleanup_->finish();
}

std::string IncrementalDetokenizer::finish_window() {
  if (window_begin_ >= ids_.size()) return "";
  const std::string text =
      tok_.decode_window(ids_, window_begin_, ids_.size(), skip_special_, continuation_, true, nullptr);
  std::string delta = take_delta(text);
  window_begin_ = ids_.size();
  continuation_ = continuation_ || !text.empty();
  delivered_.clear();
  return delta;
}

}  // namespace tessera
