#include "coordinator/structured/token_constraint.h"

#include <algorithm>

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

size_t TokenConstraint::VectorHash::operator()(const std::vector<uint32_t>& v) const {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (uint32_t x : v) h = (h ^ x) * 0x100000001b3ULL;
  return static_cast<size_t>(h);
}

TokenConstraint::TokenConstraint(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {
  nodes_.resize(kFirstNode, StackNode{-1, kEnd});
  size_t longest = 0;
  for (int64_t i = 0; i < vocabulary_->size(); ++i) longest = std::max(longest, vocabulary_->bytes(static_cast<int32_t>(i)).size());
  scratch_.resize(longest + 2);
}

uint32_t TokenConstraint::intern(int32_t state, uint32_t parent) const {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | parent;
  auto it = node_ids_.find(key);
  if (it != node_ids_.end()) return it->second;
  if (nodes_.size() >= kMaxStackNodes) {
    exhausted_ = true;
    return kDeadNode;
  }
  const auto id = static_cast<uint32_t>(nodes_.size());
  nodes_.push_back({state, parent});
  node_ids_.emplace(key, id);
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
  auto it = step_memo_.find(key);
  if (it != step_memo_.end()) return it->second;
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
  step_memo_.emplace(key, range);
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

void TokenConstraint::walk(uint32_t t, const std::vector<uint32_t>& stacks, std::vector<uint32_t>& bits,
                           std::vector<uint32_t>* pop_points, size_t depth) const {
  const std::vector<TokenVocabulary::TrieNode>& trie = vocabulary_->trie();
  std::vector<uint32_t>& next = scratch_[depth];
  const uint32_t first = trie[t].first_child, last = first + trie[t].num_children;
  for (uint32_t c = first; c < last; ++c) {
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
    mark_tokens(c, bits);
    if (!next.empty() && next.back() >= kFirstNode) walk(c, next, bits, pop_points, depth + 1);
  }
}

const TokenConstraint::FrameMask& TokenConstraint::frame_mask(int32_t state) const {
  auto it = frame_cache_.find(state);
  if (it != frame_cache_.end()) return it->second;
  FrameMask fm;
  fm.bits.assign(vocabulary_->mask_words(), 0);
  const uint32_t start = intern(state, kFrameBottom);
  if (start != kDeadNode) walk(0, {start}, fm.bits, &fm.pop_points, 0);
  cache_bytes_ += 4 * (fm.bits.size() + fm.pop_points.size()) + 64;
  return frame_cache_.emplace(state, std::move(fm)).first->second;
}

void TokenConstraint::trim_caches() const {
  if (cache_bytes_ <= kMaxCacheBytes) return;
  frame_cache_.clear();
  mask_cache_.clear();
  pop_cache_.clear();
  cache_bytes_ = 0;
}

MatchState TokenConstraint::initial() const {
  std::lock_guard<std::mutex> lock(mu_);
  MatchState s;
  closure(grammar_.rule_start(grammar_.root()), kEnd, s.stacks);
  sort_unique(s.stacks);
  return s;
}

MatchState TokenConstraint::advance_bytes(const MatchState& state, std::string_view bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  MatchState cur = state, next;
  for (char c : bytes) {
    if (cur.stacks.empty()) break;
    advance_set(cur.stacks, static_cast<uint8_t>(c), next.stacks);
    std::swap(cur, next);
  }
  return cur;
}

MatchState TokenConstraint::advance_token(const MatchState& state, int32_t token) const {
  if (token < 0 || token >= vocabulary_->size() || vocabulary_->bytes(token).empty()) return MatchState{};
  return advance_bytes(state, vocabulary_->bytes(token));
}

bool TokenConstraint::can_end(const MatchState& state) const {
  return std::find(state.stacks.begin(), state.stacks.end(), kAccept) != state.stacks.end();
}

bool TokenConstraint::must_end(const MatchState& state) const {
  return state.stacks.size() == 1 && state.stacks[0] == kAccept;
}

bool TokenConstraint::exhausted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return exhausted_;
}

void TokenConstraint::fill_mask(const MatchState& state, std::vector<uint32_t>* mask) const {
  std::lock_guard<std::mutex> lock(mu_);
  trim_caches();
  auto cached = mask_cache_.find(state.stacks);
  if (cached != mask_cache_.end()) {
    *mask = cached->second;
    return;
  }
  std::vector<uint32_t> bits(vocabulary_->mask_words(), 0);
  for (uint32_t s : state.stacks) {
    if (s < kFirstNode) continue;
    const StackNode node = nodes_[s];
    const FrameMask& fm = frame_mask(node.state);
    for (size_t w = 0; w < bits.size(); ++w) bits[w] |= fm.bits[w];
    if (fm.pop_points.empty() || node.parent == kEnd) continue;
    // Tokens that complete the top rule and go on: continue them in the caller.
    auto pc = pop_cache_.find(node.parent);
    if (pc == pop_cache_.end()) {
      std::vector<uint32_t> after;
      closure(nodes_[node.parent].state, nodes_[node.parent].parent, after);
      sort_unique(after);
      pc = pop_cache_.emplace(node.parent, std::move(after)).first;
    }
    if (pc->second.empty() || pc->second.back() < kFirstNode) continue;
    const std::vector<uint32_t> after = pc->second;  // walk() may rehash pop_cache_? no, but keep a copy
    for (uint32_t pp : fm.pop_points) walk(pp, after, bits, nullptr, 0);
  }
  cache_bytes_ += 4 * bits.size() + 4 * state.stacks.size() + 64;
  mask_cache_.emplace(state.stacks, bits);
  *mask = std::move(bits);
}

}  // namespace tessera::structured
