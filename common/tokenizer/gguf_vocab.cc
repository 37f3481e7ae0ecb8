#include "common/tokenizer/gguf_vocab.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/tokenizer/json_fields.h"
#include "common/tokenizer/unicode_utils.h"

namespace tessera {
namespace {

using tok::Json;

constexpr const char* kKeyModel = "tokenizer.ggml.model";
constexpr const char* kKeyPre = "tokenizer.ggml.pre";
constexpr const char* kKeyTokens = "tokenizer.ggml.tokens";
constexpr const char* kKeyScores = "tokenizer.ggml.scores";
constexpr const char* kKeyTypes = "tokenizer.ggml.token_type";
constexpr const char* kKeyMerges = "tokenizer.ggml.merges";
constexpr const char* kKeyAddBos = "tokenizer.ggml.add_bos_token";
constexpr const char* kKeyAddEos = "tokenizer.ggml.add_eos_token";
constexpr const char* kKeyAddSep = "tokenizer.ggml.add_sep_token";
constexpr const char* kKeyAddSpacePrefix = "tokenizer.ggml.add_space_prefix";
constexpr const char* kKeyRemoveExtraSpaces = "tokenizer.ggml.remove_extra_whitespaces";
constexpr const char* kKeyChatTemplate = "tokenizer.chat_template";

// llama.cpp's token types (gguf-py's TokenType).
enum GgufTokenType : int64_t {
  kTokNormal = 1, kTokUnknown = 2, kTokControl = 3, kTokUserDefined = 4, kTokUnused = 5, kTokByte = 6,
};

const std::string kMetaspace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

std::string gguf_key_error_prefix(const GgufFile& file, std::string_view key) {
  return file.path() + ": metadata key '" + std::string(key) + "'";
}

// What every vocabulary kind has: the tokens, their types and (for "llama") their scores.
struct GgufVocabArrays {
  std::vector<std::string> tokens;
  std::vector<int64_t> types;
  std::vector<float> scores;  // empty when the file has none (allowed for "gpt2" only)
};

StatusOr<GgufVocabArrays> read_vocab_arrays(const GgufFile& file, bool scores_required) {
  GgufVocabArrays v;
  TESSERA_ASSIGN_OR_RETURN(v.tokens, file.get_string_array(kKeyTokens));
  if (v.tokens.empty()) return invalid_argument(gguf_key_error_prefix(file, kKeyTokens) + " is empty");
  if (v.tokens.size() > static_cast<size_t>(INT32_MAX)) {
    return invalid_argument(gguf_key_error_prefix(file, kKeyTokens) + " has more tokens than int32 ids can number");
  }
  const size_t n = v.tokens.size();
  auto check_length = [&](const char* key, size_t got) -> Status {
    if (got == n) return Status::ok();
    return invalid_argument(gguf_key_error_prefix(file, key) + " has " + std::to_string(got) + " items but " +
                            kKeyTokens + " has " + std::to_string(n));
  };
  TESSERA_ASSIGN_OR_RETURN(v.types, file.get_int_array(kKeyTypes));
  TESSERA_RETURN_IF_ERROR(check_length(kKeyTypes, v.types.size()));
  if (scores_required || file.has(kKeyScores)) {
    TESSERA_ASSIGN_OR_RETURN(v.scores, file.get_float_array(kKeyScores));
    TESSERA_RETURN_IF_ERROR(check_length(kKeyScores, v.scores.size()));
  }
  std::unordered_map<std::string_view, size_t> first_seen;
  first_seen.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string item = " item " + std::to_string(i);
    if (v.types[i] < kTokNormal || v.types[i] > kTokByte) {
      return invalid_argument(gguf_key_error_prefix(file, kKeyTypes) + item + " is " + std::to_string(v.types[i]) +
                              ", not a token type (1 normal .. 6 byte)");
    }
    if (!v.scores.empty() && std::isnan(v.scores[i])) {
      return invalid_argument(gguf_key_error_prefix(file, kKeyScores) + item + " is NaN");
    }
    const std::string& t = v.tokens[i];
    // Both would make the token unreachable and its id ambiguous in the vocabulary map.
    if (t.empty()) return invalid_argument(gguf_key_error_prefix(file, kKeyTokens) + item + " is empty");
    if (!tok::is_valid_utf8(t)) return invalid_argument(gguf_key_error_prefix(file, kKeyTokens) + item + " is not UTF-8");
    auto [it, inserted] = first_seen.emplace(t, i);
    if (!inserted) {
      return invalid_argument(gguf_key_error_prefix(file, kKeyTokens) + item + " '" + t + "' repeats item " +
                              std::to_string(it->second));
    }
  }
  return v;
}

// An optional token id: `fallback` (-1 for none) when absent, refused outside the vocabulary.
StatusOr<int32_t> read_special_id(const GgufFile& file, std::string_view key, size_t n_tokens, int32_t fallback) {
  if (!file.has(key)) return fallback < static_cast<int64_t>(n_tokens) ? fallback : -1;
  TESSERA_ASSIGN_OR_RETURN(uint64_t id, file.get_uint(key));
  if (id >= n_tokens) {
    return invalid_argument(gguf_key_error_prefix(file, key) + " is " + std::to_string(id) +
                            ", outside the vocabulary of " + std::to_string(n_tokens) + " tokens");
  }
  return static_cast<int32_t>(id);
}

StatusOr<bool> read_flag(const GgufFile& file, std::string_view key, bool fallback) {
  if (!file.has(key)) return fallback;
  return file.get_bool(key);
}

Json token_vocab_json(const std::vector<std::string>& tokens) {
  Json vocab = Json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = static_cast<int64_t>(i);
  return vocab;
}

// Control and unknown tokens are special; user-defined ones are plain added tokens.
// All are matched in the raw text (normalized false), as llama.cpp matches them.
Json added_tokens_json(const GgufVocabArrays& v) {
  Json added = Json::array();
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const int64_t type = v.types[i];
    if (type != kTokUnknown && type != kTokControl && type != kTokUserDefined) continue;
    added.push_back({{"id", static_cast<int64_t>(i)}, {"content", v.tokens[i]}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                     {"special", type != kTokUserDefined}});
  }
  return added;
}

