#pragma once
// transformers' `clean_up_tokenization`: after the decoder chain, `tokenizer.decode` removes
// the space tokenizers of the BERT/GPT-2 era put before punctuation and English
// contractions (" ." -> ".", " n't" -> "n't", " 's" -> "'s", ...) when tokenizer_config.json
// sets `clean_up_tokenization_spaces` (Llama 3.x and GPT-2 do). The same ten replacements,
// in the same order, each over the whole text left to right as Python's str.replace does.
//
// Streaming: CleanupStream cleans text that arrives in pieces so that the pieces it returns
// concatenate to exactly clean_up_tokenization(whole text). It holds back only the tail
// that a later piece could still turn into a replacement (e.g. a trailing " n").
#include <string>
#include <string_view>

namespace tessera::tok {

std::string clean_up_tokenization(std::string_view text);

class CleanupStream {
 public:
  std::string push(std::string_view piece);  // may return "" while the tail is undecided
  std::string finish();                      // cleans and returns whatever is held

 private:
  std::string held_;  // raw text not yet cleaned: starts where cleaning may restart
};

}  // namespace tessera::tok
