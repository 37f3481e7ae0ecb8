#pragma once
// The keys an object may add beside its listed properties (JSON Schema's
// additionalProperties next to properties): a JSON string that is none of the listed names,
// so a name is never written twice (once listed, once as an extra key).
#include <string>
#include <vector>

#include "coordinator/engine/structured/grammar.h"

namespace tessera::structured {

// A JSON string (quotes included) of plain characters — no escapes, since an escape could
// spell a listed name another way — whose text is none of `names`. Names that cannot be
// written without escapes ('"', '\', control characters) cannot collide and are left out.
GrammarBuilder::Node json_key_other_than(GrammarBuilder& g, const std::vector<std::string>& names);

}  // namespace tessera::structured
