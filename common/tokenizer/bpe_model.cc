#include "common/tokenizer/bpe_model.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "common/tokenizer/unicode_utils.h"

namespace tessera::tok {

StatusOr<std::unique_ptr<BpeModel>> BpeModel::from_json(const Json& j, const std::string& where) {
  if (!j.is_object()) return invalid_argument(where + ": expected an object");
  std::unique_ptr<BpeModel> m(new BpeModel());
  auto vocab_it = j.find("vocab");
  if (vocab_it == j.end() || !vocab_it->is_object()) {
    return invalid_argument(where + ".vocab: expected an object mapping token -> id");
  }
  int32_t max_id = -1;
  std::string max_token;
  for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX) {
      return invalid_argument(where + ".vocab['" + it.key() + "']: expected a non-negative integer id");
    }
    const auto id = static_cast<int32_t>(it.value().get<int64_t>());
    m->vocab_[it.key()] = id;
    if (id > max_id) {
      max_id = id;
      max_token = it.key();
    }
  }
  // The id tables are sized by the largest id, so one absurd id would allocate gigabytes.
  if (max_id >= 0 && static_cast<uint64_t>(max_id) >= max_token_id_bound(m->vocab_.size())) {
    return invalid_argument(where + ".vocab['" + max_token + "']: id " + std::to_string(max_id) +
                            " is far past the vocabulary's " + std::to_string(m->vocab_.size()) +
                            " tokens (ids must stay below " + std::to_string(max_token_id_bound(m->vocab_.size())) +
                            ", twice the token count plus 65536)");
  }
  m->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  m->has_token_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : m->vocab_) {
    m->id_to_token_[id] = token;
    m->has_token_[id] = true;
  }

  TESSERA_ASSIGN_OR_RETURN(m->byte_fallback_, get_bool_or(j, "byte_fallback", where, false));
  TESSERA_ASSIGN_OR_RETURN(m->fuse_unk_, get_bool_or(j, "fuse_unk", where, false));
  TESSERA_ASSIGN_OR_RETURN(m->ignore_merges_, get_bool_or(j, "ignore_merges", where, false));
  TESSERA_ASSIGN_OR_RETURN(m->continuing_subword_prefix_, get_string_or(j, "continuing_subword_prefix", where, ""));
  TESSERA_ASSIGN_OR_RETURN(m->end_of_word_suffix_, get_string_or(j, "end_of_word_suffix", where, ""));
  if (auto d = j.find("dropout"); d != j.end() && !d->is_null()) {
    if (!d->is_number()) return invalid_argument(where + ".dropout: expected a number or null");
    if (d->get<double>() > 0.0) {
      return unimplemented(where + ".dropout: BPE dropout (random merges) is not supported for inference");
    }
  }
  m->split_at_word_marker_ = m->continuing_subword_prefix_.empty() && m->end_of_word_suffix_.empty() &&
                             m->token_to_id(kWordMarker) >= 0 && !m->any_token_has_an_inner_word_marker();
  TESSERA_ASSIGN_OR_RETURN(std::string unk, get_string_or(j, "unk_token", where, ""));
  if (!unk.empty()) {
    m->unk_id_ = m->token_to_id(unk);
    if (m->unk_id_ < 0) return invalid_argument(where + ".unk_token: '" + unk + "' is not in " + where + ".vocab");
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    m->byte_ids_[b] = m->token_to_id(name);
  }

  TESSERA_ASSIGN_OR_RETURN(const Json* merges, get_array(j, "merges", where));
  m->merges_.reserve(merges->size() * 2);
  const size_t prefix_len = m->continuing_subword_prefix_.size();
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& e = (*merges)[i];
    const std::string path = where + ".merges[" + std::to_string(i) + "]";
    std::string a, b;
    if (e.is_string()) {
      // Older layout "left right": exactly one space.
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return invalid_argument(path + ": expected \"left right\", got \"" + s + "\"");
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return invalid_argument(path + ": expected \"left right\" or [\"left\", \"right\"]");
    }
    const int32_t a_id = m->token_to_id(a);
    if (a_id < 0) return invalid_argument(path + ": token '" + a + "' is not in " + where + ".vocab");
    const int32_t b_id = m->token_to_id(b);
    if (b_id < 0) return invalid_argument(path + ": token '" + b + "' is not in " + where + ".vocab");
    if (b.size() < prefix_len) return invalid_argument(path + ": token '" + b + "' lacks the continuing_subword_prefix");
    const std::string merged = a + b.substr(prefix_len);
    const int32_t new_id = m->token_to_id(merged);
    if (new_id < 0) {
      return invalid_argument(path + ": merged token '" + merged + "' is not in " + where + ".vocab");
    }
    m->merges_[pair_key(a_id, b_id)] = Merge{static_cast<int32_t>(i), new_id};
  }
  for (auto& shard : m->cache_) shard.words.reserve(kCacheEntriesPerShard);
  return m;
}

