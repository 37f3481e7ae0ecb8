#include "coordinator/api/grammars/thoughts_prefix.h"

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::structured {
namespace {

using Node = GrammarBuilder::Node;

constexpr std::string_view kClose = "</think>";

ByteSet all_but(std::initializer_list<char> excluded) {
  ByteSet s;
  s.set();
  for (char c : excluded) s.reset(static_cast<uint8_t>(c));
  return s;
}

// Thoughts, then "</think>": any bytes in which "</think>" does not occur, then that marker.
// Its eight bytes are distinct and only the first is '<', so an occurrence can only start at a
// '<'. Reading from a '<', the text matches the marker's first k bytes (a partial, 1 <= k <= 7)
// and then either breaks with a byte that is neither the marker's next nor '<' (an item), or
// with a '<' that starts the next partial (a run of partials). So the thoughts are
// ([^<] | run partial_k [^<p_k])* and then a run and the whole marker.
Node thoughts_then_close(GrammarBuilder& g) {
  std::vector<Node> partials;
  for (size_t k = 1; k < kClose.size(); ++k) partials.push_back(g.literal(kClose.substr(0, k)));
  const int run = g.new_rule("thought_partials");
  g.define(run, g.star(g.alt(partials)));
  std::vector<Node> items = {g.bytes(all_but({'<'}))};
  for (size_t k = 1; k < kClose.size(); ++k)
    items.push_back(g.seq({g.ref(run), partials[k - 1], g.bytes(all_but({'<', kClose[k]}))}));
  const int text = g.new_rule("thoughts");
  g.define(text, g.star(g.alt(std::move(items))));
  return g.seq({g.ref(text), g.ref(run), g.literal(kClose)});
}

Node whitespace(GrammarBuilder& g) {
  ByteSet ws;
  for (char c : {' ', '\t', '\n', '\r'}) ws.set(static_cast<uint8_t>(c));
  return g.star(g.bytes(ws));
}

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
