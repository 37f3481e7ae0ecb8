#include "common/tokenizer/tokenization_cleanup.h"

#include <array>
#include <utility>

namespace tessera::tok {
namespace {

// transformers' list and order (PreTrainedTokenizerBase.clean_up_tokenization).
constexpr std::array<std::pair<std::string_view, std::string_view>, 10> kReplacements = {{
    {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
    {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
}};

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  size_t pos = 0;
  for (size_t hit = s.find(from); hit != std::string::npos; hit = s.find(from, pos)) {
    out.append(s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  if (pos == 0) return;
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

// Whether the text after its last space could still grow into replacement `first` or a
// later one. Every pattern starts with a space and only " ' " holds a second one, so a
// match can only cross the end of `s` if it starts at the last space.
bool tail_is_open(const std::string& s, size_t first) {
  const size_t space = s.rfind(' ');
  if (space == std::string::npos) return false;
  const std::string_view tail = std::string_view(s).substr(space);
  for (size_t k = first; k < kReplacements.size(); ++k) {
    const std::string_view pattern = kReplacements[k].first;
    if (tail.size() < pattern.size() && pattern.substr(0, tail.size()) == tail) return true;
  }
  return false;
}

// Whether clean(s + anything) == clean(s) + clean(anything). The replacements run one
// after another, and an earlier one can create a new match for a later one across the
// end (" ' v" becomes "'v" whose space-led tail " 'v" may become " 've"), so the tail is
// checked at every stage against the replacements still to run.
bool can_cut_after(std::string s) {
  for (size_t k = 0; k < kReplacements.size(); ++k) {
    if (tail_is_open(s, k)) return false;
    replace_all(s, kReplacements[k].first, kReplacements[k].second);
  }
  return true;
}

}  // namespace

std::string clean_up_tokenization(std::string_view text) {
  std::string s(text);
  for (const auto& [from, to] : kReplacements) replace_all(s, from, to);
  return s;
}

std::string CleanupStream::push(std::string_view piece) {
  held_.append(piece);
  // The longest prefix that can be cleaned on its own: all of it, or up to one of the
  // spaces near the end (the open tail is a few characters, so few cuts are tried).
  size_t cut = held_.size();
  while (cut > 0 && !can_cut_after(held_.substr(0, cut))) {
    const size_t space = held_.rfind(' ', cut - 1);
    cut = space == std::string::npos ? 0 : space;
  }
  if (cut == 0) return "";
  std::string out = clean_up_tokenization(std::string_view(held_).substr(0, cut));
  held_.erase(0, cut);
  return out;
}

std::string CleanupStream::finish() {
  std::string out = clean_up_tokenization(held_);
  held_.clear();
  return out;
}

}  // namespace tessera::tok
