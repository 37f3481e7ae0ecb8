#pragma once
// Hugging Face `tokenizers` compatible tokenizer: reads tokenizer.json (and
// tokenizer_config.json for BOS/EOS, add_bos_token/add_eos_token and the chat
// template) and gives the ids `tokenizers` gives. Pipeline, as in tokenizers:
// added tokens (raw) -> normalizer -> added tokens (normalized) -> pre-tokenizer ->
// BPE model -> post-processor (only with special tokens). Decoding runs the decoder
// chain over the token strings. Thread-safe: encode/decode are const and may run
// concurrently (the BPE word cache is internally locked).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace tessera {

namespace tok {
class BpeModel;
class Normalizer;
class PreTokenizer;
class PostProcessor;
class Decoder;
class AddedTokenMatcher;
struct DecodeState;
}  // namespace tok

class Tokenizer {
 public:
  // dir holds tokenizer.json and optionally tokenizer_config.json.
  static StatusOr<std::unique_ptr<Tokenizer>> load(const std::string& dir);
  // Same from file contents; `source` names the tokenizer.json in error messages.
  // `config_json` may be empty (no tokenizer_config.json).
  static StatusOr<std::unique_ptr<Tokenizer>> from_json(const std::string& tokenizer_json,
                                                        const std::string& config_json,
                                                        const std::string& source = "tokenizer.json");
  // The same from the parsed documents (config: null when there is none), for a tokenizer
  // described in memory (a GGUF file's vocabulary) without a text round trip.
  static StatusOr<std::unique_ptr<Tokenizer>> from_parsed(const nlohmann::json& tokenizer,
                                                          const nlohmann::json* config,
                                                          const std::string& source = "tokenizer.json");
  ~Tokenizer();

  // Invalid UTF-8 in `text` is first replaced by U+FFFD (as Python's errors="replace").
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // What transformers' `tokenizer.decode` returns: the decoder chain, then, when
  // tokenizer_config.json sets `clean_up_tokenization_spaces`, transformers' clean-up
  // (common/tokenizer/tokenization_cleanup.h). Unknown ids are skipped, as tokenizers does.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;
  // The `tokenizers` library's decode: the decoder chain only, never the clean-up.
  std::string decode_without_cleanup(const std::vector<int32_t>& ids, bool skip_special_tokens) const;
  // tokenizer_config.json's `clean_up_tokenization_spaces` (false when absent, as in
  // transformers since 4.45).
  bool cleans_up_tokenization_spaces() const { return clean_up_tokenization_spaces_; }

  int32_t bos_id() const { return bos_id_; }  // -1 when none
  int32_t eos_id() const { return eos_id_; }  // -1 when none
  int64_t vocab_size() const { return vocab_size_; }  // distinct ids, added tokens included
  bool is_special(int32_t id) const;
  const std::string& chat_template() const { return chat_template_; }  // "" when none

  int32_t token_to_id(std::string_view token) const;  // -1 when absent
  // The token string of `id` ("" when none).
  std::string id_to_token(int32_t id) const;

  // Streaming support for IncrementalDetokenizer: decodes ids[begin, end), without the
  // clean-up (the detokenizer applies it to the stream).
  // `continuation`: earlier tokens were already decoded (no start-of-text effects);
  // `at_end`: no tokens follow. `*unstable` is set when the text could still change
  // once more tokens follow (incomplete UTF-8, a pending byte-fallback run, ...).
  std::string decode_window(const std::vector<int32_t>& ids, size_t begin, size_t end, bool skip_special_tokens,
                            bool continuation, bool at_end, bool* unstable) const;

 private:
  Tokenizer();
  // Appends the ids of one run of text between added tokens.
  void encode_run(std::string_view text, bool at_origin, std::vector<int32_t>& ids) const;
  const std::string* token_string(int32_t id) const;

  std::unique_ptr<tok::BpeModel> model_;
  std::unique_ptr<tok::Normalizer> normalizer_;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<tok::PostProcessor> post_processor_;
  std::unique_ptr<tok::Decoder> decoder_;
  std::unique_ptr<tok::AddedTokenMatcher> raw_matcher_;         // normalized == false
  std::unique_ptr<tok::AddedTokenMatcher> normalized_matcher_;  // normalized == true
  std::vector<std::string> added_content_;  // by id; "" when the id is not an added token
  std::vector<bool> is_added_;
  std::vector<bool> is_special_;
  std::unordered_map<std::string, int32_t> added_ids_;  // content -> id
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int64_t vocab_size_ = 0;
  std::string chat_template_;
  bool clean_up_tokenization_spaces_ = false;
};

}  // namespace tessera
