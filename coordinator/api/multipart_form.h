#pragma once
// multipart/form-data bodies (RFC 7578), as OpenAI's clients upload files to /v1/files: the
// boundary from the Content-Type, then each part's name, filename and bytes.
#include <map>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tessera {

struct FormPart {
  std::string filename;  // "" when the part is not a file
  std::string content;
};

// The parts by name; InvalidArgument naming what is wrong (not multipart/form-data, no
// boundary, a part without a name or without its end, a name given twice).
StatusOr<std::map<std::string, FormPart>> parse_multipart_form(std::string_view content_type, std::string_view body);

}  // namespace tessera
