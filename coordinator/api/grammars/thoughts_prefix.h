#pragma once
// Structured output on a reasoning model (docs/api.md, "Reasoning models"): the model thinks
// first, in free text up to </think>, and the request's grammar (a JSON schema, a forced tool
// call, ...) holds for the answer after it — as the reasoning parser reads the output, so the
// answer is what the grammar allows and the thoughts are whatever the model wrote.
//
// The thoughts are any bytes that do not contain "</think>" (marker_free_text.h).
#include <cstdint>

#include "coordinator/engine/structured/grammar.h"

namespace tessera::structured {

enum class ThoughtsBefore : uint8_t {
  kNone,      // the grammar from the first byte (no reasoning, or the prompt closed the thoughts)
  kOptional,  // the output may open with <think> ... </think> (whitespace around) first (Qwen3)
  kOpen,      // the prompt left <think> open: the output is thoughts up to </think>, then the grammar
};

// A rule matching what `mode` puts before `root`'s text, then that text; `root` itself for kNone.
int allow_thoughts_before(GrammarBuilder& g, int root, ThoughtsBefore mode);

// A short tag for cache keys: grammars compiled for different modes differ.
const char* thoughts_key(ThoughtsBefore mode);

}  // namespace tessera::structured