// SentencePiece BPE has no merge list: a pair merges into the token it spells, and the
// higher that token's score the earlier. As transformers' SentencePieceExtractor: every
// split of every token into two tokens, the splits of one token ordered by their ids,
// then all of them stably sorted by the merged token's score, highest first.
Json spm_merges_from_scores(const GgufVocabArrays& v) {
  std::unordered_map<std::string_view, int32_t> ids;
  ids.reserve(v.tokens.size());
  for (size_t i = 0; i < v.tokens.size(); ++i) ids.emplace(v.tokens[i], static_cast<int32_t>(i));
  struct SpmMerge {
    float score;
    int32_t left, right;
  };
  std::vector<SpmMerge> merges;
  std::vector<SpmMerge> splits;
  for (size_t t = 0; t < v.tokens.size(); ++t) {
    const std::string_view token = v.tokens[t];
    splits.clear();
    // Split only between characters (the tokens were checked to be UTF-8).
    for (size_t k = tok::utf8_sequence_length(static_cast<unsigned char>(token[0])); k < token.size();
         k += tok::utf8_sequence_length(static_cast<unsigned char>(token[k]))) {
      auto left = ids.find(token.substr(0, k));
      if (left == ids.end()) continue;
      auto right = ids.find(token.substr(k));
      if (right == ids.end()) continue;
      splits.push_back(SpmMerge{v.scores[t], left->second, right->second});
    }
    std::sort(splits.begin(), splits.end(), [](const SpmMerge& a, const SpmMerge& b) {
      return a.left != b.left ? a.left < b.left : a.right < b.right;
    });
    merges.insert(merges.end(), splits.begin(), splits.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [](const SpmMerge& a, const SpmMerge& b) { return a.score > b.score; });
  Json out = Json::array();
  for (const SpmMerge& m : merges) out.push_back(Json::array({v.tokens[m.left], v.tokens[m.right]}));
  return out;
}

// "left right" as llama.cpp splits it: at the first space after the first byte.
StatusOr<Json> bpe_merges_json(const GgufFile& file, const std::vector<std::string>& tokens) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> merges, file.get_string_array(kKeyMerges));
  std::unordered_map<std::string_view, int32_t> ids;
  ids.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) ids.emplace(tokens[i], static_cast<int32_t>(i));
  Json out = Json::array();
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    const std::string where = gguf_key_error_prefix(file, kKeyMerges) + " item " + std::to_string(i);
    const size_t space = m.empty() ? std::string::npos : m.find(' ', 1);
    if (space == std::string::npos || space + 1 == m.size()) {
      return invalid_argument(where + " is '" + m + "', not \"left right\"");
    }
    const std::string left = m.substr(0, space), right = m.substr(space + 1);
    // The halves and the token they merge into must all be tokens.
    for (const std::string& piece : {left, right, left + right}) {
      if (ids.find(piece) == ids.end()) {
        return invalid_argument(where + " ('" + m + "'): '" + piece + "' is not in " + kKeyTokens);
      }
    }
    out.push_back(Json::array({left, right}));
  }
  return out;
}

