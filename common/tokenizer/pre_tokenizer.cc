#include "common/tokenizer/pre_tokenizer.h"

#include <algorithm>

#include "common/check.h"

#include "common/tokenizer/regex.h"
#include "common/tokenizer/unicode_utils.h"

namespace tessera::tok {
namespace {

// tokenizers' ByteLevel regex (GPT-2's pattern).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Rust regex's Unicode \w and \s, spelled out for PCRE2 (whose UCP \w differs for marks).
constexpr const char* kWordClass = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D})";
// char::is_ascii_punctuation() || char::is_punctuation()
constexpr const char* kPunctClass = R"([\p{P}\x{21}-\x{2F}\x{3A}-\x{40}\x{5B}-\x{60}\x{7B}-\x{7E}])";

std::shared_ptr<const Regex> must_compile(const std::string& pattern) {
  auto re = Regex::compile(pattern);
  TESSERA_CHECK(re.is_ok()) << re.status().to_string();
  return std::move(re).value();
}

}  // namespace

void split_piece(const Piece& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                 SplitBehavior behavior, bool invert, std::vector<Piece>& out) {
  const std::string& text = piece.text;
  if (text.empty()) return;
  // Every byte of the text as (range, is_match), gaps included.
  struct Span {
    size_t start, end;
    bool is_match;
  };
  std::vector<Span> spans;
  spans.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (const auto& [s, e] : matches) {
    if (prev != s) spans.push_back({prev, s, invert});
    spans.push_back({s, e, !invert});
    prev = e;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), invert});

  // (range, remove) after applying the behaviour.
  std::vector<Span> kept;
  kept.reserve(spans.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (auto sp : spans) kept.push_back({sp.start, sp.end, false});
      break;
    case SplitBehavior::kRemoved:
      kept = spans;
      break;
    case SplitBehavior::kContiguous: {
      bool have_prev = false, prev_match = false;
      for (auto sp : spans) {
        if (have_prev && sp.is_match == prev_match && !kept.empty()) {
          kept.back().end = sp.end;
        } else {
          kept.push_back({sp.start, sp.end, false});
        }
        have_prev = true;
        prev_match = sp.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (auto sp : spans) {
        if (sp.is_match && !prev_match && !kept.empty()) {
          kept.back().end = sp.end;
        } else {
          kept.push_back({sp.start, sp.end, false});
        }
        prev_match = sp.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev_match = false;
      for (size_t k = spans.size(); k-- > 0;) {
        const auto sp = spans[k];
        if (sp.is_match && !prev_match && !kept.empty()) {
          kept.back().start = sp.start;
        } else {
          kept.push_back({sp.start, sp.end, false});
        }
        prev_match = sp.is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
  }
  for (const auto& sp : kept) {
    if (sp.is_match || sp.end == sp.start) continue;  // removed, or empty
    out.push_back(Piece{text.substr(sp.start, sp.end - sp.start), piece.at_origin && sp.start == 0});
  }
}

namespace {

class RegexSplitter : public PreTokenizer {
 public:
  RegexSplitter(std::shared_ptr<const Regex> re, SplitBehavior behavior, bool invert)
      : re_(std::move(re)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size() * 4);
    std::vector<std::pair<size_t, size_t>> matches;
    for (const auto& p : pieces) {
      matches.clear();
      re_->find_all(p.text, matches);
      split_piece(p, matches, behavior_, invert_, out);
    }
    pieces = std::move(out);
  }

 private:
  std::shared_ptr<const Regex> re_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), regex_(use_regex ? must_compile(kGpt2Pattern) : nullptr) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> split;
    split.reserve(pieces.size() * 4);
    std::vector<std::pair<size_t, size_t>> matches;
    for (auto& p : pieces) {
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, " ");
      if (regex_ == nullptr) {
        if (!p.text.empty()) split.push_back(std::move(p));
        continue;
      }
      matches.clear();
      regex_->find_all(p.text, matches);
      split_piece(p, matches, SplitBehavior::kIsolated, false, split);
    }
    // Every byte becomes its printable stand-in, the alphabet byte-level vocabularies use.
    const auto& chars = byte_level_chars();
    for (auto& p : split) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (unsigned char b : p.text) mapped.append(chars[b]);
      p.text = std::move(mapped);
    }
    pieces = std::move(split);
  }

  void for_each_word(Piece piece, const std::function<void(std::string_view)>& emit) const override {
    std::string& text = piece.text;
    if (add_prefix_space_ && (text.empty() || text[0] != ' ')) text.insert(0, " ");
    const auto& chars = byte_level_chars();
    std::string mapped;
    auto emit_range = [&](size_t s, size_t e) {
      if (s == e) return;
      mapped.clear();
      for (size_t k = s; k < e; ++k) mapped.append(chars[static_cast<unsigned char>(text[k])]);
      emit(mapped);
    };
    if (regex_ == nullptr) {
      emit_range(0, text.size());
      return;
    }
    // Isolated split: matches and the gaps between them are words.
    std::vector<std::pair<size_t, size_t>> matches;
    regex_->find_all(text, matches);
    size_t prev = 0;
    for (const auto& [s, e] : matches) {
      emit_range(prev, s);
      emit_range(s, e);
      prev = e;
    }
    emit_range(prev, text.size());
  }

 private:
  bool add_prefix_space_;
  std::shared_ptr<const Regex> regex_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size());
    for (auto& p : pieces) {
      std::string text;
      text.reserve(p.text.size() + p.text.size() / 4 + replacement_.size());
      for (char c : p.text) {
        if (c == ' ') {
          text.append(replacement_);
        } else {
          text.push_back(c);
        }
      }
      const bool starts = text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && p.at_origin))) {
        text.insert(0, replacement_);
      }
      if (!split_) {
        if (!text.empty()) out.push_back(Piece{std::move(text), p.at_origin});
        continue;
      }
      std::vector<std::pair<size_t, size_t>> matches;
      for (size_t pos = text.find(replacement_); pos != std::string::npos;
           pos = text.find(replacement_, pos + replacement_.size())) {
        matches.emplace_back(pos, pos + replacement_.size());
      }
      split_piece(Piece{std::move(text), p.at_origin}, matches, SplitBehavior::kMergedWithNext, false, out);
    }
    pieces = std::move(out);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }
  void for_each_word(Piece piece, const std::function<void(std::string_view)>& emit) const override {
    if (parts_.empty()) {
      if (!piece.text.empty()) emit(piece.text);
      return;
    }
    std::vector<Piece> pieces;
    pieces.push_back(std::move(piece));
    for (size_t k = 0; k + 1 < parts_.size(); ++k) parts_[k]->pre_tokenize(pieces);
    for (auto& p : pieces) parts_.back()->for_each_word(std::move(p), emit);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

StatusOr<SplitBehavior> parse_behavior(const Json& j, const std::string& where, SplitBehavior fallback) {
  auto it = j.find("behavior");
  if (it == j.end() || it->is_null()) return fallback;
  const std::string name = it->is_string() ? it->get<std::string>() : "";
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return invalid_argument(where + ".behavior: unknown split behavior '" + (it->is_string() ? name : it->dump()) + "'");
}

std::unique_ptr<PreTokenizer> regex_splitter(const std::string& pattern, SplitBehavior b, bool invert) {
  return std::make_unique<RegexSplitter>(must_compile(pattern), b, invert);
}

}  // namespace

