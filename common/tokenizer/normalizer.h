#pragma once
// tokenizer.json `normalizer`: rewrites each piece of input text between added tokens
// before pre-tokenization. Supported: Sequence, NFC, NFD, NFKC, NFKD, Prepend, Replace,
// Lowercase, Strip. Anything else is an Unimplemented error naming the type.
#include <memory>
#include <string>

#include "common/status.h"
#include "common/tokenizer/json_fields.h"

namespace tessera::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// `where` is the field path used in error messages ("normalizer").
StatusOr<std::unique_ptr<Normalizer>> parse_normalizer(const Json& j, const std::string& where);

}  // namespace tessera::tok
