#pragma once
// The parsed template: statements (text, output, control blocks) and expressions, as the
// parser builds them and the evaluator walks them. Every node keeps its source line for
// error messages.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/api/jinja/value.h"

namespace tessera::jinja {

enum class ExprKind {
  kLiteral,   // literal
  kName,      // name
  kList,      // children
  kTuple,     // children
  kDict,      // children: key0, value0, key1, value1, ...
  kAttr,      // children[0].name
  kItem,      // children[0][children[1]]
  kSlice,     // children[0][children[1]:children[2]:children[3]] (null = omitted)
  kCall,      // children[0](children[1..], kwargs)
  kFilter,    // children[0] | name(children[1..], kwargs); children[0] null in a filter block
  kTest,      // children[0] is [not] name(children[1..], kwargs)
  kUnary,     // name ("-", "+", "not") children[0]
  kBinary,    // children[0] name children[1]: + - * / // % ** ~ and or
  kCompare,   // children[0] ops[0] children[1] ops[1] children[2] ...
  kCondition  // children[0] if children[1] else children[2] (null: undefined)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value literal;
  std::string name;
  bool negated = false;
  std::vector<std::unique_ptr<Expr>> children;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
  std::vector<std::string> ops;
};
using ExprPtr = std::unique_ptr<Expr>;

enum class StmtKind {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // branches (cond, body) ..., else_body
  kFor,          // for targets in expr [if cond] body [else else_body]
  kSet,          // set targets = expr, or set targets[0].attr = expr
  kSetBlock,     // set targets[0] [| filters] body endset
  kMacro,        // macro name(params=defaults) body
  kCallBlock,    // call(params) expr body
  kFilterBlock,  // filter expr body
  kWith,         // with targets = values body
  kScope,        // a body rendered in place (the {% generation %} tag transformers adds)
  kBreak,
  kContinue
};

struct Stmt;
using Body = std::vector<Stmt>;

struct Stmt {
  Stmt(StmtKind kind, int line) : kind(kind), line(line) {}
  StmtKind kind;
  int line = 0;
  std::string text;  // kText; kMacro's name; kSet's attribute (namespace assignment)
  ExprPtr expr;      // output / for iterable / set value / call / filter chain
  ExprPtr cond;      // for ... if cond
  std::vector<std::string> targets;
  std::vector<ExprPtr> values;    // kWith values; kMacro / kCallBlock defaults (null: none)
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf
  Body body, else_body;
};

}  // namespace tessera::jinja
