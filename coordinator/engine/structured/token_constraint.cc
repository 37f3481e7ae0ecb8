#include "coordinator/engine/structured/token_constraint.h"

#include <algorithm>
#include <bit>

namespace tessera::structured {

namespace {

constexpr uint32_t kDeadNode = UINT32_MAX;
constexpr size_t kMaxMemoEntries = size_t{32} << 20;

void sort_unique(std::vector<uint32_t>& v) {
  if (v.size() < 2) return;
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

}  // namespace

TokenIdSet TokenIdSet::take(std::vector<uint32_t>& bits) {
  TokenIdSet set;
  // Ids while they take fewer words than the bitset (counting stops as soon as they would not).
  size_t count = 0;
  for (uint32_t w : bits) {
    count += static_cast<size_t>(std::popcount(w));
    if (count >= bits.size()) break;
  }
  set.dense = count >= bits.size();
  if (set.dense) {
    set.data = bits;
    std::fill(bits.begin(), bits.end(), 0u);
    return set;
  }
  set.data.reserve(count);
  for (size_t w = 0; w < bits.size(); ++w) {
    for (uint32_t b = bits[w]; b != 0; b &= b - 1)
      set.data.push_back(static_cast<uint32_t>(w * 32 + static_cast<size_t>(std::countr_zero(b))));
    bits[w] = 0;
  }
  return set;
}

void TokenIdSet::or_into(std::vector<uint32_t>& bits) const {
  if (dense) {
    for (size_t w = 0; w < bits.size(); ++w) bits[w] |= data[w];
  } else {
    for (uint32_t id : data) bits[id >> 5] |= 1u << (id & 31);
  }
}

void TokenIdSet::write_to(size_t words, std::vector<uint32_t>* bits) const {
  if (dense) {
    bits->assign(data.begin(), data.end());
    return;
  }
  bits->assign(words, 0);
  for (uint32_t id : data) (*bits)[id >> 5] |= 1u << (id & 31);
}

size_t TokenConstraint::VectorHash::operator()(const std::vector<uint32_t>& v) const {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (uint32_t x : v) h = (h ^ x) * 0x100000001b3ULL;
  return static_cast<size_t>(h);
}

TokenConstraint::TokenConstraint(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {
  state_bytes_.resize(static_cast<size_t>(grammar_.num_states()));
  for (int32_t q = 0; q < grammar_.num_states(); ++q)
    for (const Grammar::ByteEdge& e : grammar_.state(q).bytes) state_bytes_[static_cast<size_t>(q)] |= grammar_.byte_set(e.set);
  nodes_.resize(kFirstNode, StackNode{-1, kEnd});
  size_t longest = 0;
  for (int64_t i = 0; i < vocabulary_->size(); ++i) longest = std::max(longest, vocabulary_->bytes(static_cast<int32_t>(i)).size());
  scratch_.resize(longest + 2);
  // Once, here: initial() then never takes the automaton's lock (a request's constraint is
  // made on the engine thread, which must not wait for another thread's walk).
  closure(grammar_.rule_start(grammar_.root()), kEnd, initial_.stacks);
  sort_unique(initial_.stacks);
}

uint32_t TokenConstraint::intern(int32_t state, uint32_t parent) const {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | parent;
  if (const uint64_t* id = node_ids_.find(key)) return static_cast<uint32_t>(*id);
  if (nodes_.size() >= kMaxStackNodes) {
    exhausted_ = true;
    return kDeadNode;
  }
  const auto id = static_cast<uint32_t>(nodes_.size());
  nodes_.push_back({state, parent});
  node_ids_.insert(key, id);
  return id;
}

void TokenConstraint::closure(int32_t state, uint32_t parent, std::vector<uint32_t>& out) const {
  // (state, parent) pairs still to expand, and those expanded: a nullable loop (x ::= y*,
  // y nullable) comes back to a pair it has seen.
  std::vector<std::pair<int32_t, uint32_t>> work = {{state, parent}}, seen;
  while (!work.empty()) {
    const auto [q, par] = work.back();
    work.pop_back();
    if (std::find(seen.begin(), seen.end(), std::make_pair(q, par)) != seen.end()) continue;
    seen.emplace_back(q, par);
    const Grammar::State& st = grammar_.state(q);
    if (!st.bytes.empty()) {
      const uint32_t id = intern(q, par);
      if (id != kDeadNode) out.push_back(id);
    }
    for (const Grammar::CallEdge& c : st.calls) {
      const uint32_t ret = intern(c.ret, par);
      if (ret != kDeadNode) work.emplace_back(grammar_.rule_start(c.rule), ret);
    }
    if (st.final) {
      if (par == kEnd) out.push_back(kAccept);
      else if (par == kFrameBottom) out.push_back(kPopped);
      else work.emplace_back(nodes_[par].state, nodes_[par].parent);
    }
  }
}

std::pair<uint32_t, uint32_t> TokenConstraint::step(uint32_t n, uint8_t b) const {
  const uint64_t key = (static_cast<uint64_t>(n) << 8) | b;
  if (const uint64_t* range = step_memo_.find(key))
    return {static_cast<uint32_t>(*range >> 32), static_cast<uint32_t>(*range)};
  if (memo_pool_.size() > kMaxMemoEntries) {
    step_memo_.clear();
    memo_pool_.clear();
  }
  std::vector<uint32_t> out;
  const StackNode node = nodes_[n];
  for (const Grammar::ByteEdge& e : grammar_.state(node.state).bytes)
    if (grammar_.byte_set(e.set).test(b)) closure(e.target, node.parent, out);
  sort_unique(out);
  const auto begin = static_cast<uint32_t>(memo_pool_.size());
  memo_pool_.insert(memo_pool_.end(), out.begin(), out.end());
  const std::pair<uint32_t, uint32_t> range{begin, static_cast<uint32_t>(memo_pool_.size())};
  step_memo_.insert(key, (static_cast<uint64_t>(range.first) << 32) | range.second);
  return range;
}

void TokenConstraint::advance_set(const std::vector<uint32_t>& from, uint8_t b, std::vector<uint32_t>& out) const {
  out.clear();
  for (uint32_t s : from) {
    if (s < kFirstNode) continue;
    const auto [lo, hi] = step(s, b);
    out.insert(out.end(), memo_pool_.begin() + lo, memo_pool_.begin() + hi);
  }
  if (from.size() > 1) sort_unique(out);
}

void TokenConstraint::mark_tokens(uint32_t t, std::vector<uint32_t>& bits) const {
  const TokenVocabulary::TrieNode& node = vocabulary_->trie()[t];
  const std::vector<int32_t>& tokens = vocabulary_->trie_tokens();
  for (uint32_t k = node.first_token; k < node.first_token + node.num_tokens; ++k) {
    const auto id = static_cast<uint32_t>(tokens[k]);
    bits[id >> 5] |= 1u << (id & 31);
  }
}

void TokenConstraint::mark_subtree(uint32_t t, std::vector<uint32_t>& bits) const {
  const TokenVocabulary::TrieNode& node = vocabulary_->trie()[t];
  const std::vector<int32_t>& tokens = vocabulary_->trie_tokens();
  for (uint32_t k = node.first_token; k < node.subtree_end; ++k) {
    const auto id = static_cast<uint32_t>(tokens[k]);
    bits[id >> 5] |= 1u << (id & 31);
  }
}

bool TokenConstraint::loops_over(uint32_t n, const ByteSet& bytes) const {
  const uint64_t* known = loop_set_ids_.find(n);
  if (known == nullptr) {
    ByteSet loops;
    const ByteSet& readable = state_bytes_[static_cast<size_t>(nodes_[n].state)];
    for (int b = 0; b < 256; ++b) {
      if (!readable.test(static_cast<size_t>(b))) continue;
      const auto [lo, hi] = step(n, static_cast<uint8_t>(b));
      if (hi - lo == 1 && memo_pool_[lo] == n) loops.set(static_cast<size_t>(b));
    }
    loop_set_ids_.insert(n, loop_sets_.size());
    loop_sets_.push_back(loops);
    cache_bytes_ += sizeof(ByteSet) + 32;
    known = loop_set_ids_.find(n);
  }
  return (bytes & ~loop_sets_[static_cast<size_t>(*known)]).none();
}

void TokenConstraint::walk(uint32_t t, const std::vector<uint32_t>& stacks, std::vector<uint32_t>& bits,
                           std::vector<uint32_t>* pop_points, size_t depth) const {
  const std::vector<TokenVocabulary::TrieNode>& trie = vocabulary_->trie();
  std::vector<uint32_t>& next = scratch_[depth];
  // A child whose byte no stack can read is dead with its whole subtree: a bit test instead
  // of a memo lookup per stack (most children of most nodes, in most grammar states).
  ByteSet readable;
  for (uint32_t s : stacks)
    if (s >= kFirstNode) readable |= state_bytes_[static_cast<size_t>(nodes_[s].state)];
  const uint32_t first = trie[t].first_child, last = first + trie[t].num_children;
  for (uint32_t c = first; c < last; ++c) {
    if (!readable.test(trie[c].byte)) continue;
    advance_set(stacks, trie[c].byte, next);
    bool popped = false;
    if (pop_points != nullptr) {
      auto at = std::find(next.begin(), next.end(), kPopped);
      if (at != next.end()) {
        next.erase(at);
        popped = true;
        pop_points->push_back(c);
      }
    }
    if (next.empty() && !popped) continue;
    visit(c, next, popped, bits, pop_points, depth + 1);
  }
}

void TokenConstraint::visit(uint32_t c, const std::vector<uint32_t>& stacks, bool popped, std::vector<uint32_t>& bits,
                            std::vector<uint32_t>* pop_points, size_t depth) const {
  // One stack that reads every byte below c back into itself: the whole subtree is allowed
  // (nothing below can pop, as a popping byte does not loop).
  const uint32_t below = vocabulary_->trie()[c].subtree_set;
  if (!popped && stacks.size() == 1 && stacks[0] >= kFirstNode && below != TokenVocabulary::kNoSubtreeSet &&
      loops_over(stacks[0], vocabulary_->subtree_bytes(below))) {
    mark_subtree(c, bits);
    return;
  }
  mark_tokens(c, bits);
  if (!stacks.empty() && stacks.back() >= kFirstNode) walk(c, stacks, bits, pop_points, depth);
}

const TokenConstraint::FrameMask& TokenConstraint::frame_mask(int32_t state) const {
  auto it = frame_cache_.find(state);
  if (it != frame_cache_.end()) return it->second;
  FrameMask fm;
  std::vector<uint32_t>& bits = walk_scratch_;
  bits.resize(vocabulary_->mask_words(), 0);
  const uint32_t start = intern(state, kFrameBottom);
  std::vector<uint32_t> pop_points;
  if (start != kDeadNode) walk(0, {start}, bits, &pop_points, 0);
  fm.tokens = TokenIdSet::take(bits);
  // What follows a pop point, by byte: the walk below it reads the same first byte with the
  // same stacks for every pop point, so pop_tokens() advances once per byte, not per child.
  const std::vector<TokenVocabulary::TrieNode>& trie = vocabulary_->trie();
  for (uint32_t pp : pop_points)
    for (uint32_t c = trie[pp].first_child; c < trie[pp].first_child + trie[pp].num_children; ++c)
      fm.pop_children.push_back(c);
  std::stable_sort(fm.pop_children.begin(), fm.pop_children.end(),
                   [&](uint32_t a, uint32_t b) { return trie[a].byte < trie[b].byte; });
  fm.pops = !pop_points.empty();
  cache_bytes_ += fm.tokens.bytes() + 4 * fm.pop_children.size() + 64;
  return frame_cache_.emplace(state, std::move(fm)).first->second;
}

void TokenConstraint::trim_caches() const {
  if (cache_bytes_ <= kMaxCacheBytes) return;
  frame_cache_.clear();
  pop_cache_.clear();
  pop_tokens_.clear();
  std::unique_lock<std::shared_mutex> write(masks_mu_);
  mask_cache_.clear();
  loop_set_ids_.clear();
  loop_sets_.clear();
  cache_bytes_ = 0;
}

MatchState TokenConstraint::initial() const { return initial_; }

MatchState TokenConstraint::advance_bytes(const MatchState& state, std::string_view bytes) const {
  std::lock_guard<std::timed_mutex> lock(automaton_mu_);
  return advance_bytes_locked(state, bytes);
}

MatchState TokenConstraint::advance_bytes_locked(const MatchState& state, std::string_view bytes) const {
  const auto started = std::chrono::steady_clock::now();
  MatchState cur = state, next;
  for (char c : bytes) {
    if (cur.stacks.empty()) break;
    advance_set(cur.stacks, static_cast<uint8_t>(c), next.stacks);
    std::swap(cur, next);
  }
  note_work_time(started);
  return cur;
}

MatchState TokenConstraint::advance_token(const MatchState& state, int32_t token) const {
  if (token < 0 || token >= vocabulary_->size() || vocabulary_->bytes(token).empty()) return MatchState{};
  return advance_bytes(state, vocabulary_->bytes(token));
}

std::optional<MatchState> TokenConstraint::advance_token_until(const MatchState& state, int32_t token,
                                                               std::chrono::steady_clock::time_point deadline) const {
  if (token < 0 || token >= vocabulary_->size() || vocabulary_->bytes(token).empty()) return MatchState{};
  std::unique_lock<std::timed_mutex> lock(automaton_mu_, std::defer_lock);
  if (!lock.try_lock_until(deadline)) return std::nullopt;
  return advance_bytes_locked(state, vocabulary_->bytes(token));
}

bool TokenConstraint::can_end(const MatchState& state) const {
  return std::find(state.stacks.begin(), state.stacks.end(), kAccept) != state.stacks.end();
}

bool TokenConstraint::must_end(const MatchState& state) const {
  return state.stacks.size() == 1 && state.stacks[0] == kAccept;
}

bool TokenConstraint::exhausted() const { return exhausted_.load(); }

bool TokenConstraint::find_mask(const MatchState& state, std::vector<uint32_t>* mask) const {
  std::shared_lock<std::shared_mutex> read(masks_mu_);
  auto cached = mask_cache_.find(state.stacks);
  if (cached == mask_cache_.end()) return false;
  cached->second.write_to(vocabulary_->mask_words(), mask);
  return true;
}

const TokenIdSet& TokenConstraint::pop_tokens(uint32_t n, const FrameMask& fm) const {
  auto known = pop_tokens_.find(n);
  if (known != pop_tokens_.end()) return known->second;
  const StackNode node = nodes_[n];
  auto pc = pop_cache_.find(node.parent);
  if (pc == pop_cache_.end()) {
    std::vector<uint32_t> after;
    closure(nodes_[node.parent].state, nodes_[node.parent].parent, after);
    sort_unique(after);
    pc = pop_cache_.emplace(node.parent, std::move(after)).first;
  }
  // (References into an unordered_map stay valid while it grows; walk() does not touch it.)
  const std::vector<uint32_t>& after = pc->second;
  TokenIdSet out;
  if (!after.empty() && after.back() >= kFirstNode) {
    std::vector<uint32_t>& bits = walk_scratch_;
    bits.resize(vocabulary_->mask_words(), 0);
    ByteSet readable;
    for (uint32_t a : after)
      if (a >= kFirstNode) readable |= state_bytes_[static_cast<size_t>(nodes_[a].state)];
    const std::vector<TokenVocabulary::TrieNode>& trie = vocabulary_->trie();
    std::vector<uint32_t>& next = pop_next_;
    for (size_t i = 0; i < fm.pop_children.size();) {
      const uint8_t b = trie[fm.pop_children[i]].byte;
      size_t j = i;
      while (j < fm.pop_children.size() && trie[fm.pop_children[j]].byte == b) ++j;
      if (readable.test(b)) {
        advance_set(after, b, next);
        if (!next.empty())
          for (size_t k = i; k < j; ++k) visit(fm.pop_children[k], next, false, bits, nullptr, 0);
      }
      i = j;
    }
    out = TokenIdSet::take(bits);
  }
  cache_bytes_ += out.bytes() + 64;
  return pop_tokens_.emplace(n, std::move(out)).first->second;
}

bool TokenConstraint::fill_mask_until(const MatchState& state, std::vector<uint32_t>* mask,
                                      std::chrono::steady_clock::time_point deadline) const {
  if (find_mask(state, mask)) return true;  // warm: never waits for a walk
  const bool timed = deadline != std::chrono::steady_clock::time_point::max();
  std::unique_lock<std::timed_mutex> lock(automaton_mu_, std::defer_lock);
  if (!timed) {
    lock.lock();
  } else if (!lock.try_lock_until(deadline)) {
    return false;  // another thread's walk of this grammar holds it past the deadline
  }
  // Another sequence of this grammar may have walked the same state while this one waited.
  if (find_mask(state, mask)) return true;
  const auto started = std::chrono::steady_clock::now();
  trim_caches();
  std::vector<uint32_t>& bits = mask_scratch_;
  bits.resize(vocabulary_->mask_words(), 0);
  for (uint32_t s : state.stacks) {
    if (s < kFirstNode) continue;
    // Between two stacks every cache is whole: stopping here loses only this call's OR.
    if (timed && std::chrono::steady_clock::now() > deadline) {
      std::fill(bits.begin(), bits.end(), 0u);  // the scratch is kept all zero between walks
      note_work_time(started);
      return false;
    }
    const StackNode node = nodes_[s];
    const FrameMask& fm = frame_mask(node.state);
    fm.tokens.or_into(bits);
    if (!fm.pops || node.parent == kEnd) continue;
    // Tokens that complete the top rule and go on in the caller: walked once per stack node
    // (a new match state is most often a new combination of stacks seen before).
    pop_tokens(s, fm).or_into(bits);
  }
  *mask = bits;
  TokenIdSet entry = TokenIdSet::take(bits);
  cache_bytes_ += entry.bytes() + 4 * state.stacks.size() + 64;
  std::unique_lock<std::shared_mutex> write(masks_mu_);
  mask_cache_.emplace(state.stacks, std::move(entry));
  note_work_time(started);
  return true;
}

}  // namespace tessera::structured
