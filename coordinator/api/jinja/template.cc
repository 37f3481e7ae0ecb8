#include "coordinator/api/jinja/template.h"

#include <new>

#include "coordinator/api/jinja/lexer.h"
#include "coordinator/api/jinja/parser.h"

namespace tessera::jinja {

StatusOr<Template> Template::parse(std::string_view source) {
  try {
    Template t;
    t.body_ = std::make_shared<const Body>(jinja::parse(tokenize(source)));
    return t;
  } catch (const ParseError& e) {
    return Status(e.code, e.message);
  }
}

StatusOr<std::string> Template::render(const nlohmann::ordered_json& context, const RenderLimits& limits) const {
  if (!context.is_object()) return invalid_argument("the template context must be a JSON object");
  auto globals = std::make_shared<Scope>();
  for (auto it = context.begin(); it != context.end(); ++it) globals->vars[it.key()] = from_json(it.value());
  try {
    Evaluator ev(limits);
    return ev.render(*body_, std::move(globals));
  } catch (const RenderError& e) {
    return invalid_argument(e.message);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("the template ran out of memory");
  }
}

}  // namespace tessera::jinja