// ---- byte-level BPE pre-tokenizers (tokenizer.ggml.pre), as the families' tokenizer.json
// files spell them.

Json byte_level_json(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

// Each regex splits the pieces of the ones before it (matches and the text between them kept),
// then ByteLevel maps the bytes.
Json splits_then_byte_level_json(const std::vector<const char*>& regexes) {
  Json steps = Json::array();
  for (const char* regex : regexes)
    steps.push_back({{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}});
  steps.push_back(byte_level_json(false));
  return {{"type", "Sequence"}, {"pretokenizers", steps}};
}

// Llama 3 (cl100k-style: numbers in runs of up to three digits).
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2/Qwen3 and StableLM 2: the same with single digits.
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Mistral's Tekken (Mistral Nemo, Ministral, Mistral Small 3): GPT-4o's case-change words
// without the contractions, single digits.
constexpr const char* kTekkenRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// BLOOM: runs of anything but whitespace and the listed punctuation, with one leading space
// (Oniguruma's nested class, as its tokenizer.json writes it).
constexpr const char* kBloomRegex = " ?[^(\\s|[.,!?\u2026\u3002\uFF0C\u3001\u0964\u06D4\u060C])]+";
// GPT-4o (o200k): words split at case changes, contractions attached.
constexpr const char* kGpt4oRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// DeepSeek LLM (7B, 67B; Llama models): line breaks alone, then runs of cased letters (Latin,
// Greek, Cyrillic, Armenian, ...: the class its tokenizer.json lists), ASCII and full-width
// punctuation runs, trailing whitespace, CJK and Hangul runs, digit runs; each split applied
// to the pieces of the ones before.
const char* const kDeepSeekLlmRegexes[] = {
    R"([\r\n])",
    R"(\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+)",
    R"(\s?[!-/:-~！-／：-～‘-‟　-。]+)",
    R"(\s+$)",
    R"([一-龥ࠀ-一가-퟿]+)",
    R"(\p{N}+)",
};
// DeepSeek Coder: line breaks, letter runs, punctuation runs, CJK and Hangul runs, single digits.
const char* const kDeepSeekCoderRegexes[] = {
    R"([\r\n])",
    R"(\s?\p{L}+)",
    R"(\s?\p{P}+)",
    R"([一-龥ࠀ-一가-퟿]+)",
    R"(\p{N})",
};

enum class BytePreKind { kGpt2, kSplit, kFalcon, kDigitsThenGpt2 };

struct BytePreSpec {
  std::vector<std::string_view> names;  // llama.cpp's tokenizer.ggml.pre values
  BytePreKind kind;
  std::vector<const char*> regexes;  // kSplit only: applied in turn
  bool nfc;            // tokenizer.json normalizer NFC
  bool ignore_merges;  // a word that is a whole token is taken as is
  bool add_bos;        // llama.cpp's default when tokenizer.ggml.add_bos_token is absent
  bool clean_spaces;   // llama.cpp's clean_spaces: transformers' clean_up_tokenization_spaces
};

const std::vector<BytePreSpec>& byte_pre_specs() {
  static const std::vector<BytePreSpec> specs = {
      // JetBrains Mellum and SK Telecom's A.X 4.0 name their own, which llama.cpp runs as GPT-2's.
      {{"default", "gpt-2", "phi-2", "mellum", "a.x-4.0"}, BytePreKind::kGpt2, {}, false, false, false, true},
      {{"llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral"}, BytePreKind::kSplit, {kLlama3Regex}, false, true, true,
       true},
      // DBRX's and Phi-4's (cl100k), Smaug-Llama-3's: Llama 3's regex, merges always applied, no
      // BOS by default.
      {{"dbrx", "smaug-bpe"}, BytePreKind::kSplit, {kLlama3Regex}, false, false, false, true},
      {{"qwen2", "deepseek-r1-qwen"}, BytePreKind::kSplit, {kQwen2Regex}, true, false, false, false},
      {{"tekken"}, BytePreKind::kSplit, {kTekkenRegex}, false, true, true, false},
      {{"bloom"}, BytePreKind::kSplit, {kBloomRegex}, false, false, false, true},
      {{"stablelm2"}, BytePreKind::kSplit, {kQwen2Regex}, false, false, false, true},
      {{"falcon"}, BytePreKind::kFalcon, {}, false, false, false, true},
      {{"starcoder", "refact", "minerva-7b"}, BytePreKind::kDigitsThenGpt2, {}, false, false, false, true},
      {{"smollm"}, BytePreKind::kDigitsThenGpt2, {}, false, false, false, false},
      {{"gpt-4o"}, BytePreKind::kSplit, {kGpt4oRegex}, false, false, false, false},
      {{"deepseek-llm"}, BytePreKind::kSplit, {std::begin(kDeepSeekLlmRegexes), std::end(kDeepSeekLlmRegexes)}, false,
       false, false, false},
      {{"deepseek-coder"}, BytePreKind::kSplit, {std::begin(kDeepSeekCoderRegexes), std::end(kDeepSeekCoderRegexes)},
       false, false, false, false},
  };
  return specs;
}

Json byte_pre_tokenizer_json(const BytePreSpec& spec) {
  switch (spec.kind) {
    case BytePreKind::kGpt2:
      return byte_level_json(true);
    case BytePreKind::kSplit:
      return splits_then_byte_level_json(spec.regexes);
    case BytePreKind::kFalcon:
      return {{"type", "Sequence"},
              {"pretokenizers",
               Json::array({{{"type", "Punctuation"}, {"behavior", "Contiguous"}}, byte_level_json(true),
                            {{"type", "Digits"}, {"individual_digits", false}},
                            {{"type", "Split"}, {"pattern", {{"Regex", "[0-9][0-9][0-9]"}}}, {"behavior", "Isolated"},
                             {"invert", false}}})}};
    case BytePreKind::kDigitsThenGpt2:
      return {{"type", "Sequence"},
              {"pretokenizers", Json::array({{{"type", "Digits"}, {"individual_digits", true}}, byte_level_json(true)})}};
  }
  return nullptr;
}

StatusOr<const BytePreSpec*> find_byte_pre_spec(const GgufFile& file) {
  std::string pre = "default";
  if (file.has(kKeyPre)) {
    TESSERA_ASSIGN_OR_RETURN(pre, file.get_string(kKeyPre));
  }
  std::string known;
  for (const BytePreSpec& spec : byte_pre_specs()) {
    for (std::string_view name : spec.names) {
      if (name == pre) return &spec;
      known += (known.empty() ? "" : ", ") + std::string(name);
    }
  }
  return unimplemented(gguf_key_error_prefix(file, kKeyPre) + " is '" + pre +
                       "', a pre-tokenizer Tessera does not implement (known: " + known + ")");
}

// ---- the two tokenizer.json layouts.

// What both layouts leave to the config: special tokens and their defaults.
struct GgufVocabDefaults {
  int32_t bos = -1, eos = -1, unk = -1;
  bool add_bos = false;
  bool clean_spaces = false;
};

StatusOr<Json> spm_tokenizer_json(const GgufFile& file, const GgufVocabArrays& v, int32_t unk_id) {
  TESSERA_ASSIGN_OR_RETURN(bool prepend, read_flag(file, kKeyAddSpacePrefix, true));
  TESSERA_ASSIGN_OR_RETURN(bool remove_extra_spaces, read_flag(file, kKeyRemoveExtraSpaces, false));
  if (remove_extra_spaces) {
    return unimplemented(gguf_key_error_prefix(file, kKeyRemoveExtraSpaces) +
                         " is true: collapsing whitespace is not supported");
  }
  const bool has_byte_tokens = std::find(v.types.begin(), v.types.end(), kTokByte) != v.types.end();
  Json decoders = Json::array({{{"type", "Replace"}, {"pattern", {{"String", kMetaspace}}}, {"content", " "}},
                               {{"type", "ByteFallback"}},
                               {{"type", "Fuse"}}});
  if (prepend) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  Json j = {{"version", "1.0"},
            {"added_tokens", added_tokens_json(v)},
            {"normalizer", nullptr},
            {"pre_tokenizer",
             {{"type", "Metaspace"}, {"replacement", kMetaspace}, {"prepend_scheme", prepend ? "first" : "never"},
              {"split", false}}},
            {"post_processor", nullptr},
            {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}}};
  j["model"] = {{"type", "BPE"},
                {"vocab", token_vocab_json(v.tokens)},
                {"merges", spm_merges_from_scores(v)},
                {"unk_token", unk_id >= 0 ? Json(v.tokens[unk_id]) : Json(nullptr)},
                {"byte_fallback", has_byte_tokens},
                {"fuse_unk", true},
                {"ignore_merges", false}};
  return j;
}

