#pragma once
// Shared by the GGUF reader's own .cc files (gguf_file.cc, gguf_split.cc); not an API.
#include <string>
#include <string_view>

namespace tessera {

// A name read from a file, fit for a one-line message: quoted, control bytes escaped, long
// names cut ("'blk.0.attn_q.weight'", "'a\x0ab'").
std::string gguf_quote(std::string_view s);

}  // namespace tessera
