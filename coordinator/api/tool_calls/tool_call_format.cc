#include "coordinator/api/tool_calls/tool_call_format.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace tessera {

StatusOr<std::optional<ToolCallFormat>> tool_call_format_from_name(std::string_view name) {
  if (name == "auto") return std::optional<ToolCallFormat>();
  if (name == "none") return std::optional<ToolCallFormat>(ToolCallFormat::kNone);
  if (name == "hermes") return std::optional<ToolCallFormat>(ToolCallFormat::kHermes);
  if (name == "llama3_json") return std::optional<ToolCallFormat>(ToolCallFormat::kLlama3Json);
  if (name == "mistral") return std::optional<ToolCallFormat>(ToolCallFormat::kMistral);
  if (name == "openai") return std::optional<ToolCallFormat>(ToolCallFormat::kHarmony);
  return invalid_argument("unknown tool-call parser '" + std::string(name) +
                          "' (auto, hermes, llama3_json, mistral, openai, none)");
}

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kNone: return "none";
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3Json: return "llama3_json";
    case ToolCallFormat::kMistral: return "mistral";
    case ToolCallFormat::kHarmony: return "openai";
  }
  return "none";
}

ToolCallFormat tool_call_format_for_template(std::string_view source) {
  if (source.find("<tool_call>") != std::string_view::npos) return ToolCallFormat::kHermes;
  if (source.find("[TOOL_CALLS]") != std::string_view::npos) return ToolCallFormat::kMistral;
  if (source.find("<|channel|>") != std::string_view::npos) return ToolCallFormat::kHarmony;
  if (source.find("<|start_header_id|>") != std::string_view::npos &&
      source.find("\"parameters\"") != std::string_view::npos)
    return ToolCallFormat::kLlama3Json;
  return ToolCallFormat::kNone;
}

std::unique_ptr<const ToolCallParser> make_tool_call_parser(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes: return make_hermes_parser();
    case ToolCallFormat::kLlama3Json: return make_llama3_json_parser();
    case ToolCallFormat::kMistral: return make_mistral_parser();
    case ToolCallFormat::kHarmony: return make_harmony_parser();
    case ToolCallFormat::kNone: break;
  }
  return nullptr;
}

std::optional<size_t> json_value_end(std::string_view text, size_t pos) {
  if (pos >= text.size() || (text[pos] != '{' && text[pos] != '[')) return std::nullopt;
  // Depth alone decides the end (brackets inside strings do not count); whether the value is
  // valid JSON is the parser's question afterwards.
  int depth = 0;
  bool in_string = false;
  for (size_t i = pos; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::nullopt;
}

size_t json_nesting_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

std::optional<ParsedToolCall> call_from_json_text(std::string_view text, const char* alt_arguments) {
  using ojson = nlohmann::ordered_json;
  if (json_nesting_depth(text) > kMaxJsonDepth) return std::nullopt;
  const ojson j = ojson::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  return call_from_json(j, alt_arguments);
}

std::optional<ParsedToolCall> call_from_json(const nlohmann::ordered_json& j, const char* alt_arguments) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  auto args = j.find("arguments");
  if (args == j.end() && alt_arguments != nullptr) args = j.find(alt_arguments);
  // Only the name and the arguments: an object with more is an answer that looks like a
  // call, not a call.
  if (j.size() > (args == j.end() ? 1u : 2u)) return std::nullopt;
  ParsedToolCall call;
  call.name = name->get<std::string>();
  if (args == j.end()) {
    call.arguments = "{}";
  } else if (args->is_object()) {
    call.arguments = args->dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  } else if (args->is_string()) {
    // Some models write the arguments as JSON text; it must encode an object.
    if (json_nesting_depth(args->get_ref<const std::string&>()) > kMaxJsonDepth) return std::nullopt;
    const auto inner = nlohmann::ordered_json::parse(args->get<std::string>(), nullptr, false);
    if (inner.is_discarded() || !inner.is_object()) return std::nullopt;
    call.arguments = inner.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  } else {
    return std::nullopt;
  }
  return call;
}

size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  const size_t longest = std::min(text.size(), marker.size() - 1);
  for (size_t n = longest; n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace tessera