StatusOr<Json> byte_bpe_tokenizer_json(const GgufFile& file, const GgufVocabArrays& v, const BytePreSpec& pre,
                                       int32_t unk_id) {
  TESSERA_ASSIGN_OR_RETURN(bool prefix_space, read_flag(file, kKeyAddSpacePrefix, false));
  if (prefix_space) {
    return unimplemented(gguf_key_error_prefix(file, kKeyAddSpacePrefix) +
                         " is true: not supported for byte-level (gpt2) vocabularies");
  }
  TESSERA_ASSIGN_OR_RETURN(Json merges, bpe_merges_json(file, v.tokens));
  Json j = {{"version", "1.0"},
            {"added_tokens", added_tokens_json(v)},
            {"normalizer", pre.nfc ? Json({{"type", "NFC"}}) : Json(nullptr)},
            {"pre_tokenizer", byte_pre_tokenizer_json(pre)},
            {"post_processor", nullptr},
            {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}}};
  j["model"] = {{"type", "BPE"},
                {"vocab", token_vocab_json(v.tokens)},
                {"merges", std::move(merges)},
                {"unk_token", unk_id >= 0 ? Json(v.tokens[unk_id]) : Json(nullptr)},
                {"byte_fallback", false},
                {"fuse_unk", false},
                {"ignore_merges", pre.ignore_merges}};
  return j;
}

