#pragma once
// A Jinja2 template engine for chat templates: parse once (syntax errors name the construct
// and its line), render many times with a JSON context. Renders as Python Jinja2 does with
// transformers' apply_chat_template settings (trim_blocks, lstrip_blocks, one trailing
// newline of the source dropped, loop controls, the {% generation %} tag, tojson as
// json.dumps(ensure_ascii=False), raise_exception, strftime_now).
//
// Pieces: lexer (tokens and whitespace rules), parser (ast), value (Python-like values),
// evaluator (statements, scoping, operators), filters / tests_and_globals / methods
// (built-ins), unicode (code-point string operations).
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "coordinator/api/jinja/ast.h"
#include "coordinator/api/jinja/evaluator.h"

namespace tessera::jinja {

class Template {
 public:
  // InvalidArgument for malformed templates, Unimplemented for Jinja2 features a chat
  // template cannot use here (include, extends, import); both name the line.
  static StatusOr<Template> parse(std::string_view source);

  // Renders with `context`'s keys as the template's variables. A template error (its own
  // raise_exception(), a type error, an undefined value used as Jinja2 refuses it, a limit)
  // is InvalidArgument with the message.
  StatusOr<std::string> render(const nlohmann::ordered_json& context, const RenderLimits& limits = {}) const;

 private:
  std::shared_ptr<const Body> body_;
};

}  // namespace tessera::jinja
