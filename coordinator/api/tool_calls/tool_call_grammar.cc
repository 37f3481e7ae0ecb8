#include "coordinator/api/tool_calls/tool_call_grammar.h"

#include <vector>

#include "coordinator/api/grammars/json_schema_compiler.h"
#include "coordinator/api/grammars/marker_free_text.h"

namespace tessera {

using ojson = nlohmann::ordered_json;
using structured::ByteSet;
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

using Node = GrammarBuilder::Node;

// The call formats' fixed text. `args_key` is what the parser reads the arguments from;
// `marker` is what content may not hold when it is allowed.
struct CallText {
  const char* before_all;    // once, before the first call
  const char* before_call;   // before each call's JSON
  const char* after_call;    // after each call's JSON
  const char* between;       // between two calls
  const char* after_all;     // once, after the last call
  const char* args_key;
  const char* marker;
};

CallText call_text(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes: return {"", "<tool_call>\n", "\n</tool_call>", "\n", "", "arguments", "<tool_call>"};
    case ToolCallFormat::kLlama3Json: return {"", "", "", "; ", "", "parameters", "<|python_tag|>"};
    case ToolCallFormat::kMistral: return {"[TOOL_CALLS][", "", "", ", ", "]", "arguments", "[TOOL_CALLS]"};
    case ToolCallFormat::kHarmony:
    case ToolCallFormat::kNone: break;
  }
  return {};
}

bool strict(const ojson& function) {
  auto s = function.find("strict");
  return s != function.end() && s->is_boolean() && s->get<bool>();
}

// Content around calls held to their grammar (`calls`: the calls' text, marker included). For
// the formats whose calls start with a marker, the content may not hold it, and the calls
// come once (mistral: one array) or between stretches of content (hermes: one block each);
// llama3_json's output is all calls or all content, and content that the parser would try
// as calls (starting with "{" or "<|python_tag|>", after whitespace) is not allowed.
Node content_with_calls(GrammarBuilder& g, ToolCallFormat format, const CallText& text, int calls, bool parallel) {
  if (format == ToolCallFormat::kLlama3Json) {
    ByteSet first;
    first.set();
    first.reset('{');
    first &= ~structured::json_whitespace();
    const Node content = g.seq({g.star(g.bytes(structured::json_whitespace())), structured::text_not_starting_with(g, text.marker, first)});
    return g.alt({g.ref(calls), content});
  }
  const int free = g.new_rule("content");
  g.define(free, structured::text_without(g, text.marker));
  const Node then = g.seq({g.ref(calls), g.ref(free)});
  const bool repeated = parallel && format == ToolCallFormat::kHermes;
  return g.seq({g.ref(free), repeated ? g.star(then) : g.repeat(then, 0, 1)});
}

}  // namespace

StatusOr<structured::Grammar> compile_tool_call_grammar(const ToolCallGrammarSpec& spec, std::string* param) {
  const std::string whose = spec.content_allowed ? "strict tools" : "a forced tool call";
  if (spec.format == ToolCallFormat::kNone) {
    *param = "tool_choice";
    return invalid_argument(
        whose + " needs a tool-call parser, and this server reads none (server.tool_call_parser is "
                "none, or auto found no call format in the chat template)");
  }
  if (spec.format == ToolCallFormat::kHarmony) {
    // Its calls are harmony messages whose markers are special tokens the matcher's
    // vocabulary does not spell out; not built yet.
    *param = "tool_choice";
    return invalid_argument(whose + " is not supported with the openai (harmony) call format yet; " +
                            (spec.content_allowed ? "leave 'strict' out" : "send 'tool_choice': \"auto\""));
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
    // With content allowed only strict functions are held to their schemas (OpenAI's meaning
    // of strict); the others' arguments are any object, as the parser takes them.
    const ojson schema = spec.content_allowed && !strict(fn) ? ojson{{"type", "object"}} : tool_arguments_schema(fn);
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
  // Hermes blocks between stretches of content are one call each; elsewhere the calls go together.
  const bool one_block_per_call = spec.content_allowed && spec.format == ToolCallFormat::kHermes;
  const bool many = spec.parallel && spec.only_function.empty() && !one_block_per_call;
  std::vector<GrammarBuilder::Node> body = {g.literal(text.before_all), g.ref(call)};
  if (many) body.push_back(g.star(g.seq({g.literal(text.between), g.ref(call)})));
  body.push_back(g.literal(text.after_all));
  const int tool_calls = g.new_rule("tool_calls");
  g.define(tool_calls, g.seq(std::move(body)));
  int root = tool_calls;
  if (spec.content_allowed) {
    root = g.new_rule("content_and_calls");
    g.define(root, content_with_calls(g, spec.format, text, tool_calls, spec.parallel));
  }
  StatusOr<structured::Grammar> grammar = structured::compile_grammar(g, structured::allow_thoughts_before(g, root, spec.thoughts));
  if (!grammar.is_ok()) *param = "tools";
  return grammar;
}

}  // namespace tessera
