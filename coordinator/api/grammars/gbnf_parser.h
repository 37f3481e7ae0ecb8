#pragma once
// guided_grammar: a GBNF-like grammar text (llama.cpp's notation; the syntax is in
// docs/structured-output.md) parsed into the grammar IR. The rule named "root" is the whole
// output. Errors name the line and column (syntax), or the rule: defined twice, used but
// never defined, never used (unreachable from root); compile_grammar() adds the rest (a rule
// that accepts no string, left recursion).
#include <string_view>

#include "common/status.h"
#include "coordinator/engine/structured/grammar.h"

namespace tessera::structured {

// Adds the grammar's rules to `g`; returns the root rule.
StatusOr<int> parse_gbnf(GrammarBuilder& g, std::string_view text);

}  // namespace tessera::structured
