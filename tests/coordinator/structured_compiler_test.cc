// The structured-output compilers (coordinator/api/grammars/): regex, JSON Schema and GBNF to
// the grammar IR, checked through the matcher on whole strings (TokenConstraint::matches),
// and every kind of bad input refused with a message naming the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/api/grammars/request_constraint.h"
#include "coordinator/engine/structured/token_constraint.h"

namespace tessera::structured {
namespace {

using json = nlohmann::ordered_json;

// A one-token vocabulary: matching whole strings needs no tokens.
std::shared_ptr<const TokenVocabulary> byte_vocabulary() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  return std::make_shared<const TokenVocabulary>(std::move(bytes));
}

TokenConstraint compiled(ConstraintKind kind, const json& value) {
  StatusOr<Grammar> g = compile_constraint(kind, value);
  EXPECT_TRUE(g.is_ok()) << value.dump() << ": " << g.status().to_string();
  if (!g.is_ok()) return TokenConstraint(std::move(compile_constraint(ConstraintKind::kChoice, json{"x"})).value(), byte_vocabulary());
  return TokenConstraint(std::move(g).value(), byte_vocabulary());
}

std::string refusal(ConstraintKind kind, const json& value) {
  StatusOr<Grammar> g = compile_constraint(kind, value);
  EXPECT_FALSE(g.is_ok()) << value.dump() << " compiled";
  return g.is_ok() ? "" : g.status().message();
}

TEST(StructuredRegex, MatchesExactlyTheFullStrings) {
  const TokenConstraint c = compiled(ConstraintKind::kRegex, "a[bc]+d?|x{2,3}");
  for (const char* yes : {"ab", "acbcd", "xx", "xxx"}) EXPECT_TRUE(c.matches(yes)) << yes;
  for (const char* no : {"", "a", "ad", "abdd", "x", "xxxx", "abx"}) EXPECT_FALSE(c.matches(no)) << no;
  const TokenConstraint anchored = compiled(ConstraintKind::kRegex, "^\\d{3}-[^-]+$");
  EXPECT_TRUE(anchored.matches("123-abc"));
  EXPECT_TRUE(anchored.matches("123-\xCE\xB1\xCE\xB2"));  // "αβ": a negated class takes any code point
  EXPECT_FALSE(anchored.matches("12-abc"));
  EXPECT_FALSE(anchored.matches("123-a-c"));
  const TokenConstraint greek = compiled(ConstraintKind::kRegex, "[\xCE\xB1-\xCF\x89]{2}");  // [α-ω]{2}
  EXPECT_TRUE(greek.matches("\xCE\xB1\xCF\x89"));
  EXPECT_FALSE(greek.matches("ab"));
  EXPECT_FALSE(greek.matches("\xCE\xB1"));
  const TokenConstraint dot = compiled(ConstraintKind::kRegex, "a.c");
  EXPECT_TRUE(dot.matches("a\xF0\x9F\x98\x80" "c"));  // an emoji is one '.'
  EXPECT_FALSE(dot.matches("a\nc"));
}

TEST(StructuredRegex, UnsupportedConstructsAreNamed) {
  EXPECT_NE(refusal(ConstraintKind::kRegex, "(a").find("missing ')'"), std::string::npos);
  EXPECT_NE(refusal(ConstraintKind::kRegex, "(a)\\1").find("backreferences"), std::string::npos);
  EXPECT_NE(refusal(ConstraintKind::kRegex, "(?=a)b").find("lookaround"), std::string::npos);
  EXPECT_NE(refusal(ConstraintKind::kRegex, "\\bword").find("word boundaries"), std::string::npos);
  EXPECT_NE(refusal(ConstraintKind::kRegex, "a{3,1}").find("max below min"), std::string::npos);
  EXPECT_NE(refusal(ConstraintKind::kRegex, "a^b").find("'^'"), std::string::npos);
  EXPECT_NE(refusal(ConstraintKind::kRegex, "\\p{L}").find("\\p{...}"), std::string::npos);
  EXPECT_NE(refusal(ConstraintKind::kRegex, "*a").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(refusal(ConstraintKind::kRegex, "[z-a]").find("out of order"), std::string::npos);
  EXPECT_NE(refusal(ConstraintKind::kRegex, "[^\\x00-\\uffff\\u0000-\\uffff]{0}x[^\\s\\S]").find("accepts no string"),
            std::string::npos);
}

TEST(StructuredChoice, OnlyTheChoices) {
  const TokenConstraint c = compiled(ConstraintKind::kChoice, json{"yes", "no", "maybe so"});
  EXPECT_TRUE(c.matches("yes"));
  EXPECT_TRUE(c.matches("maybe so"));
  EXPECT_FALSE(c.matches("ye"));
  EXPECT_FALSE(c.matches("yesno"));
  EXPECT_NE(refusal(ConstraintKind::kChoice, json::array()).find("non-empty"), std::string::npos);
  EXPECT_NE(refusal(ConstraintKind::kChoice, json{"a", 1}).find("strings"), std::string::npos);
}

TEST(StructuredSchema, IntegerBoundsAreExact) {
  struct Bounds {
    json schema;
    long lo, hi;
  };
  const std::vector<Bounds> cases = {
      {{{"type", "integer"}, {"minimum", 5}, {"maximum", 123}}, 5, 123},
      {{{"type", "integer"}, {"minimum", -42}, {"maximum", 7}}, -42, 7},
      {{{"type", "integer"}, {"exclusiveMinimum", -3}, {"exclusiveMaximum", 100}}, -2, 99},
      {{{"type", "integer"}, {"minimum", 10}}, 10, 100000},
      {{{"type", "integer"}, {"maximum", -10}}, -100000, -10},
      {{{"type", "integer"}, {"minimum", 0}, {"maximum", 0}}, 0, 0},
      {{{"type", "integer"}, {"minimum", 1.5}, {"maximum", 9.5}}, 2, 9},
  };
  for (const Bounds& b : cases) {
    const TokenConstraint c = compiled(ConstraintKind::kJsonSchema, b.schema);
    for (long v = -1200; v <= 1200; ++v) {
      const bool in = v >= b.lo && v <= b.hi;
      ASSERT_EQ(c.matches(std::to_string(v)), in) << b.schema.dump() << " value " << v;
    }
    EXPECT_FALSE(c.matches("-0")) << b.schema.dump();
    EXPECT_FALSE(c.matches("007")) << b.schema.dump();
  }
}

TEST(StructuredSchema, NumberBoundsHoldForEveryWrittenNumber) {
  const std::vector<json> schemas = {
      {{"type", "number"}, {"minimum", 0}, {"maximum", 1}},
      {{"type", "number"}, {"exclusiveMinimum", 0}, {"exclusiveMaximum", 1}},
      {{"type", "number"}, {"minimum", -2}, {"exclusiveMaximum", 3}},
      {{"type", "number"}, {"exclusiveMinimum", -5}, {"maximum", -1}},
      {{"type", "number"}, {"minimum", 10}},
  };
  std::vector<std::string> texts;
  for (const char* whole : {"-6", "-5", "-4", "-2", "-1", "-0", "0", "1", "2", "3", "4", "10", "11", "250"}) {
    texts.push_back(whole);
    for (const char* frac : {".0", ".5", ".25", ".999", ".000", ".001"}) texts.push_back(std::string(whole) + frac);
  }
  for (const json& s : schemas) {
    const TokenConstraint c = compiled(ConstraintKind::kJsonSchema, s);
    for (const std::string& t : texts) {
      if (!c.matches(t)) continue;
      const double v = std::stod(t);
      const bool in = (!s.contains("minimum") || v >= s["minimum"].get<double>()) &&
                      (!s.contains("maximum") || v <= s["maximum"].get<double>()) &&
                      (!s.contains("exclusiveMinimum") || v > s["exclusiveMinimum"].get<double>()) &&
                      (!s.contains("exclusiveMaximum") || v < s["exclusiveMaximum"].get<double>());
      EXPECT_TRUE(in) << s.dump() << " accepted " << t;
    }
    EXPECT_FALSE(c.matches("1e5")) << "bounded numbers are written without exponent";
  }
  const TokenConstraint unit = compiled(ConstraintKind::kJsonSchema, schemas[1]);
  EXPECT_TRUE(unit.matches("0.5"));
  EXPECT_FALSE(unit.matches("0"));
  EXPECT_FALSE(unit.matches("0.000"));
  EXPECT_FALSE(unit.matches("1"));
}

TEST(StructuredSchema, ObjectsArraysStringsAndRefs) {
  const json schema = json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 5},
      "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "minItems": 1, "maxItems": 2},
      "kind": {"const": "k"},
      "next": {"$ref": "#"},
      "when": {"type": "string", "format": "date"},
      "code": {"type": "string", "pattern": "^[A-Z]{2}\"$"}
    },
    "required": ["name", "tags"],
    "additionalProperties": false
  })");
  const TokenConstraint c = compiled(ConstraintKind::kJsonSchema, schema);
  EXPECT_TRUE(c.matches(R"({"name":"ab","tags":["a"]})"));
  EXPECT_TRUE(c.matches("{ \"name\": \"ab\",\n  \"tags\": [\"a\", 3], \"kind\": \"k\"}"));
  EXPECT_TRUE(c.matches(R"({"name":"a\"\u00e9","tags":["b"],"next":{"name":"x","tags":[3]}})"));
  EXPECT_TRUE(c.matches(R"({"name":"a","tags":["b"],"when":"2024-02-28","code":"AB\""})"));
  EXPECT_FALSE(c.matches(R"({"name":"","tags":["a"]})")) << "minLength";
  EXPECT_FALSE(c.matches(R"({"name":"abcdef","tags":["a"]})")) << "maxLength";
  EXPECT_FALSE(c.matches(R"({"name":"a","tags":[]})")) << "minItems";
  EXPECT_FALSE(c.matches(R"({"name":"a","tags":["a","a","a"]})")) << "maxItems";
  EXPECT_FALSE(c.matches(R"({"tags":["a"]})")) << "required";
  EXPECT_FALSE(c.matches(R"({"name":"a","tags":["a"],"extra":1})")) << "additionalProperties";
  EXPECT_FALSE(c.matches(R"({"name":"a","tags":["a"],"when":"2024-02-30"})")) << "date";
  EXPECT_FALSE(c.matches(R"({"name":"a","tags":["c"]})")) << "enum";
  EXPECT_FALSE(c.matches(R"({"name":"a","tags":["a"]} )")) << "nothing after the document";
  EXPECT_FALSE(c.matches(R"({"name":"a\x","tags":["a"]})")) << "bad escape";

  const TokenConstraint any = compiled(ConstraintKind::kJsonObject, nullptr);
  EXPECT_TRUE(any.matches(R"({"a":[1,2.5,-3e2,{"b":null}],"c":true,"d":"\n"})"));
  EXPECT_TRUE(any.matches("{}"));
  EXPECT_FALSE(any.matches("[1]")) << "json_object is an object";
  EXPECT_FALSE(any.matches(R"({"a":01})"));

  const TokenConstraint uuid = compiled(ConstraintKind::kJsonSchema, {{"type", "string"}, {"format", "uuid"}});
  EXPECT_TRUE(uuid.matches("\"123e4567-e89b-12d3-a456-426614174000\""));
  EXPECT_FALSE(uuid.matches("\"123e4567\""));
  const TokenConstraint any_of = compiled(
      ConstraintKind::kJsonSchema,
      json::parse(R"({"anyOf": [{"type": "null"}, {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "integer"}], "items": false}]})"));
  EXPECT_TRUE(any_of.matches("null"));
  EXPECT_TRUE(any_of.matches("[true, 7]"));
  EXPECT_FALSE(any_of.matches("[true]"));
  EXPECT_FALSE(any_of.matches("[true, 7, 8]"));
  const TokenConstraint all_of = compiled(
      ConstraintKind::kJsonSchema,
      json::parse(R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                              {"properties": {"b": {"type": "boolean"}}, "required": ["b"]}]})"));
  EXPECT_TRUE(all_of.matches(R"({"a":1,"b":true})"));
  EXPECT_FALSE(all_of.matches(R"({"a":1})"));
  EXPECT_FALSE(all_of.matches(R"({"a":1,"b":2})"));
}