// tokenizer_config.json: special tokens by name, the add_* flags always explicit (so the
// tokenizer wraps ids exactly as the GGUF says), the chat template.
StatusOr<Json> gguf_config_json(const GgufFile& file, const GgufVocabArrays& v, const GgufVocabDefaults& d) {
  const size_t n = v.tokens.size();
  TESSERA_ASSIGN_OR_RETURN(int32_t bos, read_special_id(file, "tokenizer.ggml.bos_token_id", n, d.bos));
  TESSERA_ASSIGN_OR_RETURN(int32_t eos, read_special_id(file, "tokenizer.ggml.eos_token_id", n, d.eos));
  TESSERA_ASSIGN_OR_RETURN(int32_t pad, read_special_id(file, "tokenizer.ggml.padding_token_id", n, -1));
  TESSERA_ASSIGN_OR_RETURN(bool add_bos, read_flag(file, kKeyAddBos, d.add_bos));
  TESSERA_ASSIGN_OR_RETURN(bool add_eos, read_flag(file, kKeyAddEos, false));
  TESSERA_ASSIGN_OR_RETURN(bool add_sep, read_flag(file, kKeyAddSep, false));
  if (add_sep) {
    return unimplemented(gguf_key_error_prefix(file, kKeyAddSep) + " is true: appending a separator is not supported");
  }
  if (add_bos && bos < 0) {
    return invalid_argument(gguf_key_error_prefix(file, kKeyAddBos) +
                            " is true (or defaults to true here) but the file has no tokenizer.ggml.bos_token_id");
  }
  if (add_eos && eos < 0) {
    return invalid_argument(gguf_key_error_prefix(file, kKeyAddEos) +
                            " is true but the file has no tokenizer.ggml.eos_token_id");
  }
  auto token_or_null = [&v](int32_t id) { return id >= 0 ? Json(v.tokens[id]) : Json(nullptr); };
  Json c = {{"bos_token", token_or_null(bos)},
            {"eos_token", token_or_null(eos)},
            {"unk_token", token_or_null(d.unk)},
            {"pad_token", token_or_null(pad)},
            {"add_bos_token", add_bos},
            {"add_eos_token", add_eos},
            {"clean_up_tokenization_spaces", d.clean_spaces}};
  if (file.has(kKeyChatTemplate)) {
    TESSERA_ASSIGN_OR_RETURN(std::string chat_template, file.get_string(kKeyChatTemplate));
    if (!tok::is_valid_utf8(chat_template)) {
      return invalid_argument(gguf_key_error_prefix(file, kKeyChatTemplate) + " is not UTF-8");
    }
    c["chat_template"] = std::move(chat_template);
  }
  return c;
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> tokenizer_from_gguf(const GgufFile& file) {
  TESSERA_ASSIGN_OR_RETURN(std::string model, file.get_string(kKeyModel));
  if (model != "llama" && model != "gpt2") {
    return unimplemented(gguf_key_error_prefix(file, kKeyModel) + " is '" + model +
                         "', a vocabulary kind Tessera does not implement (supported: llama, gpt2)");
  }
  const bool spm = model == "llama";
  TESSERA_ASSIGN_OR_RETURN(GgufVocabArrays vocab, read_vocab_arrays(file, /*scores_required=*/spm));
  const size_t n = vocab.tokens.size();

  GgufVocabDefaults defaults;
  Json tokenizer_json;
  if (spm) {
    // llama.cpp's defaults for SentencePiece vocabularies.
    defaults.bos = 1;
    defaults.eos = 2;
    defaults.add_bos = true;
    TESSERA_ASSIGN_OR_RETURN(defaults.unk, read_special_id(file, "tokenizer.ggml.unknown_token_id", n, 0));
    TESSERA_ASSIGN_OR_RETURN(tokenizer_json, spm_tokenizer_json(file, vocab, defaults.unk));
  } else {
    TESSERA_ASSIGN_OR_RETURN(const BytePreSpec* pre, find_byte_pre_spec(file));
    defaults.add_bos = pre->add_bos;
    defaults.clean_spaces = pre->clean_spaces;
    TESSERA_ASSIGN_OR_RETURN(defaults.unk, read_special_id(file, "tokenizer.ggml.unknown_token_id", n, -1));
    TESSERA_ASSIGN_OR_RETURN(tokenizer_json, byte_bpe_tokenizer_json(file, vocab, *pre, defaults.unk));
  }
  TESSERA_ASSIGN_OR_RETURN(Json config_json, gguf_config_json(file, vocab, defaults));

  // The documents as built, not written out and parsed again (a fifth of the build's time).
  return Tokenizer::from_parsed(tokenizer_json, &config_json, file.path() + " (tokenizer.ggml.* metadata)");
}

}  // namespace tessera
