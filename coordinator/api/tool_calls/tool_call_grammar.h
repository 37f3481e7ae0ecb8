#pragma once
// The grammar of tool calls held to their schemas. Forced (tool_choice "required" or a named
// function): the whole reply is one call or more, each naming a function of the request's
// tools, whose arguments follow that function's "parameters" schema (the JSON Schema
// compiler's grammar). With content allowed ("auto" with a strict tool): the reply is content
// as the model writes it, and any call in it follows the grammar — the arguments of a strict
// function its schema, of another function any object. Calls are written in the text the
// format's parser reads (hermes.cc, llama3_json.cc, mistral.cc):
//   hermes       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>   ("\n" between calls)
//   llama3_json  {"name": "f", "parameters": {...}}                            ("; " between calls)
//   mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]
// Everything a forced grammar allows, the parser reads back as exactly these calls and no
// content; with content allowed, content may not contain the format's call marker
// ("<tool_call>", "[TOOL_CALLS]"; for llama3_json, whose whole output is calls or content, it
// may not start with "{" or "<|python_tag|>"), so every call the parser reads is one the
// grammar wrote (tests/coordinator/tool_call_grammar_test.cc checks both on sampled outputs).
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "coordinator/api/grammars/thoughts_prefix.h"
#include "coordinator/engine/structured/grammar.h"
#include "coordinator/api/tool_calls/tool_call_format.h"

namespace tessera {

struct ToolCallGrammarSpec {
  ToolCallFormat format = ToolCallFormat::kNone;
  // The request's "tools" as read_chat_request checked them (an array of {"type": "function",
  // "function": {name, parameters?, ...}}).
  const nlohmann::ordered_json* tools = nullptr;
  std::string only_function;  // a named tool_choice: this function, exactly one call
  bool parallel = true;       // one call or more (false: exactly one; at most one with content)
  bool content_allowed = false;  // "auto" with strict tools (only_function then empty)
  // What a reasoning model may write before the calls (thoughts_prefix.h).
  structured::ThoughtsBefore thoughts = structured::ThoughtsBefore::kNone;
};

// InvalidArgument with *param naming the field: the format is none ("tool_choice"), a
// function's parameters are not an object schema or use what the JSON Schema compiler cannot
// take ("tools[2].function.parameters", the message names the keyword and where it is).
StatusOr<structured::Grammar> compile_tool_call_grammar(const ToolCallGrammarSpec& spec, std::string* param);

// A function without "parameters" takes no arguments (OpenAI): its arguments are {}.
nlohmann::ordered_json tool_arguments_schema(const nlohmann::ordered_json& function);

}  // namespace tessera
