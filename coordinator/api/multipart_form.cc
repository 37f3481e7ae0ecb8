#include "coordinator/api/multipart_form.h"

#include <algorithm>
#include <cctype>

namespace tessera {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// The value of `key=` in a header's parameters (`; name="file"; filename="in.jsonl"`),
// unquoted; "" when absent.
std::string header_parameter(std::string_view header, std::string_view key) {
  const std::string low = lower(header);
  for (size_t at = 0; (at = low.find(key, at)) != std::string::npos; at += key.size()) {
    const bool starts = at == 0 || low[at - 1] == ';' || low[at - 1] == ' ' || low[at - 1] == '\t';
    if (!starts || at + key.size() >= low.size() || low[at + key.size()] != '=') continue;
    size_t v = at + key.size() + 1;
    if (v < header.size() && header[v] == '"') {
      const size_t end = header.find('"', v + 1);
      return std::string(header.substr(v + 1, end == std::string_view::npos ? std::string_view::npos : end - v - 1));
    }
    const size_t end = header.find(';', v);
    std::string_view raw = header.substr(v, end == std::string_view::npos ? std::string_view::npos : end - v);
    while (!raw.empty() && (raw.back() == ' ' || raw.back() == '\t')) raw.remove_suffix(1);
    return std::string(raw);
  }
  return "";
}

}  // namespace

StatusOr<std::map<std::string, FormPart>> parse_multipart_form(std::string_view content_type, std::string_view body) {
  if (lower(content_type).rfind("multipart/form-data", 0) != 0)
    return invalid_argument("the body must be multipart/form-data (Content-Type is '" + std::string(content_type) + "')");
  const std::string boundary = header_parameter(content_type, "boundary");
  if (boundary.empty()) return invalid_argument("the multipart/form-data Content-Type has no boundary");
  const std::string delimiter = "--" + boundary;
  size_t at = body.find(delimiter);
  if (at == std::string_view::npos) return invalid_argument("the body has no part (no '" + delimiter + "' line)");
  std::map<std::string, FormPart> parts;
  for (;;) {
    at += delimiter.size();
    if (body.substr(at, 2) == "--") return parts;  // the closing delimiter
    if (body.substr(at, 2) != "\r\n") return invalid_argument("a multipart delimiter is not followed by a line end");
    at += 2;
    const size_t head_end = body.find("\r\n\r\n", at);
    if (head_end == std::string_view::npos) return invalid_argument("a part's headers do not end");
    std::string disposition;
    for (size_t line = at; line < head_end;) {
      const size_t end = std::min(body.find("\r\n", line), head_end);
      const std::string_view header = body.substr(line, end - line);
      if (lower(header).rfind("content-disposition:", 0) == 0) disposition = std::string(header.substr(20));
      line = end + 2;
    }
    const std::string name = header_parameter(disposition, "name");
    if (name.empty()) return invalid_argument("a part has no Content-Disposition name");
    const size_t content = head_end + 4;
    const size_t next = body.find("\r\n" + delimiter, content);
    if (next == std::string_view::npos) return invalid_argument("part '" + name + "' does not end (no closing delimiter)");
    if (parts.count(name)) return invalid_argument("part '" + name + "' is given twice");
    parts[name] = FormPart{header_parameter(disposition, "filename"), std::string(body.substr(content, next - content))};
    at = next + 2;
  }
}

}  // namespace tessera
