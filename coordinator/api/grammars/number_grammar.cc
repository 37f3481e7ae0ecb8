#include "coordinator/api/grammars/number_grammar.h"

#include <algorithm>
#include <string>
#include <vector>

namespace tessera::structured {

using Node = GrammarBuilder::Node;

namespace {

Node digit(GrammarBuilder& g) { return g.byte_range('0', '9'); }

uint64_t max_open() {
  uint64_t v = 1;
  for (int i = 0; i < kMaxNumberDigits; ++i) v *= 10;
  return v - 1;
}

// Digit strings of one length from lo to hi (same length, lo <= hi).
Node same_length(GrammarBuilder& g, const std::string& lo, const std::string& hi) {
  if (lo.empty()) return g.empty();
  if (lo == hi) return g.literal(lo);
  const size_t rest = lo.size() - 1;
  if (lo[0] == hi[0]) return g.seq({g.literal(lo.substr(0, 1)), same_length(g, lo.substr(1), hi.substr(1))});
  const bool lo_rest_zero = lo.find_first_not_of('0', 1) == std::string::npos;
  const bool hi_rest_nine = hi.find_first_not_of('9', 1) == std::string::npos;
  std::vector<Node> alts;
  char from = lo[0], to = hi[0];
  if (!lo_rest_zero) {
    alts.push_back(g.seq({g.literal(lo.substr(0, 1)), same_length(g, lo.substr(1), std::string(rest, '9'))}));
    ++from;
  }
  if (!hi_rest_nine) --to;
  if (from <= to)
    alts.push_back(g.seq({g.byte_range(static_cast<uint8_t>(from), static_cast<uint8_t>(to)),
                          g.repeat(digit(g), static_cast<int>(rest), static_cast<int>(rest))}));
  if (!hi_rest_nine)
    alts.push_back(g.seq({g.literal(hi.substr(0, 1)), same_length(g, std::string(rest, '0'), hi.substr(1))}));
  return g.alt(std::move(alts));
}

// Non-negative integers in [a, b], no leading zeros.
Node natural_range(GrammarBuilder& g, uint64_t a, uint64_t b) {
  const std::string sa = std::to_string(a), sb = std::to_string(b);
  std::vector<Node> alts;
  for (size_t len = sa.size(); len <= sb.size(); ++len) {
    std::string lo = len == sa.size() ? sa : "1" + std::string(len - 1, '0');
    std::string hi = len == sb.size() ? sb : std::string(len, '9');
    alts.push_back(same_length(g, lo, hi));
  }
  return g.alt(std::move(alts));
}

Node fraction(GrammarBuilder& g) { return g.seq({g.literal("."), g.repeat(digit(g), 1, kMaxFractionDigits)}); }
// A fraction that is not zero: some digit after the point is 1-9.
Node nonzero_fraction(GrammarBuilder& g) {
  return g.seq({g.literal("."), g.repeat(digit(g), 0, kMaxFractionDigits - 1), g.byte_range('1', '9')});
}

// Numbers x >= 0 in [a, b] (b < 0: open), with a fraction allowed.
Node nonnegative_numbers(GrammarBuilder& g, uint64_t a, bool a_excl, std::optional<uint64_t> b, bool b_excl) {
  std::vector<Node> alts;
  if (b && *b == a) {
    if (!a_excl && !b_excl) alts.push_back(g.literal(std::to_string(a)));
    return g.alt(std::move(alts));
  }
  const uint64_t top = b ? *b : max_open();
  if (a + 1 <= top - (b ? 1 : 0) && a + 1 <= top) {
    const uint64_t inner_hi = b ? *b - 1 : top;
    if (a + 1 <= inner_hi) alts.push_back(g.seq({natural_range(g, a + 1, inner_hi), g.optional(fraction(g))}));
  }
  alts.push_back(g.seq({g.literal(std::to_string(a)), a_excl ? nonzero_fraction(g) : g.optional(fraction(g))}));
  if (b && !b_excl) alts.push_back(g.literal(std::to_string(*b)));
  return g.alt(std::move(alts));
}

}  // namespace

Node integer_range(GrammarBuilder& g, std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<Node> alts;
  if (!hi || *hi >= 0) {
    const uint64_t a = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
    const uint64_t b = hi ? std::min<uint64_t>(static_cast<uint64_t>(*hi), std::max(a, max_open())) : std::max(a, max_open());
    if (a <= b) alts.push_back(natural_range(g, a, b));
  }
  if (!lo || *lo < 0) {
    const uint64_t m_lo = hi && *hi < 0 ? static_cast<uint64_t>(-*hi) : 1;
    const uint64_t m_hi = lo ? static_cast<uint64_t>(-*lo) : std::max(m_lo, max_open());
    if (m_lo <= m_hi) alts.push_back(g.seq({g.literal("-"), natural_range(g, m_lo, m_hi)}));
  }
  return g.alt(std::move(alts));
}

Node number_range(GrammarBuilder& g, std::optional<NumberBound> lo, std::optional<NumberBound> hi) {
  std::vector<Node> alts;
  // x >= 0.
  if (!hi || hi->value > 0 || (hi->value == 0 && !hi->exclusive)) {
    uint64_t a = 0;
    bool a_excl = false;
    if (lo && lo->value >= 0) {
      a = static_cast<uint64_t>(lo->value);
      a_excl = lo->exclusive;
    }
    std::optional<uint64_t> b;
    if (hi) b = static_cast<uint64_t>(hi->value);
    if (!b || a <= *b) alts.push_back(nonnegative_numbers(g, a, a_excl, b, hi && hi->exclusive));
  }
  // x < 0, written "-" y with y > 0 (zero belongs to the side above).
  if (!lo || lo->value < 0) {
    uint64_t c = 0;
    bool c_excl = true;
    if (hi && hi->value < 0) {
      c = static_cast<uint64_t>(-hi->value);
      c_excl = hi->exclusive;
    }
    std::optional<uint64_t> d;
    if (lo) d = static_cast<uint64_t>(-lo->value);
    if (!d || c <= *d) alts.push_back(g.seq({g.literal("-"), nonnegative_numbers(g, c, c_excl, d, lo && lo->exclusive)}));
  }
  return g.alt(std::move(alts));
}

Node any_number(GrammarBuilder& g) {
  Node integer = g.alt({g.literal("0"), g.seq({g.byte_range('1', '9'), g.repeat(digit(g), 0, kMaxNumberDigits - 1)})});
  Node exponent = g.seq({g.alt({g.literal("e"), g.literal("E")}), g.optional(g.alt({g.literal("+"), g.literal("-")})),
                         g.repeat(digit(g), 1, 2)});
  return g.seq({g.optional(g.literal("-")), integer, g.optional(fraction(g)), g.optional(exponent)});
}

}  // namespace tessera::structured
