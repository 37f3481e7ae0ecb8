#include "coordinator/api/grammars/thoughts_prefix.h"

#include <string_view>

#include "coordinator/api/grammars/marker_free_text.h"

namespace tessera::structured {
namespace {

using Node = GrammarBuilder::Node;

constexpr std::string_view kClose = "</think>";

// Thoughts, then "</think>": any bytes in which "</think>" does not occur, then that marker.
Node thoughts_then_close(GrammarBuilder& g) { return g.seq({text_without(g, kClose), g.literal(kClose)}); }

Node whitespace(GrammarBuilder& g) { return g.star(g.bytes(json_whitespace())); }

}  // namespace

int allow_thoughts_before(GrammarBuilder& g, int root, ThoughtsBefore mode) {
  if (mode == ThoughtsBefore::kNone) return root;
  const int closed = g.new_rule("thoughts_closed");
  g.define(closed, thoughts_then_close(g));
  const Node answer = g.seq({g.ref(closed), whitespace(g), g.ref(root)});
  const int out = g.new_rule("reasoning_then_answer");
  if (mode == ThoughtsBefore::kOpen) {
    g.define(out, answer);
  } else {
    g.define(out, g.alt({g.seq({whitespace(g), g.literal("<think>"), answer}), g.ref(root)}));
  }
  return out;
}

const char* thoughts_key(ThoughtsBefore mode) {
  switch (mode) {
    case ThoughtsBefore::kNone: return "";
    case ThoughtsBefore::kOptional: return "thoughts?";
    case ThoughtsBefore::kOpen: return "thoughts";
  }
  return "";
}

}  // namespace tessera::structured
