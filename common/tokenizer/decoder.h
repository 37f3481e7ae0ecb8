#pragma once
// tokenizer.json `decoder`: turns token strings back into text. Supported: ByteLevel,
// Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence.
//
// Decoding is a chain over the token list, as in tokenizers. A few steps depend on
// where the list sits in the whole output (Metaspace drops the first token's
// replacement chars, a Strip after Fuse cuts the start and end of the whole text);
// DecodeState lets the streaming detokenizer decode a window that continues earlier
// tokens, and ends before later ones, with the same result as one full decode.
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/json_fields.h"

namespace tessera::tok {

struct DecodeState {
  bool continuation = false;  // tokens follow earlier, already decoded ones
  bool at_end = true;         // no tokens follow
  bool fused = false;         // set once the list was joined into one text (Fuse, ByteLevel)
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const = 0;
  // Streaming: true when text decoded so far could still change once more tokens
  // arrive after `last_token` (a pending byte-fallback run, a strippable tail).
  virtual bool unstable_tail(const std::string& last_token, const std::string& text) const { return false; }
};

StatusOr<std::unique_ptr<Decoder>> parse_decoder(const Json& j, const std::string& where);

// "<0x41>" -> 0x41, else -1 (ByteFallback's byte tokens).
int parse_byte_token(const std::string& token);

}  // namespace tessera::tok
