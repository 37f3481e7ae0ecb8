#include "coordinator/engine/structured/token_vocabulary.h"

#include <algorithm>
#include <deque>
#include <numeric>
#include <unordered_map>

#include "common/tokenizer/decoder.h"
#include "coordinator/engine/structured/codepoint_set.h"

namespace tessera::structured {

TokenVocabulary::TokenVocabulary(std::vector<std::string> bytes) : bytes_(std::move(bytes)) {
  std::vector<int32_t> order;
  for (size_t i = 0; i < bytes_.size(); ++i)
    if (!bytes_[i].empty()) order.push_back(static_cast<int32_t>(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[static_cast<size_t>(a)] != bytes_[static_cast<size_t>(b)] ? bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)] : a < b;
  });
  // Breadth first, so every node's children are contiguous: (node, [lo, hi) of order, depth).
  struct Pending {
    uint32_t node;
    size_t lo, hi, depth;
  };
  trie_.emplace_back();
  std::deque<Pending> queue = {{0, 0, order.size(), 0}};
  while (!queue.empty()) {
    const Pending p = queue.front();
    queue.pop_front();
    size_t i = p.lo;
    // The tokens below a node are order[lo, hi): those ending here come first (shorter sorts first).
    TrieNode& node = trie_[p.node];
    node.first_token = static_cast<uint32_t>(p.lo);
    node.subtree_end = static_cast<uint32_t>(p.hi);
    while (i < p.hi && bytes_[static_cast<size_t>(order[i])].size() == p.depth) ++i;
    node.num_tokens = static_cast<uint32_t>(i - p.lo);
    node.first_child = static_cast<uint32_t>(trie_.size());
    std::vector<Pending> children;
    while (i < p.hi) {
      const auto b = static_cast<uint8_t>(bytes_[static_cast<size_t>(order[i])][p.depth]);
      size_t j = i;
      while (j < p.hi && static_cast<uint8_t>(bytes_[static_cast<size_t>(order[j])][p.depth]) == b) ++j;
      TrieNode child;
      child.byte = b;
      trie_.push_back(child);
      children.push_back({static_cast<uint32_t>(trie_.size() - 1), i, j, p.depth + 1});
      i = j;
    }
    trie_[p.node].num_children = static_cast<uint32_t>(children.size());
    queue.insert(queue.end(), children.begin(), children.end());
  }
  trie_tokens_ = std::move(order);
  // The bytes below each node, children before parents (breadth first: children come later).
  std::vector<std::bitset<256>> below(trie_.size());
  for (size_t n = trie_.size(); n-- > 0;) {
    const TrieNode& node = trie_[n];
    for (uint32_t c = node.first_child; c < node.first_child + node.num_children; ++c) {
      below[n] |= below[c];
      below[n].set(trie_[c].byte);
    }
  }
  for (size_t n = 0; n < trie_.size(); ++n) {
    if (trie_[n].subtree_end - trie_[n].first_token < kSubtreeSetMinTokens) continue;
    trie_[n].subtree_set = static_cast<uint32_t>(subtree_bytes_.size());
    subtree_bytes_.push_back(below[n]);
  }
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::with_token_bytes(int32_t id, std::string bytes) const {
  std::vector<std::string> all = bytes_;
  if (id >= 0 && static_cast<size_t>(id) < all.size()) all[static_cast<size_t>(id)] = std::move(bytes);
  return std::make_shared<TokenVocabulary>(std::move(all));
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const Tokenizer& tokenizer) {
  const int64_t n = tokenizer.vocab_size();
  // GPT-2's byte-level alphabet: the printable bytes stand for themselves, the others for
  // U+0100 onwards in order.
  std::unordered_map<uint32_t, uint8_t> byte_of;
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    byte_of[printable ? b : next++] = static_cast<uint8_t>(b);
  }
  const int32_t space_id = tokenizer.token_to_id("\xC4\xA0");  // "Ġ"
  bool unstable = false;
  const bool byte_level =
      space_id >= 0 && tokenizer.decode_window({space_id}, 0, 1, false, true, false, &unstable) == " ";
  std::vector<std::string> bytes(static_cast<size_t>(n));
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.is_special(id)) continue;
    const std::string token = tokenizer.id_to_token(id);
    if (token.empty()) continue;
    std::string out;
    bool mapped = false;
    if (byte_level) {
      mapped = true;
      for (size_t i = 0; i < token.size() && mapped;) {
        // One UTF-8 character of the token string.
        const auto c = static_cast<unsigned char>(token[i]);
        const size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        uint32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
        for (size_t k = 1; k < len && i + k < token.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(token[i + k]) & 0x3F);
        auto it = byte_of.find(cp);
        if (it == byte_of.end()) mapped = false;
        else out += static_cast<char>(it->second);
        i += len;
      }
    } else {
      const int b = tok::parse_byte_token(token);
      if (b >= 0) {
        out = std::string(1, static_cast<char>(b));
        mapped = true;
      }
    }
    if (!mapped) out = tokenizer.decode_window({id}, 0, 1, false, true, false, &unstable);
    bytes[static_cast<size_t>(id)] = std::move(out);
  }
  return std::make_shared<TokenVocabulary>(std::move(bytes));
}

}  // namespace tessera::structured
