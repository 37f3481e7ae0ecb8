#pragma once
// Small string helpers shared across the project.
#include <string>
#include <string_view>

namespace tessera {

// `text` with every occurrence of `from` replaced by `to` (left to right, no overlaps).
// An empty `from` leaves the text unchanged.
std::string replace_all(std::string_view text, std::string_view from, std::string_view to);

// ASCII lower case (config values, file extensions, type names: never user text).
std::string ascii_lower(std::string_view text);

}  // namespace tessera

namespace tessera {

// Standard base64 (RFC 4648, with '=' padding) of `bytes`.
std::string base64_encode(std::string_view bytes);

}  // namespace tessera
