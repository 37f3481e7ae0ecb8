#pragma once
// JSON Schema -> grammar (docs/structured-output.md lists the keywords). Every keyword is
// either compiled, an annotation that constrains nothing (title, description, ...), or an
// InvalidArgument naming it and where it is ("unsupported keyword 'uniqueItems' at
// /properties/tags") — a keyword that would constrain the output is never ignored.
//
// The grammar may accept fewer documents than the schema (it never accepts one the schema
// refuses): properties come in the order the schema lists them, only listed properties are
// written unless additionalProperties allows a map, numbers are written without exponent
// when bounded, string formats are the documented regexes, and whitespace between tokens is
// at most one space or one newline with up to 20 spaces or tabs of indentation.
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "coordinator/engine/structured/grammar.h"

namespace tessera::structured {

// Adds the rules of `schema` to `g`; returns the root rule.
// Ordered: properties are written in the order the schema lists them.
StatusOr<int> compile_json_schema(GrammarBuilder& g, const nlohmann::ordered_json& schema);
// Adds a rule for any JSON object (response_format {"type": "json_object"}); returns it.
int json_object_rule(GrammarBuilder& g);

}  // namespace tessera::structured
