#pragma once
// The structured-output fields of a request (docs/api.md, docs/structured-output.md):
// response_format {"type": "json_object" | "json_schema", ...} and vLLM's guided_json,
// guided_regex, guided_choice, guided_grammar — at most one of them. Compiled grammars are
// kept in a small cache (by kind and text), so the 20 samples of one schema, or a client
// sending the same schema all day, compile it once and share its mask caches.
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "coordinator/api/grammars/thoughts_prefix.h"
#include "coordinator/engine/structured/grammar.h"
#include "coordinator/engine/structured/token_constraint.h"
#include "coordinator/engine/structured/token_vocabulary.h"

namespace tessera::structured {

enum class ConstraintKind { kJsonObject, kJsonSchema, kRegex, kChoice, kGrammar };

// `value`: the schema (kJsonSchema), the pattern or grammar text (kRegex, kGrammar), the
// array of strings (kChoice); unused for kJsonObject. InvalidArgument naming the problem.
// (ordered_json: a schema's properties are written in its order.) `thoughts`: what a
// reasoning model may write before the constrained text (thoughts_prefix.h).
StatusOr<Grammar> compile_constraint(ConstraintKind kind, const nlohmann::ordered_json& value,
                                     ThoughtsBefore thoughts = ThoughtsBefore::kNone);

// A request's constraint as its fields give it, before compiling.
struct RequestedConstraint {
  ConstraintKind kind = ConstraintKind::kJsonObject;
  nlohmann::ordered_json value;
  std::string field;  // the field that gave it ("response_format", "guided_json", ...)
};

// Reads and checks the fields of `body` (at most one, well formed, and a vocabulary to
// compile against). No constraint field (or response_format {"type": "text"}): true with
// *out empty. Otherwise false with *param (the field) and *message (why) for a 400.
bool read_request_constraint(const nlohmann::ordered_json& body, const std::shared_ptr<const TokenVocabulary>& vocabulary,
                             std::optional<RequestedConstraint>* out, std::string* param, std::string* message);
// Compiles it (or finds it in the cache) with `thoughts` before it; a grammar the compiler
// refuses is false with *param the field.
bool compile_requested_constraint(const RequestedConstraint& requested,
                                  const std::shared_ptr<const TokenVocabulary>& vocabulary, ThoughtsBefore thoughts,
                                  std::shared_ptr<const TokenConstraint>* out, std::string* param,
                                  std::string* message);

// Both: no constraint field: true with *out null. Otherwise the constraint, or false with
// *param (the field) and *message (why) for a 400. `thoughts` as for compile_constraint.
bool parse_request_constraint(const nlohmann::ordered_json& body, const std::shared_ptr<const TokenVocabulary>& vocabulary,
                              std::shared_ptr<const TokenConstraint>* out, std::string* param, std::string* message,
                              ThoughtsBefore thoughts = ThoughtsBefore::kNone);

// The constraint cached under `key` for `vocabulary`, else `compile`d now and cached (keys
// are the callers': a kind prefix and the constraint's text; tool_call_grammar.h uses it too).
StatusOr<std::shared_ptr<const TokenConstraint>> cached_constraint(
    const std::shared_ptr<const TokenVocabulary>& vocabulary, const std::string& key,
    const std::function<StatusOr<Grammar>()>& compile);

// Grammars compiled so far for `vocabulary` are reused; this many are kept (least recently used dropped).
inline constexpr size_t kConstraintCacheSize = 64;

}  // namespace tessera::structured