// additionalProperties (true or a schema) beside properties: the listed properties in order,
// then extra members whose keys are none of the listed names (pydantic's extra="allow",
// dicts with some known keys).
TEST(StructuredSchema, AdditionalPropertiesBesideProperties) {
  const TokenConstraint open = compiled(ConstraintKind::kJsonSchema, json::parse(R"({"type": "object",
      "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"],
      "additionalProperties": {"type": "boolean"}})"));
  for (const char* yes : {R"({"a": 1})", R"({"a": 1, "b": "x"})", R"({"a": 1, "c": true})",
                          R"({"a": 1, "b": "x", "ab": false, "": true, "é": true})"})
    EXPECT_TRUE(open.matches(yes)) << yes;
  for (const char* no : {R"({"a": 1, "c": 2})", R"({"a": 1, "a": true})", R"({"a": 1, "b": true})",
                         R"({"c": true})", R"({"a": 1, "b": true})", R"({"a": 1, "c": true, "b": "x"})"})
    EXPECT_FALSE(open.matches(no)) << no;
  const TokenConstraint anything = compiled(ConstraintKind::kJsonSchema, json::parse(
      R"({"properties": {"name": {"type": "string"}}, "additionalProperties": true})"));
  for (const char* yes : {"{}", R"({"name": "n"})", R"({"x": [1, {"y": null}]})", R"({"name": "n", "names": 2})"})
    EXPECT_TRUE(anything.matches(yes)) << yes;
  for (const char* no : {R"({"name": 3})", R"({"x": 1, "name": "n"})", R"({"name": "n", "name": "m"})"})
    EXPECT_FALSE(anything.matches(no)) << no;
}

