#pragma once
// JSON numbers within bounds, as grammar expressions: the decimal-digit languages of integer
// ranges (the classic range-to-regex construction, one digit position at a time) and of
// numbers with a fraction between integer bounds. Open ends are capped at kMaxNumberDigits
// digits, so a random model cannot write digits for ever; every string produced is a valid
// JSON number inside the bounds (docs/structured-output.md, "Numbers").
#include <cstdint>
#include <optional>

#include "coordinator/engine/structured/grammar.h"

namespace tessera::structured {

inline constexpr int kMaxNumberDigits = 16;     // integer digits where a range is open
inline constexpr int kMaxFractionDigits = 15;   // digits after the point
inline constexpr int64_t kMaxExactBound = 1000000000000000000;  // |bound| handled exactly (1e18)

struct NumberBound {
  int64_t value = 0;
  bool exclusive = false;
};

// Integers in [lo, hi] ("-0" never); nullopt = open. The caller makes sure lo <= hi.
GrammarBuilder::Node integer_range(GrammarBuilder& g, std::optional<int64_t> lo, std::optional<int64_t> hi);
// Numbers (optional fraction, no exponent) between integer bounds; an empty language when
// nothing fits (the grammar compiler then reports that the schema accepts nothing).
GrammarBuilder::Node number_range(GrammarBuilder& g, std::optional<NumberBound> lo, std::optional<NumberBound> hi);
// Any JSON number (optional fraction and exponent, digits capped as above).
GrammarBuilder::Node any_number(GrammarBuilder& g);

}  // namespace tessera::structured
