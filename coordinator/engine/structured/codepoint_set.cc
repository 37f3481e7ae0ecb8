#include "coordinator/engine/structured/codepoint_set.h"

#include <algorithm>

namespace tessera::structured {

using Node = GrammarBuilder::Node;

void CodepointSet::add(uint32_t lo, uint32_t hi) {
  hi = std::min(hi, kMaxCodepoint);
  if (lo > hi) return;
  ranges_.emplace_back(lo, hi);
  normalize();
}

void CodepointSet::add(const CodepointSet& other) {
  ranges_.insert(ranges_.end(), other.ranges_.begin(), other.ranges_.end());
  normalize();
}

void CodepointSet::normalize() {
  std::sort(ranges_.begin(), ranges_.end());
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (const auto& r : ranges_) {
    if (!out.empty() && r.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, r.second);
    } else {
      out.push_back(r);
    }
  }
  ranges_ = std::move(out);
}

CodepointSet CodepointSet::complement() const {
  CodepointSet out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : ranges_) {
    if (lo > next) out.ranges_.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodepoint) out.ranges_.emplace_back(next, kMaxCodepoint);
  return out.minus(CodepointSet::of(0xD800, 0xDFFF));
}

CodepointSet CodepointSet::minus(const CodepointSet& other) const {
  CodepointSet out;
  for (auto [lo, hi] : ranges_) {
    uint32_t at = lo;
    for (const auto& [olo, ohi] : other.ranges_) {
      if (ohi < at || olo > hi) continue;
      if (olo > at) out.ranges_.emplace_back(at, olo - 1);
      at = ohi + 1;
      if (ohi >= hi) break;
    }
    if (at <= hi && at >= lo) out.ranges_.emplace_back(at, hi);
  }
  out.normalize();
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

// Splits [lo, hi] (one UTF-8 length) until every byte position of the encodings spans a
// contiguous range, then emits the byte-range sequence (the construction RE2 uses).
void utf8_sequences(GrammarBuilder& g, uint32_t lo, uint32_t hi, std::vector<Node>& out) {
  std::string a, b;
  append_utf8(a, lo);
  append_utf8(b, hi);
  const size_t n = a.size();
  for (size_t i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(g, lo, lo | m, out);
        utf8_sequences(g, (lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(g, lo, (hi & ~m) - 1, out);
        utf8_sequences(g, hi & ~m, hi, out);
        return;
      }
    }
  }
  std::vector<Node> items;
  for (size_t k = 0; k < n; ++k)
    items.push_back(g.byte_range(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k])));
  out.push_back(g.seq(std::move(items)));
}

void utf8_range(GrammarBuilder& g, uint32_t lo, uint32_t hi, std::vector<Node>& out) {
  static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodepoint};
  for (uint32_t end : kLengthEnds) {
    if (lo > hi) return;
    if (lo > end) continue;
    const uint32_t top = std::min(hi, end);
    utf8_sequences(g, lo, top, out);
    lo = top + 1;
  }
}

}  // namespace

Node utf8_class(GrammarBuilder& g, const CodepointSet& set) {
  const CodepointSet clean = set.minus(CodepointSet::of(0xD800, 0xDFFF));
  std::vector<Node> alts;
  for (const auto& [lo, hi] : clean.ranges()) utf8_range(g, lo, hi, alts);
  return g.alt(std::move(alts));
}

std::string json_escape(const std::string& text) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

Node json_string_class(GrammarBuilder& g, const CodepointSet& set) {
  CodepointSet special;
  special.add(0, 0x1F);
  special.add('"', '"');
  special.add('\\', '\\');
  std::vector<Node> alts = {utf8_class(g, set.minus(special))};
  for (const auto& [lo, hi] : set.ranges()) {
    for (uint32_t cp = lo; cp <= std::min<uint32_t>(hi, '\\'); ++cp) {
      if (cp < 0x20 || cp == '"' || cp == '\\') alts.push_back(g.literal(json_escape(std::string(1, static_cast<char>(cp)))));
    }
  }
  return g.alt(std::move(alts));
}

}  // namespace tessera::structured