// Rules get numbered names per hint (hint, hint_2, ...), skipping names a GBNF grammar took;
// a schema of 1,600 properties (4,800 rules, under the 5,000 limit) compiles and matches (each
// new name scanned every rule per candidate before: minutes at a few thousand properties).
TEST(StructuredSchema, RuleNamesAndThousandsOfProperties) {
  GrammarBuilder g;
  const int user = g.rule("x_2");
  EXPECT_EQ(g.rule_name(g.new_rule("x")), "x");
  EXPECT_EQ(g.rule_name(g.new_rule("x")), "x_3");
  EXPECT_EQ(g.rule_name(g.new_rule("x")), "x_4");
  EXPECT_EQ(g.rule("x_2"), user);
  json schema = {{"type", "object"}, {"additionalProperties", false}};
  for (int i = 0; i < 1600; ++i) schema["properties"]["p" + std::to_string(i)] = {{"type", "null"}};
  schema["required"] = {"p1599"};
  const TokenConstraint many = compiled(ConstraintKind::kJsonSchema, schema);
  EXPECT_TRUE(many.matches(R"({"p7": null, "p1599": null})"));
  EXPECT_FALSE(many.matches(R"({"p7": null})"));
}

// "items" as an array: the tuple form of drafts 4 to 2019-09 (llama.cpp's grammar tests use
// it), "additionalItems" for what follows; the same grammar as prefixItems and items.
TEST(StructuredSchema, TupleFormOfItemsIsPrefixItems) {
  const TokenConstraint formats = compiled(ConstraintKind::kJsonSchema, json::parse(R"({"items": [
      {"format": "date"}, {"format": "uuid"}, {"format": "time"}, {"format": "date-time"}]})"));
  EXPECT_TRUE(formats.matches(R"(["2012-04-23", "12345678-1234-1234-1234-1234567890ab", "18:25:43.511Z", "2012-04-23T18:25:43.511Z"])"));
  EXPECT_FALSE(formats.matches(R"(["foo", "bar"])"));
  EXPECT_FALSE(formats.matches(R"(["12345678-1234-1234-1234-1234567890ab"])"));
  const TokenConstraint closed = compiled(ConstraintKind::kJsonSchema, json::parse(
      R"({"type": "array", "items": [{"type": "boolean"}], "additionalItems": {"type": "integer"}, "maxItems": 3})"));
  EXPECT_TRUE(closed.matches("[true]"));
  EXPECT_TRUE(closed.matches("[false, 1, 2]"));
  EXPECT_FALSE(closed.matches("[false, true]"));
  EXPECT_FALSE(closed.matches("[false, 1, 2, 3]"));
  const TokenConstraint none_after = compiled(ConstraintKind::kJsonSchema, json::parse(
      R"({"items": [{"type": "null"}], "additionalItems": false, "minItems": 1})"));
  EXPECT_TRUE(none_after.matches("[null]"));
  EXPECT_FALSE(none_after.matches("[null, null]"));
  EXPECT_NE(refusal(ConstraintKind::kJsonSchema, json::parse(R"({"items": [{}], "prefixItems": [{}]})"))
                .find("together with 'prefixItems'"), std::string::npos);
  EXPECT_NE(refusal(ConstraintKind::kJsonSchema, json::parse(R"({"items": {}, "additionalItems": false})"))
                .find("'additionalItems' applies only to 'items' given as an array"), std::string::npos);
}

