// libFuzzer: the structured-output compilers (coordinator/api/grammars/) and matcher
// (coordinator/engine/structured/) on arbitrary input. The first byte picks the kind (JSON schema, regex, GBNF grammar, choice
// list as JSON, JSON object); the text runs to the first NUL byte; the bytes after it are a
// token sequence over a fixed vocabulary whose tokens cross terminals and UTF-8 boundaries.
//
// Invariants (a violation traps, so libFuzzer reports it with the input):
//  - compilation either succeeds or fails with an InvalidArgument and a message;
//  - at every step, the mask says a token is allowed exactly when advancing by its bytes
//    leaves a live state (checked for the token the input asks for, and for one the mask
//    allows), and the walk only ever follows allowed tokens;
//  - memory stays bounded (the grammar, stack and cache limits of the library).
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/api/grammars/request_constraint.h"
#include "coordinator/engine/structured/token_constraint.h"

namespace tessera::structured {
namespace {

#define FUZZ_CHECK(cond)                                                                       \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "structured_output_fuzzer: invariant failed: %s (%s:%d)\n", #cond, \
                   __FILE__, __LINE__);                                                        \
      __builtin_trap();                                                                        \
    }                                                                                          \
  } while (0)

std::shared_ptr<const TokenVocabulary> vocabulary() {
  static const auto* v = [] {
    std::vector<std::string> t = {"", "{", "}", "[", "]", "\"", ":", ",", " ", "\n", "\":", "\",", "\"}", "},{",
                                  "{\"", "true", "false", "null", "0", "12", "-", ".5", "e+", "\\", "\\\"", "\\u00",
                                  "\xC3", "\xA9", "\xC3\xA9", "\xE2\x9C\x93", "ab", "a", "b", "x", "yes", "no"};
    for (int b = 0x20; b < 0x7F; ++b) t.push_back(std::string(1, static_cast<char>(b)));
    return new std::shared_ptr<const TokenVocabulary>(std::make_shared<const TokenVocabulary>(std::move(t)));
  }();
  return *v;
}

bool allowed(const std::vector<uint32_t>& mask, size_t t) { return ((mask[t / 32] >> (t % 32)) & 1u) != 0; }

}  // namespace
}  // namespace tessera::structured

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::structured;
  if (size < 1 || size > 4096) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t nul = input.find('\0');
  const std::string text(input.substr(0, nul));
  const std::string_view tokens = nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1);

  nlohmann::ordered_json value;
  ConstraintKind kind = ConstraintKind::kJsonObject;
  switch (data[0] % 5) {
    case 0:
      kind = ConstraintKind::kJsonSchema;
      value = nlohmann::ordered_json::parse(text, nullptr, false);
      if (value.is_discarded()) return 0;
      break;
    case 1:
      kind = ConstraintKind::kRegex;
      value = text;
      break;
    case 2:
      kind = ConstraintKind::kGrammar;
      value = text;
      break;
    case 3:
      kind = ConstraintKind::kChoice;
      value = nlohmann::ordered_json::parse(text, nullptr, false);
      if (value.is_discarded()) return 0;
      break;
    default:
      break;
  }
  tessera::StatusOr<Grammar> grammar = compile_constraint(kind, value);
  if (!grammar.is_ok()) {
    FUZZ_CHECK(grammar.status().code() == tessera::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!grammar.status().message().empty());
    return 0;
  }
  const TokenConstraint c(std::move(grammar).value(), vocabulary());
  (void)c.matches(text);
  MatchState state = c.initial();
  FUZZ_CHECK(!c.is_dead(state));
  const size_t vocab = static_cast<size_t>(c.vocabulary().size());
  std::vector<uint32_t> mask;
  for (size_t i = 0; i < tokens.size() && i < 64 && !c.must_end(state); ++i) {
    c.fill_mask(state, &mask);
    FUZZ_CHECK(mask.size() == c.vocabulary().mask_words());
    size_t pick = static_cast<uint8_t>(tokens[i]) % vocab;
    const bool asked_ok = !c.is_dead(c.advance_token(state, static_cast<int32_t>(pick)));
    FUZZ_CHECK(allowed(mask, pick) == asked_ok);
    if (!asked_ok) {
      size_t t = 0;
      while (t < vocab && !allowed(mask, t)) ++t;
      if (t == vocab) break;  // this vocabulary cannot continue the grammar here
      pick = t;
    }
    state = c.advance_token(state, static_cast<int32_t>(pick));
    FUZZ_CHECK(!c.is_dead(state) || c.exhausted());
    if (c.is_dead(state)) break;
  }
  return 0;
}
