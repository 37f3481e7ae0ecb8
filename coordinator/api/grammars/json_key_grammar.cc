#include "coordinator/api/grammars/json_key_grammar.h"

#include <cstdint>
#include <functional>
#include <map>

#include "coordinator/api/jinja/unicode.h"
#include "coordinator/engine/structured/codepoint_set.h"

namespace tessera::structured {
namespace {

using Node = GrammarBuilder::Node;
using Codepoints = std::u32string;

// The names' code points as a trie.
struct TrieNode {
  bool a_name_ends = false;
  std::map<char32_t, size_t> next;  // code point -> node
};

std::vector<TrieNode> build_trie(const std::vector<Codepoints>& names) {
  std::vector<TrieNode> nodes(1);
  for (const Codepoints& name : names) {
    size_t at = 0;
    for (char32_t cp : name) {
      auto it = nodes[at].next.find(cp);
      if (it == nodes[at].next.end()) {
        nodes.emplace_back();
        it = nodes[at].next.emplace(cp, nodes.size() - 1).first;
      }
      at = it->second;
    }
    nodes[at].a_name_ends = true;
  }
  return nodes;
}

}  // namespace

Node json_key_other_than(GrammarBuilder& g, const std::vector<std::string>& names) {
  std::vector<Codepoints> spelled;
  for (const std::string& name : names) {
    Codepoints cps = jinja::utf8_decode(name);  // JSON Schema keys are valid UTF-8
    bool plain = true;
    for (char32_t cp : cps) plain = plain && cp >= 0x20 && cp != '"' && cp != '\\';
    if (plain) spelled.push_back(std::move(cps));
  }
  const std::vector<TrieNode> trie = build_trie(spelled);
  // Plain characters: ASCII ones as a byte set; the others as one shared rule, since building
  // their UTF-8 automaton is the expensive part and a node's continuations are mostly ASCII.
  ByteSet ascii;
  for (int c = 0x20; c < 0x80; ++c) ascii.set(static_cast<size_t>(c));
  ascii.reset('"');
  ascii.reset('\\');
  const CodepointSet non_ascii = CodepointSet::of(0x80, kMaxCodepoint);
  const int other = g.new_rule("key_char");
  g.define(other, utf8_class(g, non_ascii));
  const int tail = g.new_rule("key_tail");  // any plain text, then the closing quote
  g.define(tail, g.seq({g.star(g.alt({g.bytes(ascii), g.ref(other)})), g.literal("\"")}));
  // A node's alternatives, its children's nested inside up to kNesting levels, then a rule:
  // few rules (a rule per node made the compiler slow on long names) and no deep nesting.
  constexpr int kNesting = 48;
  std::map<size_t, int> rule_of;  // node -> rule, for the nodes where nesting stops
  std::vector<size_t> pending;
  auto rule_for = [&](size_t node) {
    auto [it, fresh] = rule_of.emplace(node, -1);
    if (fresh) {
      it->second = g.new_rule("key");
      pending.push_back(node);
    }
    return it->second;
  };
  // After a node's code points: end the key (unless a name ends there), leave every name
  // with a code point none continues with, or follow one of them.
  std::function<Node(size_t, int)> after = [&](size_t node, int nesting) -> Node {
    if (nesting == kNesting) return g.ref(rule_for(node));
    const TrieNode& t = trie[node];
    std::vector<Node> alts;
    if (!t.a_name_ends) alts.push_back(g.literal("\""));
    ByteSet leave_ascii = ascii;
    CodepointSet leave_other = non_ascii;
    bool all_other = true;
    for (const auto& [cp, child] : t.next) {
      if (cp < 0x80) {
        leave_ascii.reset(cp);
      } else {
        leave_other = leave_other.minus(CodepointSet::of(cp, cp));
        all_other = false;
      }
    }
    if (leave_ascii.any()) alts.push_back(g.seq({g.bytes(leave_ascii), g.ref(tail)}));
    alts.push_back(g.seq({all_other ? g.ref(other) : utf8_class(g, leave_other), g.ref(tail)}));
    for (const auto& [cp, child] : t.next)
      alts.push_back(g.seq({utf8_class(g, CodepointSet::of(cp, cp)), after(child, nesting + 1)}));
    return g.alt(std::move(alts));
  };
  const int root = rule_for(0);
  while (!pending.empty()) {
    const size_t node = pending.back();
    pending.pop_back();
    g.define(rule_of.at(node), after(node, 0));
  }
  return g.seq({g.literal("\""), g.ref(root)});
}

}  // namespace tessera::structured
