#pragma once
// The evaluator: walks a parsed template (ast.h) over a context of values and writes the
// output, with Jinja2's scoping (a for loop's and a macro's sets stay inside; namespace()
// objects carry values out), loop variables, macros and call blocks. Work is bounded: output
// bytes, macro call depth and evaluation steps have limits, each a clear error past it.
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "coordinator/api/jinja/ast.h"
#include "coordinator/api/jinja/value.h"

namespace tessera::jinja {

struct RenderLimits {
  size_t max_output_bytes = 32 << 20;  // all text the render writes, macro output included
  size_t max_built_bytes = 512 << 20;  // all strings operators and filters build (concatenation, join, ...)
  int max_call_depth = 64;             // macros calling macros
  int64_t max_steps = 20'000'000;      // statements and expressions evaluated
  std::optional<std::tm> fixed_now;    // strftime_now's time (tests pin it); unset: the local time
};

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
  const Value* find(const std::string& name) const;
};
using ScopePtr = std::shared_ptr<Scope>;

class Evaluator {
 public:
  explicit Evaluator(RenderLimits limits) : limits_(std::move(limits)) {}

  // Throws RenderError.
  std::string render(const Body& body, ScopePtr globals);

  Value call(const Value& function, const Args& args);
  // Counts bytes a built-in is about to produce (a join, a repeated string) against the
  // output limit.
  void charge(size_t bytes);
  const RenderLimits& limits() const { return limits_; }
  // Containers a template mutated (a list appended to, a namespace assigned, a scope holding
  // a macro that refers back to it) can form reference cycles; render() empties them when it
  // ends so nothing outlives the render.
  void track_mutated(const std::shared_ptr<List>& list) {
    if (tracked_.insert(list.get()).second) mutated_lists_.push_back(list);
  }
  void track_mutated(const std::shared_ptr<Dict>& dict) {
    if (tracked_.insert(dict.get()).second) mutated_dicts_.push_back(dict);
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Flow exec(const Body& body, std::string& out, const ScopePtr& scope);
  Flow exec_one(const Stmt& s, std::string& out, const ScopePtr& scope);
  Flow exec_for(const Stmt& s, std::string& out, const ScopePtr& scope);
  void exec_set(const Stmt& s, const ScopePtr& scope);
  Value make_macro(const Stmt& s, const ScopePtr& scope, const std::string& name);
  Value eval(const Expr& e, const ScopePtr& scope);
  Value eval_binary(const Expr& e, const ScopePtr& scope);
  Value eval_compare(const Expr& e, const ScopePtr& scope);
  Args eval_args(const Expr& e, size_t first, const ScopePtr& scope);
  Value apply_filter_chain(const Expr& f, const Value& operand, const ScopePtr& scope);
  void emit(std::string& out, const std::string& text);
  void step();

  RenderLimits limits_;
  std::vector<std::shared_ptr<List>> mutated_lists_;
  std::vector<std::shared_ptr<Dict>> mutated_dicts_;
  std::vector<ScopePtr> macro_scopes_;
  std::unordered_set<const void*> tracked_;
  size_t produced_ = 0;
  size_t built_ = 0;
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

// Python semantics for the operators (shared with filters such as sum).
Value binary_op(const std::string& op, const Value& a, const Value& b, Evaluator& ev);
bool contains(const Value& container, const Value& item);
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
// Fails with an undefined value's message (Jinja2's UndefinedError).
[[noreturn]] void fail_undefined(const Value& v);

}  // namespace tessera::jinja
