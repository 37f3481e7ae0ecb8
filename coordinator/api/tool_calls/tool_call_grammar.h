#pragma once
// The grammar of a forced tool call (tool_choice "required" or a named function): the whole
// reply is one call or more, each naming a function of the request's tools, whose arguments
// follow that function's "parameters" schema (the JSON Schema compiler's grammar), written
// in the text the format's parser reads (hermes.cc, llama3_json.cc, mistral.cc):
//   hermes       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>   ("\n" between calls)
//   llama3_json  {"name": "f", "parameters": {...}}                            ("; " between calls)
//   mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]
// Everything the grammar allows, the parser reads back as exactly these calls and no content
// (tests/coordinator/tool_call_grammar_test.cc checks it on sampled outputs).
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "coordinator/api/grammars/thoughts_prefix.h"
#include "coordinator/engine/structured/grammar.h"
#include "coordinator/api/tool_calls/tool_call_format.h"

namespace tessera {

struct ForcedToolCalls {
  ToolCallFormat format = ToolCallFormat::kNone;
  // The request's "tools" as read_chat_request checked them (an array of {"type": "function",
  // "function": {name, parameters?, ...}}).
  const nlohmann::ordered_json* tools = nullptr;
  std::string only_function;  // a named tool_choice: this function, exactly one call
  bool parallel = true;       // "required": one call or more (false: exactly one)
  // What a reasoning model may write before the calls (thoughts_prefix.h).
  structured::ThoughtsBefore thoughts = structured::ThoughtsBefore::kNone;
};

// InvalidArgument with *param naming the field: the format is none ("tool_choice"), a
// function's parameters are not an object schema or use what the JSON Schema compiler cannot
// take ("tools[2].function.parameters", the message names the keyword and where it is).
StatusOr<structured::Grammar> compile_tool_call_grammar(const ForcedToolCalls& spec, std::string* param);

// A function without "parameters" takes no arguments (OpenAI): its arguments are {}.
nlohmann::ordered_json tool_arguments_schema(const nlohmann::ordered_json& function);

}  // namespace tessera
