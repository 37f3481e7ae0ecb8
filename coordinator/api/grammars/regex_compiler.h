#pragma once
// A regular expression (the subset JSON Schema "pattern"s and guided_regex use; the list is
// in docs/structured-output.md) compiled into a grammar expression that matches exactly the
// strings the pattern matches in full. Anything outside the subset — backreferences,
// lookaround, word boundaries, \p{...} classes, inline flags, anchors in the middle — is an
// InvalidArgument naming the construct and its offset, never approximated.
#include <string_view>

#include "common/status.h"
#include "coordinator/engine/structured/grammar.h"

namespace tessera::structured {

enum class RegexText {
  kRaw,         // the output text itself (guided_regex)
  kJsonString,  // the inside of a JSON string: '"', '\' and control characters escaped
};

StatusOr<GrammarBuilder::Node> compile_regex(GrammarBuilder& g, std::string_view pattern, RegexText text);

// Most repetitions one {m,n} may ask for.
inline constexpr int kMaxRegexRepeat = 1000;

}  // namespace tessera::structured