int32_t BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_token_[id]) return nullptr;
  return &id_to_token_[id];
}

bool BpeModel::any_token_has_an_inner_word_marker() const {
  const std::string_view marker = kWordMarker;
  for (const auto& [token, id] : vocab_) {
    size_t after_run = 0;
    while (std::string_view(token).substr(after_run, marker.size()) == marker) after_run += marker.size();
    if (token.find(marker, after_run) != std::string::npos) return true;
  }
  return false;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (!split_at_word_marker_) return tokenize_piece(word, out);
  // Character by character as merge_word reads them, so that a piece starts where one of its
  // characters did.
  const std::string_view marker = kWordMarker;
  size_t start = 0;
  bool after_marker = true;
  for (size_t i = 0; i < word.size();) {
    const size_t len = std::min(utf8_sequence_length(static_cast<unsigned char>(word[i])), word.size() - i);
    const bool is_marker = word.substr(i, len) == marker;
    if (is_marker && !after_marker && i > start) {
      tokenize_piece(word.substr(start, i - start), out);
      start = i;
    }
    after_marker = is_marker;
    i += len;
  }
  tokenize_piece(word.substr(start), out);
}

void BpeModel::tokenize_piece(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (int32_t id = token_to_id(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  const size_t hash = StringHash{}(word);
  CacheShard& shard = cache_[hash % kCacheShards];
  if (cacheable) {
    std::shared_lock lock(shard.mu);
    auto it = shard.words.find(word);
    if (it != shard.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::unique_lock lock(shard.mu);
    if (shard.words.size() < kCacheEntriesPerShard) {
      shard.words.emplace(std::string(word), std::vector<int32_t>(out.begin() + start, out.end()));
    }
  }
}

void BpeModel::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t len;  // bytes of the word covered; 0 once merged into its left neighbour
  };
  std::vector<Symbol> symbols;
  symbols.reserve(w.size());
  auto add = [&symbols](int32_t id, uint32_t len) {
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back(Symbol{id, n - 1, -1, len});
  };

  // Pending unknown run: (id, byte length), emitted late exactly as tokenizers does.
  int32_t unk_pending_id = -1;
  uint32_t unk_pending_len = 0;
  std::string scratch;
  size_t i = 0;
  while (i < w.size()) {
    const size_t char_len = std::min(utf8_sequence_length(static_cast<unsigned char>(w[i])), w.size() - i);
    const bool is_first = i == 0;
    const bool is_last = i + char_len == w.size();
    std::string_view s = w.substr(i, char_len);
    if ((!is_first && !continuing_subword_prefix_.empty()) || (is_last && !end_of_word_suffix_.empty())) {
      scratch.clear();
      if (!is_first) scratch += continuing_subword_prefix_;
      scratch += s;
      if (is_last) scratch += end_of_word_suffix_;
      s = scratch;
    }
    i += char_len;
    if (const int32_t id = token_to_id(s); id >= 0) {
      if (unk_pending_id >= 0) {
        add(unk_pending_id, unk_pending_len);
        unk_pending_id = -1;
      }
      add(id, static_cast<uint32_t>(char_len));
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : s) all &= byte_ids_[b] >= 0;
      if (all) {
        for (unsigned char b : s) add(byte_ids_[b], 1);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (unk_pending_id >= 0 && fuse_unk_) {
        unk_pending_len += static_cast<uint32_t>(char_len);
      } else {
        if (unk_pending_id >= 0) add(unk_pending_id, unk_pending_len);
        unk_pending_id = unk_id_;
        unk_pending_len = static_cast<uint32_t>(char_len);
      }
    }
  }
  if (unk_pending_id >= 0) add(unk_pending_id, unk_pending_len);

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    // Lowest rank first, then leftmost.
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  auto find_merge = [this](int32_t a, int32_t b) -> const Merge* {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::vector<Candidate> heap_storage;
  heap_storage.reserve(symbols.size());
  std::priority_queue<Candidate> queue(std::less<Candidate>(), std::move(heap_storage));
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const Merge* m = find_merge(symbols[k].id, symbols[k + 1].id)) {
      queue.push(Candidate{m->rank, static_cast<int32_t>(k), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.len == 0 || left.next < 0) continue;
    const int32_t right_pos = left.next;
    const Symbol right = symbols[right_pos];
    // Skip stale entries: the pair changed since this candidate was queued.
    const Merge* current = find_merge(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;
    left.id = top.new_id;
    left.len += right.len;
    left.next = right.next;
    symbols[right_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* m = find_merge(symbols[left.prev].id, left.id)) {
        queue.push(Candidate{m->rank, left.prev, m->new_id});
      }
    }
    if (left.next >= 0) {
      if (const Merge* m = find_merge(left.id, symbols[left.next].id)) {
        queue.push(Candidate{m->rank, top.pos, m->new_id});
      }
    }
  }
  for (const auto& s : symbols) {
    if (s.len != 0) out.push_back(s.id);
  }
}

}  // namespace tessera::tok