StatusOr<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const Json& j, const std::string& where) {
  TESSERA_ASSIGN_OR_RETURN(std::string type, get_type(j, where));
  if (type == "Sequence") {
    TESSERA_ASSIGN_OR_RETURN(const Json* list, get_array(j, "pretokenizers", where));
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list->size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(
          auto part, parse_pre_tokenizer((*list)[i], where + ".pretokenizers[" + std::to_string(i) + "]"));
      parts.push_back(std::move(part));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(parts)));
  }
  if (type == "ByteLevel") {
    TESSERA_ASSIGN_OR_RETURN(bool add_prefix_space, get_bool_or(j, "add_prefix_space", where, true));
    TESSERA_ASSIGN_OR_RETURN(bool use_regex, get_bool_or(j, "use_regex", where, true));
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(add_prefix_space, use_regex));
  }
  if (type == "Split") {
    TESSERA_ASSIGN_OR_RETURN(PatternSpec pattern, get_pattern(j, "pattern", where));
    TESSERA_ASSIGN_OR_RETURN(SplitBehavior behavior, parse_behavior(j, where, SplitBehavior::kIsolated));
    TESSERA_ASSIGN_OR_RETURN(bool invert, get_bool_or(j, "invert", where, false));
    if (!pattern.is_regex && pattern.text.empty()) {
      // tokenizers: an empty string pattern matches nothing.
      return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer({}));
    }
    TESSERA_ASSIGN_OR_RETURN(auto re, compile_pattern(pattern, where + ".pattern"));
    return std::unique_ptr<PreTokenizer>(new RegexSplitter(std::move(re), behavior, invert));
  }
  if (type == "Metaspace") {
    TESSERA_ASSIGN_OR_RETURN(std::string replacement, get_string_or(j, "replacement", where, "\xE2\x96\x81"));
    if (replacement.empty() || utf8_sequence_length(static_cast<unsigned char>(replacement[0])) != replacement.size()) {
      return invalid_argument(where + ".replacement: expected exactly one character");
    }
    // Older files say add_prefix_space; newer ones prepend_scheme (which wins).
    TESSERA_ASSIGN_OR_RETURN(bool add_prefix_space, get_bool_or(j, "add_prefix_space", where, true));
    PrependScheme scheme = add_prefix_space ? PrependScheme::kAlways : PrependScheme::kNever;
    TESSERA_ASSIGN_OR_RETURN(std::string scheme_name, get_string_or(j, "prepend_scheme", where, ""));
    if (scheme_name == "always") {
      scheme = PrependScheme::kAlways;
    } else if (scheme_name == "first") {
      scheme = PrependScheme::kFirst;
    } else if (scheme_name == "never") {
      scheme = PrependScheme::kNever;
    } else if (!scheme_name.empty()) {
      return invalid_argument(where + ".prepend_scheme: unknown value '" + scheme_name + "'");
    }
    TESSERA_ASSIGN_OR_RETURN(bool split, get_bool_or(j, "split", where, true));
    return std::unique_ptr<PreTokenizer>(new MetaspacePreTokenizer(std::move(replacement), scheme, split));
  }
  if (type == "Digits") {
    TESSERA_ASSIGN_OR_RETURN(bool individual, get_bool_or(j, "individual_digits", where, false));
    return regex_splitter(individual ? R"(\p{N})" : R"(\p{N}+)", SplitBehavior::kIsolated, false);
  }
  if (type == "Punctuation") {
    TESSERA_ASSIGN_OR_RETURN(SplitBehavior behavior, parse_behavior(j, where, SplitBehavior::kIsolated));
    return regex_splitter(kPunctClass, behavior, false);
  }
  if (type == "WhitespaceSplit") {
    return regex_splitter(R"(\p{White_Space}+)", SplitBehavior::kRemoved, false);
  }
  if (type == "Whitespace") {
    const std::string w = kWordClass;
    return regex_splitter("[" + w + "]+|[^" + w + R"(\p{White_Space}]+)", SplitBehavior::kRemoved, true);
  }
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    parts.push_back(regex_splitter(R"(\p{White_Space}+)", SplitBehavior::kRemoved, false));
    parts.push_back(regex_splitter(kPunctClass, SplitBehavior::kIsolated, false));
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(parts)));
  }
  return unimplemented(where + ": unsupported pre_tokenizer type '" + type + "'");
}

}  // namespace tessera::tok
