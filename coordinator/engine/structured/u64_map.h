#pragma once
// A hash map from 64-bit keys to 64-bit values for the matcher's memos (token_constraint.h):
// open addressing with linear probing in one flat array. A cold mask walks up to the whole
// vocabulary trie and looks a memo up at every node; std::unordered_map's per-entry nodes and
// prime-modulo buckets made those lookups the larger part of a walk.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tessera::structured {

class U64Map {
 public:
  static constexpr uint64_t kEmpty = UINT64_MAX;  // never a key

  // The value stored under `key`, or null. Valid until the next insert or clear.
  const uint64_t* find(uint64_t key) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = index(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }
  // Stores `value` under `key` (a new key: callers look up first).
  void insert(uint64_t key, uint64_t value) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    size_t i = index(key);
    while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
    slots_[i] = {key, value};
    ++size_;
  }
  void clear() {
    slots_.clear();
    slots_.shrink_to_fit();
    size_ = 0;
    mask_ = 0;
  }
  size_t size() const { return size_; }
  size_t bytes() const { return slots_.size() * sizeof(Slot); }

 private:
  struct Slot {
    uint64_t key = kEmpty;
    uint64_t value = 0;
  };
  size_t index(uint64_t key) const {
    // Fibonacci hashing: the keys are packed small integers, so mix them over the table.
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ULL) >> 20) & mask_;
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 1024 : 2 * old.size(), Slot{});
    mask_ = slots_.size() - 1;
    size_ = 0;
    for (const Slot& s : old)
      if (s.key != kEmpty) insert(s.key, s.value);
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace tessera::structured
