#pragma once
// The chat part of a request, checked and turned into what the chat template gets: the
// messages (role, content, name, tool_calls, tool_call_id), the tools and the tool choice,
// as transformers' apply_chat_template passes them (docs/api.md, "Messages" and "Tools").
// Every field a client can get wrong is a 400 naming it; objects keep the client's key order
// (nlohmann::ordered_json), so `tojson` in a template prints a tool schema as it was sent.
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "coordinator/api/api_error.h"

namespace tessera {

// kRequired / kNamed: the reply is decoded under a grammar of the format's call text
// (coordinator/api/tool_calls/tool_call_grammar.h): one call or more, or exactly the named one.
enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ChatRequestParts {
  // The chat template's context: "messages", "tools" (null when none), "documents" (null),
  // "add_generation_prompt" (true), "chat_template_kwargs" when the request has them.
  // bos_token / eos_token are the template's own.
  nlohmann::ordered_json context;
  bool has_tools = false;               // a non-empty "tools"
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_name;                // kNamed: the function (one of the tools)
  bool parallel_tool_calls = true;      // false: at most one call is read from the output
  int strict_tool = -1;                 // the first tool with "strict": true (-1: none)
  // vLLM's / transformers' continue_final_message: the prompt ends inside the final message,
  // which the model continues (cut_after_final_message), instead of after a new turn's start.
  bool continue_final_message = false;
};

// Reads "messages", "tools", "chat_template_kwargs", "tool_choice", "parallel_tool_calls",
// "add_generation_prompt" and "continue_final_message" of a chat body (the other fields are the caller's). False with *error a 400 whose param names the field:
// "messages[2].tool_calls[0].function.arguments", "tools[0].function.name", "tool_choice".
//  - content: a string, a list of {"type": "text", "text"} parts (their texts joined with no
//    separator; image, audio and file parts are refused, naming the part), or null / absent
//    on an assistant message (which then needs tool_calls or may be empty);
//  - tool_calls (assistant only): [{id, type: "function", function: {name, arguments}}],
//    arguments a JSON text (as OpenAI sends it) or an object; the template gets an object,
//    as transformers passes it (templates print it with `tojson`);
//  - tool_call_id (tool messages, required there); name (any message);
//  - the "developer" role is given to the template as "system" (OpenAI's newer name for it;
//    chat templates know only "system").
//  - chat_template_kwargs: an object of extra template variables (vLLM's; e.g.
//    {"enable_thinking": false}), names that are identifiers other than the context's own
//    (messages, tools, documents, add_generation_prompt, bos_token, eos_token); kept in the
//    context under "chat_template_kwargs" for ChatTemplate::render to spread (it refuses a
//    name the template never reads);
//  - reasoning_effort (OpenAI's; a string): the template variable reasoning_effort, which
//    gpt-oss's, DeepSeek V4's, Solar Open's and others' templates read (each with its own
//    values); ChatTemplate::render refuses it for a template that never reads it;
//  - tool_choice "required" needs tools; a named function must be one of them (400 naming
//    tool_choice otherwise). The grammar that forces the call is the caller's (openai_request.cc).
bool read_chat_request(const nlohmann::ordered_json& body, ChatRequestParts* out, ApiError* error);

// "add_generation_prompt" (default true) and "continue_final_message" (default false), as
// vLLM reads them: both true is a 400, and continuing needs a final message with text (an
// assistant's, typically: the model then writes on from its last word).
bool read_generation_prompt_fields(const nlohmann::ordered_json& body, ChatRequestParts* out, ApiError* error);

// transformers' continue_final_message on a rendered chat: the text cut right after the last
// occurrence of the final message's content (its stripped form, where the template trimmed
// its whitespace), so the prompt ends inside that message. A 400 (param
// "continue_final_message") when the rendered text does not hold it (the template changed it).
bool cut_after_final_message(const nlohmann::ordered_json& context, std::string* rendered, ApiError* error);

// A chat template's render error as the API answers it: the template raising, or a type error
// on the request's values, is the client's 400 (param "chat_template_kwargs" for a variable the
// template never reads, else "messages"); any other error is the server's 500.
ApiError chat_render_error(const Status& status);

// The same for /tokenize, whose body has only "messages" and (optionally) "tools" and
// "chat_template_kwargs" (the generation-prompt fields are read by the caller).
bool read_chat_messages_and_tools(const nlohmann::ordered_json& body, ChatRequestParts* out, ApiError* error);

}  // namespace tessera
