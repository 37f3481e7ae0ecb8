#include "common/tokenizer/normalizer.h"

#include "common/string_util.h"

#include <vector>

#include "common/tokenizer/unicode_utils.h"

namespace tessera::tok {
namespace {

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& text) const override {
    for (const auto& p : parts_) p->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalizationForm form) : form_(form) {}
  void normalize(std::string& text) const override {
    auto out = normalize_unicode(text, form_);
    if (out.is_ok()) text = std::move(out).value();
  }

 private:
  NormalizationForm form_;
};

// Prepends only to non-empty text, as tokenizers does.
class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(PatternSpec pattern, std::shared_ptr<const Regex> regex, std::string content)
      : pattern_(std::move(pattern)), regex_(std::move(regex)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    if (pattern_.is_regex) {
      text = regex_->replace_all(text, content_);
      return;
    }
    // Literal patterns skip the regex engine: Llama's " " -> "▁" runs over every prompt.
    text = replace_all(text, pattern_.text, content_);
  }

 private:
  PatternSpec pattern_;
  std::shared_ptr<const Regex> regex_;
  std::string content_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void normalize(std::string& text) const override { text = to_lowercase(text); }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      size_t i = 0;
      while (i < end) {
        size_t j = i;
        if (!is_whitespace(next_code_point(text, j))) break;
        i = j;
      }
      begin = i;
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t j = start;
        if (!is_whitespace(next_code_point(text, j))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

}  // namespace

StatusOr<std::unique_ptr<Normalizer>> parse_normalizer(const Json& j, const std::string& where) {
  TESSERA_ASSIGN_OR_RETURN(std::string type, get_type(j, where));
  if (type == "Sequence") {
    TESSERA_ASSIGN_OR_RETURN(const Json* list, get_array(j, "normalizers", where));
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list->size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(auto part,
                               parse_normalizer((*list)[i], where + ".normalizers[" + std::to_string(i) + "]"));
      parts.push_back(std::move(part));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(parts)));
  }
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalizationForm::kNfc));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalizationForm::kNfd));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalizationForm::kNfkc));
  if (type == "NFKD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalizationForm::kNfkd));
  if (type == "Prepend") {
    TESSERA_ASSIGN_OR_RETURN(std::string prefix, get_string(j, "prepend", where));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(prefix)));
  }
  if (type == "Replace") {
    TESSERA_ASSIGN_OR_RETURN(PatternSpec pattern, get_pattern(j, "pattern", where));
    TESSERA_ASSIGN_OR_RETURN(std::string content, get_string(j, "content", where));
    std::shared_ptr<const Regex> regex;
    if (pattern.is_regex) {
      TESSERA_ASSIGN_OR_RETURN(regex, compile_pattern(pattern, where + ".pattern"));
    }
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(pattern), std::move(regex), std::move(content)));
  }
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "Strip") {
    TESSERA_ASSIGN_OR_RETURN(bool left, get_bool_or(j, "strip_left", where, true));
    TESSERA_ASSIGN_OR_RETURN(bool right, get_bool_or(j, "strip_right", where, true));
    return std::unique_ptr<Normalizer>(new StripNormalizer(left, right));
  }
  return unimplemented(where + ": unsupported normalizer type '" + type + "'");
}

}  // namespace tessera::tok