TEST(StructuredSchema, BadSchemasAreRefusedNamingTheProblem) {
  auto msg = [](const char* schema) { return refusal(ConstraintKind::kJsonSchema, json::parse(schema)); };
  EXPECT_NE(msg(R"({"type": "array", "uniqueItems": true})").find("'uniqueItems'"), std::string::npos);
  EXPECT_NE(msg(R"({"type": "object", "properties": {"a": {"not": {}}}})").find("unsupported keyword 'not' at /properties/a"),
            std::string::npos);
  EXPECT_NE(msg(R"({"type": "strin"})").find("'type' must be one of"), std::string::npos);
  EXPECT_NE(msg(R"({"$ref": "#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(msg(R"({"$ref": "http://example.com/s.json"})").find("not a reference into this schema"), std::string::npos);
  EXPECT_NE(msg(R"({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]})").find("'oneOf'"), std::string::npos);
  EXPECT_NE(msg(R"({"type": "string", "pattern": "(a"})").find("missing ')'"), std::string::npos);
  EXPECT_NE(msg(R"({"type": "string", "format": "hostname"})").find("unsupported format 'hostname'"), std::string::npos);
  EXPECT_NE(msg(R"({"type": "integer", "minimum": 5, "maximum": 4})").find("allow no number"), std::string::npos);
  EXPECT_NE(msg(R"({"enum": []})").find("non-empty"), std::string::npos);
  EXPECT_NE(msg(R"(false)").find("accepts nothing"), std::string::npos);
  EXPECT_NE(msg(R"(7)").find("must be an object or a boolean"), std::string::npos);
  EXPECT_NE(msg(R"({"type": "object", "properties": {"a": {}}, "additionalProperties": 3})").find("/additionalProperties"),
            std::string::npos);
  EXPECT_NE(msg(R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})").find("accepts no string"),
            std::string::npos);
  EXPECT_NE(msg(R"({"type": "string", "maxLength": 5, "minLength": 6})").find("below 'minLength'"), std::string::npos);
  // additionalProperties judges only its own schema's properties: merging would change what it means.
  EXPECT_NE(msg(R"({"allOf": [{"properties": {"a": {}}}], "additionalProperties": false})").find("'allOf' where 'additionalProperties'"),
            std::string::npos);
}

TEST(StructuredGbnf, ParsesAndMatches) {
  const TokenConstraint c = compiled(ConstraintKind::kGrammar, R"(
    # a list of numbers
    root ::= "[" ws ( num ( "," ws num )* )? "]"
    num  ::= "-"? [0-9]+ ("." [0-9]{1,3})?
    ws   ::= [ \t\n]*
  )");
  EXPECT_TRUE(c.matches("[]"));
  EXPECT_TRUE(c.matches("[1,\t-2.5, 30.125]"));
  EXPECT_FALSE(c.matches("[1,]"));
  EXPECT_FALSE(c.matches("[1.2345]"));
  const TokenConstraint nested = compiled(ConstraintKind::kGrammar, "root ::= \"(\" root \")\" | \"x\"");
  EXPECT_TRUE(nested.matches("((x))"));
  EXPECT_FALSE(nested.matches("((x)"));
  const TokenConstraint escapes = compiled(ConstraintKind::kGrammar, "root ::= \"\\x41\\u00e9\\n\" [^a-z]");
  EXPECT_TRUE(escapes.matches("A\xC3\xA9\nZ"));
  EXPECT_FALSE(escapes.matches("A\xC3\xA9\nz"));
}

TEST(StructuredGbnf, BadGrammarsAreRefusedNamingTheRule) {
  auto msg = [](const char* g) { return refusal(ConstraintKind::kGrammar, g); };
  EXPECT_NE(msg("root ::= item\n").find("rule 'item' is used by rule 'root' but never defined"), std::string::npos);
  EXPECT_NE(msg("root ::= \"a\"\nspare ::= \"b\"\n").find("rule 'spare' is never used"), std::string::npos);
  EXPECT_NE(msg("start ::= \"a\"\n").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(msg("root ::= loop\nloop ::= \"x\" loop\n").find("accepts no string"), std::string::npos);
  EXPECT_NE(msg("root ::= root \"a\" | \"b\"\n").find("left-recursive (root -> root"), std::string::npos);
  EXPECT_NE(msg("root ::= \"a\" \n  | ]").find("grammar line 2:5"), std::string::npos);
  EXPECT_NE(msg("root ::= \"a\nroot2 ::= \"b\"").find("unterminated string"), std::string::npos);
  EXPECT_NE(msg("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
  EXPECT_NE(msg("root ::= \"a\"{2000}").find("over 1000"), std::string::npos);
}

}  // namespace
}  // namespace tessera::structured
