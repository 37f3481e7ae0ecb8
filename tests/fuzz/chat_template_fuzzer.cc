// libFuzzer target for the chat template engine (coordinator/api/jinja/): the input is a
// template source, optionally followed by a NUL byte and a JSON context. Every input must
// parse or be refused with a Status, and every parsed template must render or be refused,
// within the output, step and depth limits (no crash, no unbounded recursion or memory).
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "coordinator/api/chat_template.h"

namespace {

// A context with the shapes real templates see when the input brings none of its own.
nlohmann::ordered_json default_context() {
  return nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "héllo 👋"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "f", "arguments": {"x": 1, "y": [1.5, true, null]}}}]},
      {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "{\"ok\": 1}"}],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
      "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}],
    "add_generation_prompt": true})");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string source = input.substr(0, nul);
  auto tmpl = tessera::ChatTemplate::parse(source);
  if (!tmpl.is_ok()) {
    if (tmpl.status().message().empty()) __builtin_trap();  // every refusal says why
    return 0;
  }
  nlohmann::ordered_json ctx = default_context();
  if (nul != std::string::npos) {
    auto parsed = nlohmann::ordered_json::parse(input.substr(nul + 1), nullptr, false);
    if (parsed.is_object()) {
      for (auto it = parsed.begin(); it != parsed.end(); ++it) ctx[it.key()] = it.value();
      if (!ctx["messages"].is_array()) ctx["messages"] = nlohmann::ordered_json::array();
    }
  }
  tessera::jinja::RenderLimits limits;
  limits.max_output_bytes = 1 << 20;
  limits.max_built_bytes = 16 << 20;
  limits.max_steps = 200'000;
  tmpl->set_limits(limits);
  auto out = tmpl->render(ctx);
  if (!out.is_ok() && out.status().message().empty()) __builtin_trap();
  return 0;
}
