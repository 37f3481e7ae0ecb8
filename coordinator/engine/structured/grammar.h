#pragma once
// The grammar IR every structured-output constraint compiles to (docs/structured-output.md):
// named rules over byte-level expressions, built with GrammarBuilder by the JSON Schema
// compiler, the regex compiler and the GBNF parser, then compiled once into a Grammar — one
// small NFA per rule whose edges read a byte (from a byte set) or call another rule. Bytes,
// not characters, because the matcher walks tokens, which are byte strings that may end in
// the middle of a UTF-8 character.
//
// compile() checks what makes a grammar unusable, each an InvalidArgument naming the rule:
// an undefined rule, a rule that can never complete (accepts no string), left recursion
// (a rule that can reach itself without reading a byte: the matcher's closure would not
// end), and a grammar too large to expand.
#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace tessera::structured {

using ByteSet = std::bitset<256>;

// Builds expressions as nodes of an arena; a Node is an index into it.
class GrammarBuilder {
 public:
  using Node = int32_t;
  static constexpr int kUnbounded = -1;

  Node empty();                      // matches ""
  Node bytes(const ByteSet& set);    // one byte from the set (an empty set matches nothing)
  Node byte_range(uint8_t lo, uint8_t hi);
  Node literal(std::string_view text);  // these bytes in order
  Node seq(std::vector<Node> items);
  Node alt(std::vector<Node> items);
  Node repeat(Node item, int min, int max);  // max kUnbounded = no upper bound
  Node optional(Node item) { return repeat(item, 0, 1); }
  Node star(Node item) { return repeat(item, 0, kUnbounded); }
  Node plus(Node item) { return repeat(item, 1, kUnbounded); }
  Node ref(int rule);

  // A rule by name: the existing one, or a new undefined one.
  int rule(std::string_view name);
  // A fresh rule named after `hint` (hint, hint_2, ...).
  int new_rule(std::string_view hint);
  void define(int rule, Node body);
  bool is_defined(int rule) const { return rules_[static_cast<size_t>(rule)].body >= 0; }
  const std::string& rule_name(int rule) const { return rules_[static_cast<size_t>(rule)].name; }
  int num_rules() const { return static_cast<int>(rules_.size()); }
  // Rule ids each rule's body references (for reachability checks).
  std::vector<int> references(int rule) const;

  enum class Kind : uint8_t { kEmpty, kBytes, kSeq, kAlt, kRepeat, kRef };
  struct Expr {
    Kind kind = Kind::kEmpty;
    int32_t set = -1;      // kBytes: index into sets_
    int32_t rule = -1;     // kRef
    int32_t min = 0, max = 0;  // kRepeat
    std::vector<Node> items;   // kSeq, kAlt; kRepeat: one
  };
  struct Rule {
    std::string name;
    Node body = -1;  // -1 = not defined
  };
  const Expr& expr(Node n) const { return exprs_[static_cast<size_t>(n)]; }
  const ByteSet& set(int32_t i) const { return sets_[static_cast<size_t>(i)]; }
  const Rule& rule_at(int rule) const { return rules_[static_cast<size_t>(rule)]; }

 private:
  Node add(Expr e);
  std::vector<Expr> exprs_;
  std::vector<ByteSet> sets_;
  std::vector<Rule> rules_;
  std::unordered_map<std::string, int> rule_ids_;     // name -> rule
  std::unordered_map<std::string, int> next_suffix_;  // new_rule's next numbered name per hint
};

// A compiled grammar: rule NFAs with epsilon moves folded away. State s reads byte b when
// some byte edge of s has b in its set; it may also call rules (the callee starts, and when
// it completes the caller goes on at the edge's return state), and complete its own rule.
class Grammar {
 public:
  struct ByteEdge {
    int32_t set;     // index into byte_sets()
    int32_t target;  // state
  };
  struct CallEdge {
    int32_t rule;
    int32_t ret;  // state of the caller to go on at
  };
  struct State {
    std::vector<ByteEdge> bytes;
    std::vector<CallEdge> calls;
    bool final = false;  // its rule may complete here
  };

  const State& state(int32_t s) const { return states_[static_cast<size_t>(s)]; }
  int32_t rule_start(int rule) const { return rule_starts_[static_cast<size_t>(rule)]; }
  int root() const { return root_; }
  const ByteSet& byte_set(int32_t i) const { return sets_[static_cast<size_t>(i)]; }
  int num_states() const { return static_cast<int>(states_.size()); }
  int num_rules() const { return static_cast<int>(rule_starts_.size()); }
  const std::string& rule_name(int rule) const { return rule_names_[static_cast<size_t>(rule)]; }

 private:
  friend StatusOr<Grammar> compile_grammar(const GrammarBuilder& builder, int root);
  std::vector<State> states_;
  std::vector<int32_t> rule_starts_;
  std::vector<std::string> rule_names_;
  std::vector<ByteSet> sets_;
  int root_ = 0;
};

// Most NFA states a grammar may expand to (bounded repetitions are unrolled): beyond it the
// grammar is refused as too large, so a request cannot make the server allocate without bound.
inline constexpr int kMaxGrammarStates = 200000;
inline constexpr int kMaxGrammarRules = 5000;

StatusOr<Grammar> compile_grammar(const GrammarBuilder& builder, int root);

}  // namespace tessera::structured
