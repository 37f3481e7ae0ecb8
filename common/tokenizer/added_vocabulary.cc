#include "common/tokenizer/added_vocabulary.h"

#include "common/tokenizer/unicode_utils.h"

namespace tessera::tok {
namespace {

// Code point ending just before byte `end` (text valid UTF-8, end > 0).
char32_t code_point_before(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return next_code_point(text, start);
}

}  // namespace

void AddedTokenMatcher::add(const AddedToken& token, std::string pattern) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (unsigned char b : pattern) {
    int32_t next = child(node, b);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_[node].children.emplace_back(b, next);
      nodes_.emplace_back();
    }
    node = next;
  }
  if (nodes_[node].token < 0) {  // the first token with a given pattern wins
    nodes_[node].token = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(token);
  }
  first_byte_[static_cast<unsigned char>(pattern[0])] = true;
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char b) const {
  for (const auto& [byte, next] : nodes_[node].children) {
    if (byte == b) return next;
  }
  return -1;
}

std::pair<int32_t, size_t> AddedTokenMatcher::longest_at(std::string_view text, size_t i) const {
  int32_t node = 0, best = -1;
  size_t best_end = i;
  for (size_t k = i; k < text.size(); ++k) {
    node = child(node, static_cast<unsigned char>(text[k]));
    if (node < 0) break;
    if (nodes_[node].token >= 0) {
      best = nodes_[node].token;
      best_end = k + 1;
    }
  }
  return {best, best_end};
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  size_t start_offset = 0;
  size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    auto [index, match_end] = longest_at(text, i);
    if (index < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = tokens_[index];
    size_t start = i, stop = match_end;
    i = match_end;  // the matcher resumes after the raw match, kept or not
    if (tok.single_word) {
      const bool start_space = start == 0 || !is_word_char(code_point_before(text, start));
      size_t probe = stop;
      const bool stop_space = stop == text.size() || !is_word_char(next_code_point(text, probe));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t s = start;
      while (s > 0) {
        size_t cp_start = s - 1;
        while (cp_start > 0 && (static_cast<unsigned char>(text[cp_start]) & 0xC0) == 0x80) --cp_start;
        size_t probe = cp_start;
        if (!is_whitespace(next_code_point(text, probe))) break;
        s = cp_start;
      }
      start = std::max(s, start_offset);
    }
    if (tok.rstrip) {
      while (stop < text.size()) {
        size_t probe = stop;
        if (!is_whitespace(next_code_point(text, probe))) break;
        stop = probe;
      }
    }
    if (start_offset < start) out.push_back(Segment{start_offset, start, -1});
    out.push_back(Segment{start, stop, tok.id});
    start_offset = stop;
    // Never rescan whitespace that rstrip consumed (tokenizers would emit overlapping pieces).
    i = std::max(i, stop);
  }
  if (start_offset < text.size()) out.push_back(Segment{start_offset, text.size(), -1});
}

}  // namespace tessera::tok
