#include "common/tokenizer/decoder.h"

#include "common/string_util.h"

#include "common/tokenizer/regex.h"
#include "common/tokenizer/unicode_utils.h"

namespace tessera::tok {

int parse_byte_token(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = token[k];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return -1;
    }
    value = value * 16 + d;
  }
  return value;
}

namespace {

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const override {
    for (const auto& p : parts_) p->decode_chain(tokens, state);
  }
  bool unstable_tail(const std::string& last_token, const std::string& text) const override {
    for (const auto& p : parts_) {
      if (p->unstable_tail(last_token, text)) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// Byte-level tokens back to bytes, then one lossy UTF-8 conversion of the whole text.
class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      const size_t mark = bytes.size();
      bool all_mapped = true;
      size_t i = 0;
      while (i < t.size()) {
        const int b = byte_level_byte(next_code_point(t, i));
        if (b < 0) {
          all_mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      // A token with a char outside the table (an added token) is kept as it is.
      if (!all_mapped) {
        bytes.resize(mark);
        bytes.append(t);
      }
    }
    tokens.assign(1, to_valid_utf8(bytes));
    state.fused = true;
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool drop_first) : replacement_(std::move(replacement)), drop_first_(drop_first) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      // tokenizers drops every replacement char of the first token (the prefix it added).
      const bool drop = i == 0 && drop_first_ && !state.continuation;
      std::string& t = tokens[i];
      if (t.find(replacement_) == std::string::npos) continue;
      std::string out;
      size_t prev = 0;
      for (size_t pos = t.find(replacement_); pos != std::string::npos; pos = t.find(replacement_, prev)) {
        out.append(t, prev, pos - prev);
        if (!drop) out.push_back(' ');
        prev = pos + replacement_.size();
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool drop_first_;
};

class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    auto flush = [&]() {
      if (run.empty()) return;
      if (is_valid_utf8(run)) {
        out.push_back(run);
      } else {
        // tokenizers: an invalid run becomes one U+FFFD per byte.
        for (size_t k = 0; k < run.size(); ++k) out.emplace_back(kReplacementChar);
      }
      run.clear();
    };
    for (auto& t : tokens) {
      const int b = parse_byte_token(t);
      if (b >= 0) {
        run.push_back(static_cast<char>(b));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
  // A run of byte tokens is judged as a whole, so a later byte can turn it invalid.
  bool unstable_tail(const std::string& last_token, const std::string& text) const override {
    return parse_byte_token(last_token) >= 0;
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
    state.fused = true;
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const override {
    // On a fused text, the start belongs to the first window and the end to the last.
    const size_t start = state.fused && state.continuation ? 0 : start_;
    const size_t stop = state.fused && !state.at_end ? 0 : stop_;
    for (auto& t : tokens) {
      size_t begin = 0;
      for (size_t k = 0; k < start && t.compare(begin, content_.size(), content_) == 0; ++k) {
        begin += content_.size();
      }
      size_t end = t.size();
      for (size_t k = 0; k < stop && end >= begin + content_.size() &&
                         t.compare(end - content_.size(), content_.size(), content_) == 0;
           ++k) {
        end -= content_.size();
      }
      if (begin != 0 || end != t.size()) t = t.substr(begin, end - begin);
    }
  }
  bool unstable_tail(const std::string& last_token, const std::string& text) const override {
    return stop_ > 0 && text.size() >= content_.size() &&
           text.compare(text.size() - content_.size(), content_.size(), content_) == 0;
  }

 private:
  std::string content_;  // one character
  size_t start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(PatternSpec pattern, std::shared_ptr<const Regex> regex, std::string content)
      : pattern_(std::move(pattern)), regex_(std::move(regex)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const override {
    for (auto& t : tokens) {
      if (pattern_.is_regex) {
        t = regex_->replace_all(t, content_);
        continue;
      }
      t = replace_all(t, pattern_.text, content_);
    }
  }

 private:
  PatternSpec pattern_;
  std::shared_ptr<const Regex> regex_;
  std::string content_;
};

}  // namespace

StatusOr<std::unique_ptr<Decoder>> parse_decoder(const Json& j, const std::string& where) {
  TESSERA_ASSIGN_OR_RETURN(std::string type, get_type(j, where));
  if (type == "Sequence") {
    TESSERA_ASSIGN_OR_RETURN(const Json* list, get_array(j, "decoders", where));
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < list->size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(auto part, parse_decoder((*list)[i], where + ".decoders[" + std::to_string(i) + "]"));
      parts.push_back(std::move(part));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(parts)));
  }
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "Metaspace") {
    TESSERA_ASSIGN_OR_RETURN(std::string replacement, get_string_or(j, "replacement", where, "\xE2\x96\x81"));
    TESSERA_ASSIGN_OR_RETURN(bool add_prefix_space, get_bool_or(j, "add_prefix_space", where, true));
    TESSERA_ASSIGN_OR_RETURN(std::string scheme, get_string_or(j, "prepend_scheme", where, ""));
    if (!scheme.empty() && scheme != "always" && scheme != "first" && scheme != "never") {
      return invalid_argument(where + ".prepend_scheme: unknown value '" + scheme + "'");
    }
    const bool drop_first = scheme.empty() ? add_prefix_space : scheme != "never";
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(std::move(replacement), drop_first));
  }
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Strip") {
    TESSERA_ASSIGN_OR_RETURN(std::string content, get_string(j, "content", where));
    if (content.empty() || utf8_sequence_length(static_cast<unsigned char>(content[0])) != content.size()) {
      return invalid_argument(where + ".content: expected exactly one character");
    }
    TESSERA_ASSIGN_OR_RETURN(int64_t start, get_int_or(j, "start", where, 0));
    TESSERA_ASSIGN_OR_RETURN(int64_t stop, get_int_or(j, "stop", where, 0));
    if (start < 0 || stop < 0) return invalid_argument(where + ": start and stop must be non-negative");
    return std::unique_ptr<Decoder>(
        new StripDecoder(std::move(content), static_cast<size_t>(start), static_cast<size_t>(stop)));
  }
  if (type == "Replace") {
    TESSERA_ASSIGN_OR_RETURN(PatternSpec pattern, get_pattern(j, "pattern", where));
    TESSERA_ASSIGN_OR_RETURN(std::string content, get_string(j, "content", where));
    std::shared_ptr<const Regex> regex;
    if (pattern.is_regex) {
      TESSERA_ASSIGN_OR_RETURN(regex, compile_pattern(pattern, where + ".pattern"));
    }
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(pattern), std::move(regex), std::move(content)));
  }
  return unimplemented(where + ": unsupported decoder type '" + type + "'");
}

}  // namespace tessera::tok
