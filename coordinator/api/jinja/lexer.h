#pragma once
// The template lexer: splits a Jinja source into text and the tokens inside {{ }} and {% %}
// tags, applying Jinja2's whitespace rules the way transformers configures them
// (trim_blocks, lstrip_blocks, "-" and "+" modifiers, one trailing newline dropped, newlines
// normalised to \n). Tag ends inside brackets or string literals do not end a tag.
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tessera::jinja {

enum class TokenType { kText, kVariableBegin, kVariableEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOperator, kEnd };

struct Token {
  TokenType type;
  std::string text;  // text, name, operator, or a string literal's (unescaped) value
  int line = 1;
};

// A syntax error while lexing or parsing: the message names the construct and its line.
struct ParseError {
  StatusCode code;  // kInvalidArgument (malformed) or kUnimplemented (valid Jinja we refuse)
  std::string message;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Throws ParseError.
std::vector<Token> tokenize(std::string_view source, const LexOptions& options = {});

}  // namespace tessera::jinja
