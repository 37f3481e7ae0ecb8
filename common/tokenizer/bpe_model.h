#pragma once
// tokenizer.json `model` of type BPE: a vocabulary, a merge-rank table and the merge
// loop (a priority queue over adjacent pairs, O(n log n) per word), with byte_fallback,
// unk fusing, ignore_merges, continuing_subword_prefix / end_of_word_suffix, a word cache
// shared by all threads, and words split at SentencePiece's word marker where the
// vocabulary proves that changes nothing.
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/json_fields.h"

namespace tessera::tok {

// Token ids index tables sized by the largest id. Real vocabularies number their tokens
// 0..n-1 with few holes; an id at or past this bound (for `tokens` entries) is a corrupt
// file, refused rather than allocated.
inline uint64_t max_token_id_bound(uint64_t tokens) { return 2 * tokens + 65536; }

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using VocabMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // `where` is the field path for errors ("model").
  static StatusOr<std::unique_ptr<BpeModel>> from_json(const Json& j, const std::string& where);

  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  int32_t token_to_id(std::string_view token) const;  // -1 when absent
  // nullptr when `id` has no token.
  const std::string* id_to_token(int32_t id) const;
  size_t vocab_size() const { return vocab_.size(); }
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  bool byte_fallback() const { return byte_fallback_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  // One piece of a word: from the word cache, else merged (and cached when short).
  void tokenize_piece(std::string_view word, std::vector<int32_t>& out) const;
  // Whether some token holds the word marker after a character that is not one.
  bool any_token_has_an_inner_word_marker() const;

  // SentencePiece's word marker "▁" (U+2581), which a Metaspace pre-tokenizer or normalizer
  // puts where the text had spaces.
  static constexpr const char* kWordMarker = "\xE2\x96\x81";

  VocabMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_token_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};  // id of "<0xXX>", -1 when absent
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  // A word is merged piece by piece, split before each word marker that follows another
  // character, when no token has a marker after another character: no merge can then join
  // across such a point, so the pieces merge to what the whole would, and short pieces come
  // from the word cache. (A normalizer that turns spaces into markers with no pre-tokenizer,
  // Llama 2's layout, hands the whole text over as one word.)
  bool split_at_word_marker_ = false;

  // Word cache: shards keep threads of a server from serialising on one lock.
  static constexpr size_t kCacheShards = 16;
  static constexpr size_t kCacheEntriesPerShard = 8192;
  static constexpr size_t kMaxCachedWordBytes = 256;
  struct CacheShard {
    mutable std::shared_mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
  };
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace tessera::tok
