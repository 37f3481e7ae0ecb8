#pragma once
// The model's vocabulary as the matcher sees it: the exact bytes each token adds to the
// output text, and a trie over those byte strings, so that a token mask is one walk of the
// trie (shared prefixes are matched once, and a dead prefix drops its whole subtree).
// Built once per tokenizer (ApiContext); special tokens have no bytes — the grammar never
// allows them, the end-of-sequence tokens are allowed separately where the grammar may end.
#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace tessera::structured {

class TokenVocabulary {
 public:
  struct TrieNode {
    uint32_t first_child = 0;  // children are nodes [first_child, first_child + num_children)
    uint32_t num_children = 0;
    uint32_t first_token = 0;  // tokens whose bytes end here: trie_tokens()[first_token, + num_tokens)
    uint32_t num_tokens = 0;
    // trie_tokens() is in byte order, so every token below this node (its own included) is
    // in [first_token, subtree_end): a matcher can allow a whole subtree at once.
    uint32_t subtree_end = 0;
    // Index into subtree_bytes() of the bytes read below this node (after `byte`), kept for
    // nodes with at least kSubtreeSetMinTokens tokens below them; kNoSubtreeSet otherwise.
    uint32_t subtree_set = UINT32_MAX;
    uint8_t byte = 0;          // the byte that leads here from the parent
  };
  static constexpr uint32_t kNoSubtreeSet = UINT32_MAX;
  // Small subtrees are cheaper to walk than to test (and their sets would cost memory: 32
  // bytes each; with this bound the Llama 3 vocabulary keeps them for a few percent of nodes).
  static constexpr uint32_t kSubtreeSetMinTokens = 16;

  // Token i has bytes[i] ("" = never allowed by a grammar).
  explicit TokenVocabulary(std::vector<std::string> bytes);
  // The bytes each id of `tokenizer` decodes to in the middle of an output (byte-level BPE
  // byte mapping, SentencePiece "▁" and <0xNN> byte pieces); special tokens get none.
  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const Tokenizer& tokenizer);
  // This vocabulary with token `id` (a special token, which has no bytes here) given
  // `bytes`, so a grammar can ask for it: a forced tool call starts with Mistral's
  // [TOOL_CALLS], a special token whose text (kept in the output) is those bytes. The
  // ordinary tokens that spell the same bytes stay allowed too: the text is the same.
  std::shared_ptr<const TokenVocabulary> with_token_bytes(int32_t id, std::string bytes) const;

  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  const std::vector<TrieNode>& trie() const { return trie_; }  // trie()[0] is the root
  const std::vector<int32_t>& trie_tokens() const { return trie_tokens_; }
  const std::bitset<256>& subtree_bytes(uint32_t set) const { return subtree_bytes_[set]; }
  // Words of a token bitset over this vocabulary (32 ids per word).
  size_t mask_words() const { return (bytes_.size() + 31) / 32; }

 private:
  std::vector<std::string> bytes_;
  std::vector<TrieNode> trie_;
  std::vector<int32_t> trie_tokens_;
  std::vector<std::bitset<256>> subtree_bytes_;
};

}  // namespace tessera::structured
