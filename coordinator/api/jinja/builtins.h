#pragma once
// Jinja2's built-in filters, tests and globals, and the Python methods templates call on
// strings, dicts and lists ("x".strip(), d.items(), l.append(v)), with Jinja2's and Python's
// semantics. The parser asks is_filter/is_test so unknown names are refused at load time.
#include <string>
#include <string_view>

#include "coordinator/api/jinja/value.h"

namespace tessera::jinja {

bool is_filter(std::string_view name);
bool is_test(std::string_view name);
Value apply_filter(Evaluator& ev, std::string_view name, const Value& operand, const Args& args);
bool apply_test(Evaluator& ev, std::string_view name, const Value& operand, const Args& args);

// obj.name for a Python method of obj's type (a bound method), or undefined if it has none.
Value method_of(const Value& obj, const std::string& name);

// The global functions: range, namespace, dict, raise_exception, strftime_now, cycler, joiner.
Value global_function(std::string_view name);

// Helpers shared by filters and methods.
std::string slice_string(const std::string& s, const Value& start, const Value& stop, const Value& step);
Value slice_list(const Value& list, const Value& start, const Value& stop, const Value& step);
std::string python_strip(const std::string& s, const Value* chars, bool left, bool right);
std::string html_escape(const std::string& s);  // markupsafe's escape: & < > " '

}  // namespace tessera::jinja
