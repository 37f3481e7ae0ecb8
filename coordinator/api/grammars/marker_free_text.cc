#include "coordinator/api/grammars/marker_free_text.h"

#include <vector>

namespace tessera::structured {
namespace {

using Node = GrammarBuilder::Node;

ByteSet all_but(std::initializer_list<uint8_t> excluded) {
  ByteSet s;
  s.set();
  for (uint8_t c : excluded) s.reset(c);
  return s;
}

uint8_t byte_at(std::string_view s, size_t i) { return static_cast<uint8_t>(s[i]); }

}  // namespace

// The marker's first byte occurs only at its start, so an occurrence can only begin at that
// byte. Reading from one, the text matches the marker's first k bytes (a partial, 1 <= k < n)
// and then either breaks with a byte that is neither the marker's next nor its first (an
// item), or with its first byte, which starts the next partial (a run of partials). So the
// text is ([^m0] | run partial_k [^m0 m_k])* run.
Node text_without(GrammarBuilder& g, std::string_view marker) {
  const uint8_t first = byte_at(marker, 0);
  std::vector<Node> partials;
  for (size_t k = 1; k < marker.size(); ++k) partials.push_back(g.literal(marker.substr(0, k)));
  const int run = g.new_rule("partial_markers");
  g.define(run, g.star(g.alt(partials)));
  std::vector<Node> items = {g.bytes(all_but({first}))};
  for (size_t k = 1; k < marker.size(); ++k)
    items.push_back(g.seq({g.ref(run), partials[k - 1], g.bytes(all_but({first, byte_at(marker, k)}))}));
  const int text = g.new_rule("marker_free_text");
  g.define(text, g.star(g.alt(std::move(items))));
  return g.seq({g.ref(text), g.ref(run)});
}

ByteSet json_whitespace() {
  ByteSet ws;
  for (char c : {' ', '\t', '\n', '\r'}) ws.set(static_cast<uint8_t>(c));
  return ws;
}

Node any_text(GrammarBuilder& g) {
  ByteSet all;
  all.set();
  return g.star(g.bytes(all));
}

Node text_not_starting_with(GrammarBuilder& g, std::string_view marker, const ByteSet& first_bytes) {
  ByteSet others = first_bytes;
  others.reset(byte_at(marker, 0));
  std::vector<Node> ways = {g.literal(""), g.seq({g.bytes(others), any_text(g)})};
  for (size_t k = 1; k < marker.size(); ++k) {
    const Node partial = g.literal(marker.substr(0, k));
    ways.push_back(partial);
    ways.push_back(g.seq({partial, g.bytes(all_but({byte_at(marker, k)})), any_text(g)}));
  }
  return g.alt(std::move(ways));
}

}  // namespace tessera::structured
