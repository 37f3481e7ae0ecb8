#pragma once
// tokenizer.json `added_tokens`: strings matched in the input before the model sees it
// (leftmost-longest, as tokenizers' Aho-Corasick matcher), honouring single_word,
// lstrip and rstrip. Tokens with normalized=false are matched in the raw text, the
// others in the normalized text (their patterns normalized the same way).
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::tok {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// A run of text (token_id < 0) or one matched added token.
struct Segment {
  size_t start = 0, end = 0;  // byte range in the text that was split
  int32_t token_id = -1;
};

// Matches a fixed set of added tokens in text.
class AddedTokenMatcher {
 public:
  // `pattern` is what is searched for (the content, or its normalized form).
  void add(const AddedToken& token, std::string pattern);
  bool empty() const { return tokens_.empty(); }
  // Splits `text` into text runs and matched tokens covering it in order.
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t token = -1;  // index into tokens_ when a pattern ends here
  };
  int32_t child(int32_t node, unsigned char b) const;
  // Longest pattern starting at text[i]: (token index, end) or (-1, i).
  std::pair<int32_t, size_t> longest_at(std::string_view text, size_t i) const;

  std::vector<Node> nodes_{Node{}};
  std::vector<AddedToken> tokens_;
  std::array<bool, 256> first_byte_{};
};

}  // namespace tessera::tok
