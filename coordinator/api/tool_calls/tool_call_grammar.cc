#include "coordinator/api/tool_calls/tool_call_grammar.h"

#include <vector>

#include "coordinator/api/grammars/json_schema_compiler.h"

namespace tessera {

using ojson = nlohmann::ordered_json;
using structured::GrammarBuilder;

ojson tool_arguments_schema(const ojson& function) {
  auto p = function.find("parameters");
  if (p == function.end() || p->is_null())
    return ojson{{"type", "object"}, {"properties", ojson::object()}, {"additionalProperties", false}};
  ojson schema = *p;
  // The arguments are an object whatever else the schema says (the parsers read only objects).
  if (!schema.contains("type")) schema["type"] = "object";
  return schema;
}

namespace {

// The call formats' fixed text. `args_key` is what the parser reads the arguments from.
struct CallText {
  const char* before_all;    // once, before the first call
  const char* before_call;   // before each call's JSON
  const char* after_call;    // after each call's JSON
  const char* between;       // between two calls
  const char* after_all;     // once, after the last call
  const char* args_key;
};

CallText call_text(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes: return {"", "<tool_call>\n", "\n</tool_call>", "\n", "", "arguments"};
    case ToolCallFormat::kLlama3Json: return {"", "", "", "; ", "", "parameters"};
    case ToolCallFormat::kMistral: return {"[TOOL_CALLS][", "", "", ", ", "]", "arguments"};
    case ToolCallFormat::kHarmony:
    case ToolCallFormat::kNone: break;
  }
  return {};
}

}  // namespace

StatusOr<structured::Grammar> compile_tool_call_grammar(const ForcedToolCalls& spec, std::string* param) {
  if (spec.format == ToolCallFormat::kNone) {
    *param = "tool_choice";
    return invalid_argument(
        "a forced tool call needs a tool-call parser, and this server reads none (server.tool_call_parser is "
        "none, or auto found no call format in the chat template)");
  }
  if (spec.format == ToolCallFormat::kHarmony) {
    // Its calls are harmony messages whose markers are special tokens the matcher's
    // vocabulary does not spell out; not built yet.
    *param = "tool_choice";
    return invalid_argument("a forced tool call is not supported with the openai (harmony) call format yet; "
                            "send 'tool_choice': \"auto\"");
  }
  const CallText text = call_text(spec.format);
  GrammarBuilder g;
  std::vector<GrammarBuilder::Node> calls;
  const ojson& tools = *spec.tools;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& fn = tools[i]["function"];
    const std::string name = fn["name"].get<std::string>();
    if (!spec.only_function.empty() && name != spec.only_function) continue;
    const std::string at = "tools[" + std::to_string(i) + "].function.parameters";
    const ojson schema = tool_arguments_schema(fn);
    if (schema["type"] != "object") {
      *param = at + ".type";
      return invalid_argument("'" + *param + "' must be \"object\": a call's arguments are a JSON object");
    }
    StatusOr<int> args = structured::compile_json_schema(g, schema);
    if (!args.is_ok()) {
      *param = at;
      return invalid_argument("'" + at + "' (function '" + name + "'): " + args.status().message());
    }
    // The name as JSON text (escaped as a JSON string), so the parser reads back this name.
    const std::string head = std::string(text.before_call) + "{\"name\": " + ojson(name).dump() + ", \"" +
                             text.args_key + "\": ";
    calls.push_back(g.seq({g.literal(head), g.ref(args.value()), g.literal(std::string("}") + text.after_call)}));
  }
  const int call = g.new_rule("call");
  g.define(call, g.alt(std::move(calls)));
  const bool many = spec.parallel && spec.only_function.empty();
  std::vector<GrammarBuilder::Node> body = {g.literal(text.before_all), g.ref(call)};
  if (many) body.push_back(g.star(g.seq({g.literal(text.between), g.ref(call)})));
  body.push_back(g.literal(text.after_all));
  const int root = g.new_rule("tool_calls");
  g.define(root, g.seq(std::move(body)));
  StatusOr<structured::Grammar> grammar = structured::compile_grammar(g, structured::allow_thoughts_before(g, root, spec.thoughts));
  if (!grammar.is_ok()) *param = "tools";
  return grammar;
}

}  // namespace tessera
