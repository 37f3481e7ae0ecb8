#include "coordinator/engine/structured/grammar.h"

#include <algorithm>
#include <functional>
#include <map>
#include <unordered_map>

namespace tessera::structured {

using Node = GrammarBuilder::Node;

Node GrammarBuilder::add(Expr e) {
  exprs_.push_back(std::move(e));
  return static_cast<Node>(exprs_.size() - 1);
}

Node GrammarBuilder::empty() { return add(Expr{}); }

Node GrammarBuilder::bytes(const ByteSet& set) {
  Expr e;
  e.kind = Kind::kBytes;
  sets_.push_back(set);
  e.set = static_cast<int32_t>(sets_.size() - 1);
  return add(std::move(e));
}

Node GrammarBuilder::byte_range(uint8_t lo, uint8_t hi) {
  ByteSet s;
  for (int b = lo; b <= hi; ++b) s.set(static_cast<size_t>(b));
  return bytes(s);
}

Node GrammarBuilder::literal(std::string_view text) {
  std::vector<Node> items;
  items.reserve(text.size());
  for (char c : text) {
    ByteSet s;
    s.set(static_cast<uint8_t>(c));
    items.push_back(bytes(s));
  }
  return seq(std::move(items));
}

Node GrammarBuilder::seq(std::vector<Node> items) {
  if (items.size() == 1) return items[0];
  Expr e;
  e.kind = items.empty() ? Kind::kEmpty : Kind::kSeq;
  e.items = std::move(items);
  return add(std::move(e));
}

Node GrammarBuilder::alt(std::vector<Node> items) {
  if (items.size() == 1) return items[0];
  Expr e;
  e.kind = Kind::kAlt;  // no items: matches nothing
  e.items = std::move(items);
  return add(std::move(e));
}

Node GrammarBuilder::repeat(Node item, int min, int max) {
  if (min == 1 && max == 1) return item;
  Expr e;
  e.kind = Kind::kRepeat;
  e.min = min;
  e.max = max;
  e.items = {item};
  return add(std::move(e));
}

Node GrammarBuilder::ref(int rule) {
  Expr e;
  e.kind = Kind::kRef;
  e.rule = rule;
  return add(std::move(e));
}

int GrammarBuilder::rule(std::string_view name) {
  auto [it, fresh] = rule_ids_.emplace(std::string(name), static_cast<int>(rules_.size()));
  if (fresh) rules_.push_back(Rule{it->first, -1});
  return it->second;
}

// Names are looked up in a map and each hint counts its own suffixes, so a schema of thousands
// of properties makes its rules in linear time (a scan of every rule for each candidate name
// took 80 s for 3,000 properties).
int GrammarBuilder::new_rule(std::string_view hint) {
  std::string name(hint);
  int& next = next_suffix_.try_emplace(name, 2).first->second;  // hint, hint_2, hint_3, ...
  while (rule_ids_.count(name) > 0) name = std::string(hint) + "_" + std::to_string(next++);
  rule_ids_.emplace(name, static_cast<int>(rules_.size()));
  rules_.push_back(Rule{name, -1});
  return static_cast<int>(rules_.size() - 1);
}

void GrammarBuilder::define(int rule, Node body) { rules_[static_cast<size_t>(rule)].body = body; }

std::vector<int> GrammarBuilder::references(int rule) const {
  std::vector<int> out;
  const Node body = rules_[static_cast<size_t>(rule)].body;
  if (body < 0) return out;
  std::vector<Node> todo = {body};
  while (!todo.empty()) {
    const Expr& e = expr(todo.back());
    todo.pop_back();
    if (e.kind == Kind::kRef) out.push_back(e.rule);
    for (Node n : e.items) todo.push_back(n);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

namespace {

// Thompson construction into raw states with epsilon moves, one fragment per rule.
struct RawState {
  std::vector<std::pair<int32_t, int32_t>> bytes;  // (set, target)
  std::vector<Grammar::CallEdge> calls;
  std::vector<int32_t> eps;
};

class NfaBuilder {
 public:
  explicit NfaBuilder(const GrammarBuilder& g) : g_(g) {}

  int32_t new_state() {
    states_.emplace_back();
    if (states_.size() > static_cast<size_t>(kMaxGrammarStates)) too_large_ = true;
    return static_cast<int32_t>(states_.size() - 1);
  }
  bool too_large() const { return too_large_; }
  std::vector<RawState>& states() { return states_; }

  // Appends `n` starting at `from`; returns the state where it ends.
  int32_t build(Node n, int32_t from) {
    if (too_large_) return from;
    const GrammarBuilder::Expr& e = g_.expr(n);
    switch (e.kind) {
      case GrammarBuilder::Kind::kEmpty:
        return from;
      case GrammarBuilder::Kind::kBytes: {
        const int32_t t = new_state();
        states_[static_cast<size_t>(from)].bytes.emplace_back(e.set, t);
        return t;
      }
      case GrammarBuilder::Kind::kRef: {
        const int32_t t = new_state();
        states_[static_cast<size_t>(from)].calls.push_back({e.rule, t});
        return t;
      }
      case GrammarBuilder::Kind::kSeq: {
        int32_t at = from;
        for (Node item : e.items) at = build(item, at);
        return at;
      }
      case GrammarBuilder::Kind::kAlt: {
        const int32_t end = new_state();
        for (Node item : e.items) {
          const int32_t start = new_state();
          states_[static_cast<size_t>(from)].eps.push_back(start);
          const int32_t stop = build(item, start);
          states_[static_cast<size_t>(stop)].eps.push_back(end);
        }
        return end;
      }
      case GrammarBuilder::Kind::kRepeat: {
        int32_t at = from;
        for (int i = 0; i < e.min && !too_large_; ++i) at = build(e.items[0], isolate(at));
        if (e.max == GrammarBuilder::kUnbounded) {
          const int32_t loop = new_state();
          states_[static_cast<size_t>(at)].eps.push_back(loop);
          const int32_t body = new_state();
          states_[static_cast<size_t>(loop)].eps.push_back(body);
          const int32_t stop = build(e.items[0], body);
          states_[static_cast<size_t>(stop)].eps.push_back(loop);
          const int32_t end = new_state();
          states_[static_cast<size_t>(loop)].eps.push_back(end);
          return end;
        }
        const int32_t end = new_state();
        for (int i = e.min; i < e.max && !too_large_; ++i) {
          states_[static_cast<size_t>(at)].eps.push_back(end);
          at = build(e.items[0], isolate(at));
        }
        states_[static_cast<size_t>(at)].eps.push_back(end);
        return end;
      }
    }
    return from;
  }

 private:
  // A fresh state reached from `at` by epsilon, so loops built after `at` cannot leak into
  // the edges `at` already has.
  int32_t isolate(int32_t at) {
    const int32_t s = new_state();
    states_[static_cast<size_t>(at)].eps.push_back(s);
    return s;
  }

  const GrammarBuilder& g_;
  std::vector<RawState> states_;
  bool too_large_ = false;
};

Status invalid(const std::string& message) { return Status(StatusCode::kInvalidArgument, message); }

// Rule and state numbers are int32_t (the Grammar keeps them so); vectors want size_t.
size_t idx(int32_t i) { return static_cast<size_t>(i); }

// Rules reachable from the root; every rule they reference must be defined.
Status find_reachable_rules(const GrammarBuilder& builder, int root, std::vector<bool>* reachable) {
  reachable->assign(static_cast<size_t>(builder.num_rules()), false);
  std::vector<int> todo = {root};
  (*reachable)[idx(root)] = true;
  while (!todo.empty()) {
    const int r = todo.back();
    todo.pop_back();
    for (int ref : builder.references(r)) {
      if (!builder.is_defined(ref))
        return invalid("rule '" + builder.rule_name(ref) + "' is used by rule '" + builder.rule_name(r) +
                       "' but never defined");
      if (!(*reachable)[idx(ref)]) {
        (*reachable)[idx(ref)] = true;
        todo.push_back(ref);
      }
    }
  }
  return Status::ok();
}

// The NFA with epsilon moves, one fragment per reachable rule; starts/ends are -1 for the others.
struct RuleFragments {
  std::vector<RawState> raw;
  std::vector<int32_t> starts;
  std::vector<int32_t> ends;
};

Status build_rule_fragments(const GrammarBuilder& builder, const std::vector<bool>& reachable, RuleFragments* out) {
  const int num_rules = builder.num_rules();
  NfaBuilder nfa(builder);
  out->starts.assign(static_cast<size_t>(num_rules), -1);
  out->ends.assign(static_cast<size_t>(num_rules), -1);
  for (int r = 0; r < num_rules; ++r) {
    if (!reachable[idx(r)]) continue;
    out->starts[idx(r)] = nfa.new_state();
    out->ends[idx(r)] = nfa.build(builder.rule_at(r).body, out->starts[idx(r)]);
    if (nfa.too_large()) break;
  }
  if (nfa.too_large())
    return invalid("the grammar is too large: it expands to more than " + std::to_string(kMaxGrammarStates) +
                   " states (bounded repetitions such as {m,n} or maxLength are unrolled)");
  out->raw = std::move(nfa.states());
  return Status::ok();
}

// Fold epsilon moves: each state gets the edges of every state its epsilon closure holds
// (byte edges to one target merged into one set), and is final when the closure holds the
// end of a rule.
Status fold_epsilon_moves(const GrammarBuilder& builder, const RuleFragments& nfa, std::vector<Grammar::State>* states,
                          std::vector<ByteSet>* sets) {
  const std::vector<RawState>& raw = nfa.raw;
  const size_t n = raw.size();
  std::vector<bool> is_end(n, false);
  for (int32_t end : nfa.ends)
    if (end >= 0) is_end[idx(end)] = true;
  states->resize(n);
  std::vector<uint32_t> seen(n, 0);
  uint32_t mark = 0;
  size_t work = 0;
  std::vector<int32_t> stack;
  for (size_t s = 0; s < n; ++s) {
    ++mark;
    stack.assign(1, static_cast<int32_t>(s));
    seen[s] = mark;
    std::map<int32_t, ByteSet> by_target;
    Grammar::State& out = (*states)[s];
    while (!stack.empty()) {
      const int32_t q = stack.back();
      stack.pop_back();
      if (++work > 50u * static_cast<size_t>(kMaxGrammarStates))
        return invalid("the grammar is too large: its optional and repeated parts nest too deeply");
      const RawState& rq = raw[idx(q)];
      if (is_end[idx(q)]) out.final = true;
      for (const auto& [set, target] : rq.bytes) by_target[target] |= builder.set(set);
      for (const Grammar::CallEdge& c : rq.calls) out.calls.push_back(c);
      for (int32_t e : rq.eps) {
        if (seen[idx(e)] != mark) {
          seen[idx(e)] = mark;
          stack.push_back(e);
        }
      }
    }
    for (const auto& [target, set] : by_target) {
      if (set.none()) continue;
      sets->push_back(set);
      out.bytes.push_back({static_cast<int32_t>(sets->size() - 1), target});
    }
  }
  return Status::ok();
}

// The states among `candidates` from which their rule can complete: final ones, and those
// with an edge to such a state — a call whose rule can complete from its start, or (when
// `reading`) a byte. `reading` true gives liveness; false, the states that can complete
// without reading a byte. A fixed point, iterated from the end (most edges point forward).
std::vector<bool> completing_states(const std::vector<Grammar::State>& states, const std::vector<int32_t>& starts,
                                    const std::vector<bool>& candidates, bool reading) {
  const size_t n = states.size();
  std::vector<bool> done(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = n; i-- > 0;) {
      if (done[i] || !candidates[i]) continue;
      const Grammar::State& st = states[i];
      bool v = st.final;
      if (reading)
        for (const auto& e : st.bytes) v = v || done[idx(e.target)];
      for (const auto& c : st.calls) v = v || (done[idx(starts[idx(c.rule)])] && done[idx(c.ret)]);
      if (v) {
        done[i] = true;
        changed = true;
      }
    }
  }
  return done;
}

// Every reachable rule, the root first, must be able to complete.
Status check_rules_complete(const GrammarBuilder& builder, int root, const std::vector<bool>& reachable,
                            const std::vector<int32_t>& starts, const std::vector<bool>& live) {
  if (!live[idx(starts[idx(root)])])
    return invalid("the grammar accepts no string (rule '" + builder.rule_name(root) + "' can never complete)");
  for (int r = 0; r < builder.num_rules(); ++r) {
    if (reachable[idx(r)] && !live[idx(starts[idx(r)])])
      return invalid("rule '" + builder.rule_name(r) + "' accepts no string (it can never complete)");
  }
  return Status::ok();
}

// Dead edges are dropped, so the matcher never enters a state it cannot leave; calls are
// sorted and made unique.
void drop_dead_edges(const std::vector<bool>& live, std::vector<Grammar::State>* states) {
  for (Grammar::State& st : *states) {
    std::erase_if(st.bytes, [&](const Grammar::ByteEdge& e) { return !live[idx(e.target)]; });
    std::erase_if(st.calls, [&](const Grammar::CallEdge& c) { return !live[idx(c.ret)]; });
    std::sort(st.calls.begin(), st.calls.end(),
              [](const auto& a, const auto& b) { return a.rule != b.rule ? a.rule < b.rule : a.ret < b.ret; });
    st.calls.erase(std::unique(st.calls.begin(), st.calls.end(),
                               [](const auto& a, const auto& b) { return a.rule == b.rule && a.ret == b.ret; }),
                   st.calls.end());
  }
}

// For each reachable rule, the rules it calls before reading a byte: calls from its start,
// and from the return states of calls whose rule can complete without reading.
std::vector<std::vector<int>> left_calls(const std::vector<Grammar::State>& states, const std::vector<int32_t>& starts,
                                         const std::vector<bool>& reachable, const std::vector<bool>& nullable) {
  std::vector<std::vector<int>> calls(reachable.size());
  std::vector<uint32_t> seen(states.size(), 0);
  uint32_t mark = 0;
  std::vector<int32_t> stack;
  for (size_t r = 0; r < reachable.size(); ++r) {
    if (!reachable[r]) continue;
    ++mark;
    stack.assign(1, starts[r]);
    while (!stack.empty()) {
      const int32_t q = stack.back();
      stack.pop_back();
      for (const auto& c : states[idx(q)].calls) {
        calls[r].push_back(c.rule);
        if (nullable[idx(starts[idx(c.rule)])] && seen[idx(c.ret)] != mark) {
          seen[idx(c.ret)] = mark;
          stack.push_back(c.ret);
        }
      }
    }
  }
  return calls;
}

// Left recursion: a cycle of rules each calling the next before reading a byte.
Status check_left_recursion(const GrammarBuilder& builder, const std::vector<bool>& reachable,
                            const std::vector<std::vector<int>>& left_calls) {
  const size_t num_rules = reachable.size();
  std::vector<int> color(num_rules, 0), path;
  std::string cycle;
  std::function<bool(int)> dfs = [&](int r) {
    color[idx(r)] = 1;
    path.push_back(r);
    for (int x : left_calls[idx(r)]) {
      if (color[idx(x)] == 1) {
        auto it = std::find(path.begin(), path.end(), x);
        for (; it != path.end(); ++it) cycle += builder.rule_name(*it) + " -> ";
        cycle += builder.rule_name(x);
        return true;
      }
      if (color[idx(x)] == 0 && dfs(x)) return true;
    }
    path.pop_back();
    color[idx(r)] = 2;
    return false;
  };
  for (size_t r = 0; r < num_rules; ++r) {
    if (reachable[r] && color[r] == 0 && dfs(static_cast<int>(r)))
      return invalid("the grammar is left-recursive (" + cycle +
                     " without reading a character); rewrite it with repetition, e.g. a ::= b (\"x\" b)*");
  }
  return Status::ok();
}

}  // namespace

StatusOr<Grammar> compile_grammar(const GrammarBuilder& builder, int root) {
  const int num_rules = builder.num_rules();
  if (root < 0 || root >= num_rules || !builder.is_defined(root)) return invalid("the grammar has no root rule");
  if (num_rules > kMaxGrammarRules)
    return invalid("the grammar is too large: it has " + std::to_string(num_rules) + " rules (at most " +
                   std::to_string(kMaxGrammarRules) + ")");
  std::vector<bool> reachable;
  TESSERA_RETURN_IF_ERROR(find_reachable_rules(builder, root, &reachable));
  RuleFragments nfa;
  TESSERA_RETURN_IF_ERROR(build_rule_fragments(builder, reachable, &nfa));
  Grammar g;
  TESSERA_RETURN_IF_ERROR(fold_epsilon_moves(builder, nfa, &g.states_, &g.sets_));

  // Liveness: a state is live when its rule can complete from it.
  const std::vector<bool> live = completing_states(g.states_, nfa.starts, std::vector<bool>(g.states_.size(), true),
                                                   /*reading=*/true);
  TESSERA_RETURN_IF_ERROR(check_rules_complete(builder, root, reachable, nfa.starts, live));
  drop_dead_edges(live, &g.states_);

  const std::vector<bool> nullable = completing_states(g.states_, nfa.starts, live, /*reading=*/false);
  TESSERA_RETURN_IF_ERROR(
      check_left_recursion(builder, reachable, left_calls(g.states_, nfa.starts, reachable, nullable)));

  g.rule_starts_ = std::move(nfa.starts);
  g.root_ = root;
  g.rule_names_.reserve(static_cast<size_t>(num_rules));
  for (int r = 0; r < num_rules; ++r) g.rule_names_.push_back(builder.rule_name(r));
  return g;
}

}  // namespace tessera::structured
