#pragma once
// The template parser: tokens -> statements and expressions (ast.h), with Jinja2's grammar
// and operator precedence. Unknown tags, filters and tests are errors here, naming the
// construct and its line, so a template that cannot render is refused when it is loaded.
#include <vector>

#include "coordinator/api/jinja/ast.h"
#include "coordinator/api/jinja/lexer.h"

namespace tessera::jinja {

// Nesting of blocks and of expressions the parser accepts (bounds the evaluator's recursion).
inline constexpr int kMaxParseDepth = 128;

// Throws ParseError.
Body parse(const std::vector<Token>& tokens);

}  // namespace tessera::jinja
