#pragma once
// Free text that must not contain a marker, as grammar rules: a reasoning model's thoughts
// before "</think>" (thoughts_prefix.h), a reply's content around tool calls that are held to
// their schemas (tool_call_grammar.h: content may not contain "<tool_call>", so any call the
// parser reads is one the grammar wrote). Regular languages, so the matcher walks them like
// any grammar text and caches the masks of their few states.
#include <string_view>

#include "coordinator/engine/structured/grammar.h"

namespace tessera::structured {

// Any bytes in which `marker` does not occur (ending in a prefix of it is allowed: a following
// literal `marker` then makes its first occurrence). `marker` must be at least 2 bytes and
// its first byte must not occur again in it ("</think>", "<tool_call>", "[TOOL_CALLS]").
GrammarBuilder::Node text_without(GrammarBuilder& g, std::string_view marker);

// Text whose first byte is one of `first_bytes` or `marker`'s first, and that does not start
// with `marker` (any marker): empty, a byte of `first_bytes` and then any bytes, a proper
// prefix of `marker`, or a prefix of it broken by another byte and then any bytes.
GrammarBuilder::Node text_not_starting_with(GrammarBuilder& g, std::string_view marker, const ByteSet& first_bytes);

// Any bytes.
GrammarBuilder::Node any_text(GrammarBuilder& g);

// JSON's whitespace bytes (space, tab, newline, carriage return): what may stand between the
// thoughts and an answer, and before a llama3_json call.
ByteSet json_whitespace();

}  // namespace tessera::structured
