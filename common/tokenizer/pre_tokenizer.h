#pragma once
// tokenizer.json `pre_tokenizer`: cuts normalized text into the words the model sees.
// Supported: ByteLevel (with and without its GPT-2 regex), Split (regex or string, every
// behaviour, invert), Metaspace (prepend_scheme always/first/never, split), Digits,
// Punctuation, Whitespace, WhitespaceSplit, BertPreTokenizer, Sequence.
#include <functional>
#include <memory>
#include <string_view>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/json_fields.h"

namespace tessera::tok {

// One piece of input text on its way to the model.
struct Piece {
  std::string text;
  // The piece starts at byte 0 of the caller's text: Metaspace's prepend_scheme "first"
  // adds its prefix only there (tokenizers checks offsets_original().0 == 0).
  bool at_origin = false;
};

// How a Split keeps the delimiters it finds (tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces every piece by its sub-pieces; empty pieces are dropped.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
  // Calls `emit` with each word of `piece`, in order; the same words pre_tokenize()
  // gives. Hot path of encode: implementations may avoid building a Piece per word.
  virtual void for_each_word(Piece piece, const std::function<void(std::string_view)>& emit) const {
    std::vector<Piece> pieces;
    pieces.push_back(std::move(piece));
    pre_tokenize(pieces);
    for (const auto& p : pieces) emit(p.text);
  }
};

StatusOr<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const Json& j, const std::string& where);

// Splits `piece` at `matches` (sorted, non-overlapping byte ranges) with tokenizers'
// semantics; exposed for tests.
void split_piece(const Piece& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                 SplitBehavior behavior, bool invert, std::vector<Piece>& out);

}  // namespace tessera::tok
