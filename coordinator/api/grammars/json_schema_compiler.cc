#include "coordinator/api/grammars/json_schema_compiler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "coordinator/engine/structured/codepoint_set.h"
#include "coordinator/api/grammars/json_key_grammar.h"
#include "coordinator/api/grammars/number_grammar.h"
#include "coordinator/api/grammars/regex_compiler.h"

namespace tessera::structured {

using json = nlohmann::ordered_json;
using Node = GrammarBuilder::Node;

namespace {

// Keywords that describe and constrain nothing.
const std::set<std::string> kAnnotations = {"title",    "description", "$schema",  "$id",       "$comment",
                                            "examples", "default",     "deprecated", "readOnly", "writeOnly",
                                            "$defs",    "definitions"};
const std::set<std::string> kKeywords = {
    "type",      "enum",      "const",     "anyOf",     "oneOf",           "allOf",       "$ref",
    "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",   "maxItems",
    "minLength", "maxLength", "pattern",   "format",    "minimum",         "maximum",     "exclusiveMinimum",
    "exclusiveMaximum", "uniqueItems", "additionalItems"};
const std::set<std::string> kTypes = {"object", "array", "string", "integer", "number", "boolean", "null"};

// The format regexes (each a subset of what ajv-formats' full mode accepts).
const std::map<std::string, std::string> kFormats = {
    {"date", "\\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))"},
    {"time", "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,6})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)"},
    {"date-time",
     "\\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))"
     "T([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,6})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)"},
    {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
    {"email", "[a-z0-9]{1,32}(\\.[a-z0-9]{1,32}){0,3}@[a-z0-9]{1,32}(\\.[a-z0-9]{1,32}){1,3}"},
    {"ipv4", "(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)(\\.(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)){3}"},
};

constexpr int kMaxDepth = 64;
constexpr int kMaxUnrolledItems = 1000;

class SchemaCompiler {
 public:
  SchemaCompiler(GrammarBuilder& g, const json& root) : g_(g), root_(root) {}

  StatusOr<int> compile_root() {
    const int rule = g_.new_rule("root");
    Node body = schema(root_, "", 0);
    if (!error_.empty()) return Status(StatusCode::kInvalidArgument, error_);
    g_.define(rule, body);
    return rule;
  }

  int object_any_rule() {
    value_rule();
    return object_any_;
  }

 private:
  void fail(const std::string& path, const std::string& what) {
    if (error_.empty()) error_ = what + " at " + (path.empty() ? std::string("the schema root") : path);
  }

  Node ws() {
    if (ws_ < 0) {
      ws_ = g_.new_rule("ws");
      Node indent = g_.repeat(g_.alt({g_.literal(" "), g_.literal("\t")}), 0, 20);
      g_.define(ws_, g_.alt({g_.empty(), g_.literal(" "), g_.seq({g_.literal("\n"), indent})}));
    }
    return g_.ref(ws_);
  }
  Node sep() { return g_.seq({ws(), g_.literal(","), ws()}); }

  // One character of a JSON string: any code point but '"', '\' and controls, or an escape
  // (\uXXXX never a surrogate, so lengths count as validators count them).
  Node string_char() {
    if (char_ < 0) {
      char_ = g_.new_rule("char");
      CodepointSet plain = CodepointSet::of(0x20, kMaxCodepoint).minus(CodepointSet::of('"', '"'));
      plain = plain.minus(CodepointSet::of('\\', '\\'));
      ByteSet simple;
      for (char c : std::string("\"\\/bfnrt")) simple.set(static_cast<uint8_t>(c));
      ByteSet hex;
      for (char c : std::string("0123456789abcdefABCDEF")) hex.set(static_cast<uint8_t>(c));
      ByteSet hex_no_d = hex;
      hex_no_d.reset('d');
      hex_no_d.reset('D');
      Node unicode = g_.seq({g_.literal("u"),
                             g_.alt({g_.seq({g_.bytes(hex_no_d), g_.repeat(g_.bytes(hex), 3, 3)}),
                                     g_.seq({g_.bytes([] { ByteSet d; d.set('d'); d.set('D'); return d; }()),
                                             g_.byte_range('0', '7'), g_.repeat(g_.bytes(hex), 2, 2)})})});
      g_.define(char_, g_.alt({utf8_class(g_, plain), g_.seq({g_.literal("\\"), g_.alt({g_.bytes(simple), unicode})})}));
    }
    return g_.ref(char_);
  }

  Node any_string() {
    if (string_ < 0) {
      string_ = g_.new_rule("string");
      g_.define(string_, g_.seq({g_.literal("\""), g_.star(string_char()), g_.literal("\"")}));
    }
    return g_.ref(string_);
  }

  Node value_rule() {
    if (value_ < 0) {
      value_ = g_.new_rule("value");
      object_any_ = g_.new_rule("object");
      const int array = g_.new_rule("array");
      const int member = g_.new_rule("member");
      g_.define(member, g_.seq({any_string(), ws(), g_.literal(":"), ws(), g_.ref(value_)}));
      g_.define(object_any_, g_.seq({g_.literal("{"), ws(),
                                     g_.optional(g_.seq({g_.ref(member), g_.star(g_.seq({sep(), g_.ref(member)})), ws()})),
                                     g_.literal("}")}));
      g_.define(array, g_.seq({g_.literal("["), ws(),
                               g_.optional(g_.seq({g_.ref(value_), g_.star(g_.seq({sep(), g_.ref(value_)})), ws()})),
                               g_.literal("]")}));
      g_.define(value_, g_.alt({g_.ref(object_any_), g_.ref(array), any_string(), any_number(g_), g_.literal("true"),
                                g_.literal("false"), g_.literal("null")}));
    }
    return g_.ref(value_);
  }

  // The schema a "$ref" names (only "#..." JSON pointers into this document).
  const json* resolve(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#') {
      fail(path + "/$ref", "'$ref' '" + ref + "' is not a reference into this schema ('#', '#/$defs/name')");
      return nullptr;
    }
    try {
      const json::json_pointer ptr(ref.substr(1));
      if (!root_.contains(ptr)) {
        fail(path + "/$ref", "'$ref' '" + ref + "' does not resolve");
        return nullptr;
      }
      return &root_.at(ptr);
    } catch (const json::exception&) {
      fail(path + "/$ref", "'$ref' '" + ref + "' is not a valid JSON pointer");
      return nullptr;
    }
  }

  Node ref_node(const std::string& ref, const std::string& path, int depth) {
    auto it = ref_rules_.find(ref);
    if (it != ref_rules_.end()) return g_.ref(it->second);
    const json* target = resolve(ref, path);
    if (target == nullptr) return g_.empty();
    const int rule = g_.new_rule("ref");
    ref_rules_[ref] = rule;
    g_.define(rule, schema(*target, ref.substr(1), depth + 1));
    return g_.ref(rule);
  }

  static bool constrains(const std::string& key) { return kAnnotations.count(key) == 0; }

  // allOf's merge of two schemas (objects), or an error naming the keyword they disagree on.
  json merge(const json& a, const json& b, const std::string& path, int depth) {
    if (depth > kMaxDepth) {
      fail(path, "'allOf' nests too deeply");
      return json::object();
    }
    // additionalProperties only sees the properties of its own schema object: a closed side
    // cannot take the other side's properties by merging (JSON Schema would refuse them).
    for (const auto& [closed, other] : {std::pair<const json*, const json*>{&a, &b}, {&b, &a}}) {
      auto ap = closed->find("additionalProperties");
      auto props = other->find("properties");
      if (ap == closed->end() || (ap->is_boolean() && ap->get<bool>()) || props == other->end() || !props->is_object()) continue;
      for (auto p = props->begin(); p != props->end(); ++p) {
        auto own = closed->find("properties");
        if (own == closed->end() || !own->is_object() || !own->contains(p.key())) {
          fail(path, "'allOf' where 'additionalProperties' of one schema would have to judge property '" + p.key() +
                         "' of another is not supported");
          return json::object();
        }
      }
    }
    json out = a;
    for (auto it = b.begin(); it != b.end(); ++it) {
      const std::string& k = it.key();
      if (!out.contains(k) || !constrains(k)) {
        if (!out.contains(k)) out[k] = *it;
        continue;
      }
      json& have = out[k];
      if (have == *it) continue;
      if (k == "required" && have.is_array() && it->is_array()) {
        for (const json& r : *it)
          if (std::find(have.begin(), have.end(), r) == have.end()) have.push_back(r);
      } else if (k == "properties" && have.is_object() && it->is_object()) {
        for (auto p = it->begin(); p != it->end(); ++p) {
          have[p.key()] = have.contains(p.key()) ? json{{"allOf", json::array({have[p.key()], *p})}} : *p;
        }
      } else if (k == "type") {
        auto as_set = [](const json& t) {
          std::set<std::string> s;
          if (t.is_string()) s.insert(t.get<std::string>());
          if (t.is_array())
            for (const json& x : t)
              if (x.is_string()) s.insert(x.get<std::string>());
          return s;
        };
        std::set<std::string> x = as_set(have), y = as_set(*it);
        json both = json::array();
        for (const std::string& t : x) {
          if (y.count(t) || (t == "integer" && y.count("number"))) both.push_back(t);
          else if (t == "number" && y.count("integer")) both.push_back("integer");
        }
        if (both.empty()) fail(path, "'allOf' branches allow no common 'type'");
        have = both;
      } else if ((k == "minimum" || k == "minLength" || k == "minItems") && have.is_number() && it->is_number()) {
        have = std::max(have.get<double>(), it->get<double>());
      } else if ((k == "maximum" || k == "maxLength" || k == "maxItems") && have.is_number() && it->is_number()) {
        have = std::min(have.get<double>(), it->get<double>());
      } else {
        fail(path, "'allOf' branches with different '" + k + "' are not supported");
      }
    }
    return out;
  }

  // A branch of allOf/anyOf/oneOf as an object, "$ref" resolved (one level).
  json branch_object(const json& b, const std::string& path) {
    if (b.is_boolean()) {
      if (!b.get<bool>()) fail(path, "a 'false' schema accepts nothing");
      return json::object();
    }
    if (!b.is_object()) {
      fail(path, "a schema must be an object or a boolean");
      return json::object();
    }
    if (b.contains("$ref") && b["$ref"].is_string()) {
      const json* t = resolve(b["$ref"].get<std::string>(), path);
      if (t == nullptr) return json::object();
      json rest = b;
      rest.erase("$ref");
      json target = t->is_boolean() ? json::object() : *t;
      if (!target.is_object()) {
        fail(path, "'$ref' target is not a schema");
        return json::object();
      }
      return merge(target, rest, path, 0);
    }
    return b;
  }

  Node schema(const json& s, const std::string& path, int depth) {
    if (!error_.empty()) return g_.empty();
    if (depth > kMaxDepth) {
      fail(path, "the schema nests more than " + std::to_string(kMaxDepth) + " levels");
      return g_.empty();
    }
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(path, "a 'false' schema accepts nothing");
      return value_rule();
    }
    if (!s.is_object()) {
      fail(path, "a schema must be an object or a boolean");
      return g_.empty();
    }
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (kAnnotations.count(it.key()) == 0 && kKeywords.count(it.key()) == 0) {
        fail(path, "unsupported keyword '" + it.key() + "'");
        return g_.empty();
      }
    }
    json siblings = json::object();  // constraining keywords other than the combinator at hand
    auto siblings_without = [&](std::initializer_list<const char*> skip) {
      json out = json::object();
      for (auto it = s.begin(); it != s.end(); ++it) {
        if (!constrains(it.key())) continue;
        if (std::any_of(skip.begin(), skip.end(), [&](const char* k) { return it.key() == k; })) continue;
        out[it.key()] = *it;
      }
      return out;
    };
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) {
        fail(path + "/$ref", "'$ref' must be a string");
        return g_.empty();
      }
      siblings = siblings_without({"$ref"});
      if (siblings.empty()) return ref_node(s["$ref"].get<std::string>(), path, depth);
      return schema(branch_object(s, path), path, depth + 1);
    }
    if (s.contains("allOf")) {
      const json& all = s["allOf"];
      if (!all.is_array() || all.empty()) {
        fail(path + "/allOf", "'allOf' must be a non-empty array of schemas");
        return g_.empty();
      }
      json merged = siblings_without({"allOf"});
      for (size_t i = 0; i < all.size(); ++i)
        merged = merge(merged, branch_object(all[i], path + "/allOf/" + std::to_string(i)), path + "/allOf", depth);
      return schema(merged, path, depth + 1);
    }
    for (const char* comb : {"anyOf", "oneOf"}) {
      if (!s.contains(comb)) continue;
      const json& list = s[comb];
      const std::string where = path + "/" + comb;
      if (!list.is_array() || list.empty()) {
        fail(where, std::string("'") + comb + "' must be a non-empty array of schemas");
        return g_.empty();
      }
      siblings = siblings_without({comb});
      std::vector<json> branches;
      std::vector<Node> alts;
      for (size_t i = 0; i < list.size(); ++i) {
        const std::string bp = where + "/" + std::to_string(i);
        json b = siblings.empty() ? list[i] : merge(siblings, branch_object(list[i], bp), bp, depth);
        if (comb == std::string("oneOf")) branches.push_back(branch_object(b, bp));
        alts.push_back(schema(b, bp, depth + 1));
      }
      if (comb == std::string("oneOf")) check_disjoint(branches, where);
      return g_.alt(std::move(alts));
    }
    if (s.contains("enum") || s.contains("const")) return literals(s, path);
    return typed(s, path, depth);
  }

  // The JSON types a literal, or a branch, can take ("" = any).
  static std::set<std::string> types_of(const json& b) {
    std::set<std::string> out;
    auto add_value = [&](const json& v) {
      out.insert(v.is_object() ? "object" : v.is_array() ? "array" : v.is_string() ? "string"
                 : v.is_boolean() ? "boolean" : v.is_null() ? "null" : "number");
    };
    if (b.contains("const")) {
      add_value(b["const"]);
    } else if (b.contains("enum") && b["enum"].is_array()) {
      for (const json& v : b["enum"]) add_value(v);
    } else if (b.contains("type")) {
      const json& t = b["type"];
      if (t.is_string()) out.insert(t.get<std::string>() == "integer" ? "number" : t.get<std::string>());
      if (t.is_array())
        for (const json& x : t)
          if (x.is_string()) out.insert(x.get<std::string>() == "integer" ? "number" : x.get<std::string>());
    } else {
      out.insert("");
    }
    return out;
  }

  // oneOf is compiled as anyOf, which is only right when no document can match two
  // branches: the branches must differ in type, or be distinct literals.
  void check_disjoint(const std::vector<json>& branches, const std::string& path) {
    for (size_t i = 0; i < branches.size(); ++i) {
      for (size_t j = i + 1; j < branches.size(); ++j) {
        const bool literal_i = branches[i].contains("const") || branches[i].contains("enum");
        const bool literal_j = branches[j].contains("const") || branches[j].contains("enum");
        if (literal_i && literal_j) {
          json vi = branches[i].contains("const") ? json::array({branches[i]["const"]}) : branches[i]["enum"];
          json vj = branches[j].contains("const") ? json::array({branches[j]["const"]}) : branches[j]["enum"];
          bool overlap = false;
          for (const json& v : vi) overlap = overlap || std::find(vj.begin(), vj.end(), v) != vj.end();
          if (!overlap) continue;
        } else {
          std::set<std::string> ti = types_of(branches[i]), tj = types_of(branches[j]);
          bool overlap = ti.count("") || tj.count("");
          for (const std::string& t : ti) overlap = overlap || tj.count(t);
          if (!overlap) continue;
        }
        fail(path, "'oneOf' branches " + std::to_string(i) + " and " + std::to_string(j) +
                       " may both match one document, which is not supported (give them different types or "
                       "distinct const values, or use 'anyOf')");
        return;
      }
    }
  }

  Node literals(const json& s, const std::string& path) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (constrains(it.key()) && it.key() != "enum" && it.key() != "const" && it.key() != "type") {
        fail(path, "'" + it.key() + "' together with 'enum' or 'const' is not supported");
        return g_.empty();
      }
    }
    std::vector<json> values;
    if (s.contains("const")) values.push_back(s["const"]);
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) {
        fail(path + "/enum", "'enum' must be a non-empty array");
        return g_.empty();
      }
      for (const json& v : s["enum"])
        if (!s.contains("const") || v == s["const"]) values.push_back(v);
    }
    std::set<std::string> allowed;
    if (s.contains("type")) {
      json t = s["type"].is_array() ? s["type"] : json::array({s["type"]});
      for (const json& x : t)
        if (x.is_string()) allowed.insert(x.get<std::string>());
    }
    std::vector<Node> alts;
    for (const json& v : values) {
      if (!allowed.empty()) {
        const std::string t = types_of(json{{"const", v}}).begin()->c_str();
        const bool is_int = v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
        if (!allowed.count(t) && !(t == "number" && is_int && allowed.count("integer"))) continue;
      }
      alts.push_back(g_.literal(v.dump()));
    }
    if (alts.empty()) fail(path, "no 'enum'/'const' value is of the schema's 'type'");
    return g_.alt(std::move(alts));
  }

  Node typed(const json& s, const std::string& path, int depth) {
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      json list = t.is_array() ? t : json::array({t});
      for (const json& x : list) {
        if (!x.is_string() || kTypes.count(x.get<std::string>()) == 0) {
          fail(path + "/type", "'type' must be one of object, array, string, integer, number, boolean, null (or a list)");
          return g_.empty();
        }
        types.push_back(x.get<std::string>());
      }
      if (types.empty()) {
        fail(path + "/type", "'type' is an empty list");
        return g_.empty();
      }
    } else {
      auto any = [&](std::initializer_list<const char*> keys) {
        return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.contains(k); });
      };
      if (any({"properties", "required", "additionalProperties"})) types.push_back("object");
      if (any({"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"})) types.push_back("array");
      if (any({"minLength", "maxLength", "pattern", "format"})) types.push_back("string");
      if (any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.push_back("number");
      if (types.empty()) return value_rule();
    }
    const bool has_number = std::find(types.begin(), types.end(), "number") != types.end();
    std::vector<Node> alts;
    for (const std::string& t : types) {
      if (t == "object") alts.push_back(object(s, path, depth));
      else if (t == "array") alts.push_back(array(s, path, depth));
      else if (t == "string") alts.push_back(string(s, path));
      else if (t == "number") alts.push_back(number(s, path, false));
      else if (t == "integer" && !has_number) alts.push_back(number(s, path, true));
      else if (t == "boolean") alts.push_back(g_.alt({g_.literal("true"), g_.literal("false")}));
      else if (t == "null") alts.push_back(g_.literal("null"));
    }
    return g_.alt(std::move(alts));
  }

  std::optional<int64_t> count_keyword(const json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    const json& v = s[key];
    if (!v.is_number() || v.get<double>() < 0 || std::floor(v.get<double>()) != v.get<double>()) {
      fail(path + "/" + key, std::string("'") + key + "' must be a non-negative integer");
      return std::nullopt;
    }
    return static_cast<int64_t>(std::min(v.get<double>(), 1e9));
  }

  Node object(const json& s, const std::string& path, int depth) {
    std::vector<std::pair<std::string, const json*>> props;
    static const json kAny = true;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) {
        fail(path + "/properties", "'properties' must be an object");
        return g_.empty();
      }
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) props.emplace_back(it.key(), &*it);
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) {
        fail(path + "/required", "'required' must be an array of strings");
        return g_.empty();
      }
      for (const json& r : s["required"]) {
        if (!r.is_string()) {
          fail(path + "/required", "'required' must be an array of strings");
          return g_.empty();
        }
        required.insert(r.get<std::string>());
        if (std::none_of(props.begin(), props.end(), [&](const auto& p) { return p.first == r.get<std::string>(); }))
          props.emplace_back(r.get<std::string>(), &kAny);
      }
    }
    const json* additional = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    const bool closed = additional != nullptr && additional->is_boolean() && !additional->get<bool>();
    if (props.empty() && !closed) {  // a map: any keys, values under additionalProperties
      Node value = additional == nullptr ? value_rule() : schema(*additional, path + "/additionalProperties", depth + 1);
      const int member = g_.new_rule("member");
      g_.define(member, g_.seq({any_string(), ws(), g_.literal(":"), ws(), value}));
      return g_.seq({g_.literal("{"), ws(),
                     g_.optional(g_.seq({g_.ref(member), g_.star(g_.seq({sep(), g_.ref(member)})), ws()})),
                     g_.literal("}")});
    }
    // Properties in schema order. rest(i): the properties from i on, each after a comma;
    // first(i): the same where none was written yet.
    const size_t n = props.size();
    std::vector<Node> prop(n);
    for (size_t i = 0; i < n; ++i) {
      const std::string& name = props[i].first;
      Node value = schema(*props[i].second, path + "/properties/" + name, depth + 1);
      const int rule = g_.new_rule("prop");
      g_.define(rule, g_.seq({g_.literal("\"" + json_escape(name) + "\""), ws(), g_.literal(":"), ws(), value}));
      prop[i] = g_.ref(rule);
    }
    // additionalProperties (true or a schema) beside them: more members after the listed ones,
    // under keys none of the listed names.
    std::optional<Node> extra;
    if (additional != nullptr && !closed) {
      std::vector<std::string> names;
      for (const auto& p : props) names.push_back(p.first);
      const int rule = g_.new_rule("extra");
      g_.define(rule, g_.seq({json_key_other_than(g_, names), ws(), g_.literal(":"), ws(),
                              schema(*additional, path + "/additionalProperties", depth + 1)}));
      extra = g_.ref(rule);
    }
    std::vector<int> rest(n + 1), first(n + 1);
    for (size_t i = 0; i <= n; ++i) {
      rest[i] = g_.new_rule("rest");
      first[i] = g_.new_rule("first");
    }
    for (size_t i = n + 1; i-- > 0;) {
      if (i == n) {
        g_.define(rest[i], extra ? g_.star(g_.seq({sep(), *extra})) : g_.empty());
        g_.define(first[i], g_.empty());
        continue;
      }
      Node with = g_.seq({sep(), prop[i], g_.ref(rest[i + 1])});
      const bool req = required.count(props[i].first) > 0;
      g_.define(rest[i], req ? with : g_.alt({with, g_.ref(rest[i + 1])}));
      Node starts = g_.seq({prop[i], g_.ref(rest[i + 1])});
      g_.define(first[i], req ? starts : g_.alt({starts, g_.ref(first[i + 1])}));
    }
    const bool any_required = !required.empty();
    Node body = any_required ? g_.seq({g_.ref(first[0]), ws()})
                             : g_.optional(g_.seq({nonempty_first(prop, rest, extra), ws()}));
    return g_.seq({g_.literal("{"), ws(), body, g_.literal("}")});
  }

  // first(0) without its empty alternative (when every property is optional), so that
  // "{" ws ws "}" cannot be read two ways: a listed property and those after it, or only
  // extra members.
  Node nonempty_first(const std::vector<Node>& prop, const std::vector<int>& rest, const std::optional<Node>& extra) {
    std::vector<Node> alts;
    for (size_t i = 0; i < prop.size(); ++i) alts.push_back(g_.seq({prop[i], g_.ref(rest[i + 1])}));
    if (extra) alts.push_back(g_.seq({*extra, g_.ref(rest[prop.size()])}));
    return g_.alt(std::move(alts));
  }

  Node array(const json& s, const std::string& path, int depth) {
    if (s.contains("uniqueItems") && !(s["uniqueItems"].is_boolean() && !s["uniqueItems"].get<bool>())) {
      fail(path, "unsupported keyword 'uniqueItems'");
      return g_.empty();
    }
    const int64_t min = count_keyword(s, "minItems", path).value_or(0);
    std::optional<int64_t> max = count_keyword(s, "maxItems", path);
    if (!error_.empty()) return g_.empty();
    if (max && *max < min) {
      fail(path, "'maxItems' is below 'minItems'");
      return g_.empty();
    }
    // The leading items: "prefixItems" (2020-12), or "items" as an array with "additionalItems"
    // for the rest (the tuple form of drafts 4 to 2019-09, as older tools write it).
    const bool tuple_form = s.contains("items") && s["items"].is_array();
    if (tuple_form && s.contains("prefixItems")) {
      fail(path, "'items' as an array (the tuple form of older drafts) together with 'prefixItems'");
      return g_.empty();
    }
    if (!tuple_form && s.contains("additionalItems")) {
      fail(path + "/additionalItems", "'additionalItems' applies only to 'items' given as an array");
      return g_.empty();
    }
    const char* prefix_key = tuple_form ? "items" : "prefixItems";
    const char* rest_key = tuple_form ? "additionalItems" : "items";
    std::vector<Node> fixed;
    if (s.contains(prefix_key)) {
      const json& p = s[prefix_key];
      if (!p.is_array()) {
        fail(path + "/prefixItems", "'prefixItems' must be an array of schemas");
        return g_.empty();
      }
      for (size_t i = 0; i < p.size(); ++i)
        fixed.push_back(schema(p[i], path + "/" + prefix_key + "/" + std::to_string(i), depth + 1));
    }
    const int64_t k = static_cast<int64_t>(fixed.size());
    if (max && k > *max) {
      fail(path, "'prefixItems' has more items than 'maxItems' allows");
      return g_.empty();
    }
    // Items after the prefix: under "items" ("additionalItems" in the tuple form; absent: any
    // value, written only when minItems needs them).
    std::optional<Node> item;
    bool items_allowed = true;
    if (s.contains(rest_key)) {
      const json& it = s[rest_key];
      if (it.is_boolean() && !it.get<bool>()) items_allowed = false;
      else {
        const int rule = g_.new_rule("item");
        g_.define(rule, schema(it, path + "/" + rest_key, depth + 1));
        item = g_.ref(rule);
      }
    } else if (k == 0 || min > k) {
      item = value_rule();
    } else {
      items_allowed = false;
    }
    int64_t rest_min = std::max<int64_t>(0, min - k);
    int64_t rest_max = max ? *max - k : (k > 0 && !s.contains(rest_key) ? rest_min : GrammarBuilder::kUnbounded);
    if (!items_allowed) {
      if (rest_min > 0) {
        fail(path, "'minItems' needs more items than 'prefixItems' lists and 'items' is false");
        return g_.empty();
      }
      rest_max = 0;
    }
    if (rest_min > kMaxUnrolledItems) {
      fail(path + "/minItems", "'minItems' over " + std::to_string(kMaxUnrolledItems) + " is not supported");
      return g_.empty();
    }
    if (rest_max > kMaxUnrolledItems) rest_max = kMaxUnrolledItems;  // fewer items: still valid
    std::vector<Node> elements;
    for (int64_t i = 0; i < k; ++i) {
      if (i > 0) elements.push_back(sep());
      elements.push_back(fixed[static_cast<size_t>(i)]);
    }
    Node body;
    if (rest_max == 0) {
      if (k == 0) return g_.seq({g_.literal("["), ws(), g_.literal("]")});
      body = g_.seq(std::move(elements));
    } else if (k > 0) {
      elements.push_back(g_.repeat(g_.seq({sep(), *item}), static_cast<int>(rest_min), static_cast<int>(rest_max)));
      body = g_.seq(std::move(elements));
    } else {
      const int more_min = static_cast<int>(std::max<int64_t>(0, rest_min - 1));
      const int more_max = rest_max == GrammarBuilder::kUnbounded ? GrammarBuilder::kUnbounded : static_cast<int>(rest_max - 1);
      Node list = g_.seq({*item, g_.repeat(g_.seq({sep(), *item}), more_min, more_max)});
      if (rest_min == 0) return g_.seq({g_.literal("["), ws(), g_.optional(g_.seq({list, ws()})), g_.literal("]")});
      body = list;
    }
    return g_.seq({g_.literal("["), ws(), body, ws(), g_.literal("]")});
  }

  Node string(const json& s, const std::string& path) {
    const std::optional<int64_t> min = count_keyword(s, "minLength", path);
    const std::optional<int64_t> max = count_keyword(s, "maxLength", path);
    if (!error_.empty()) return g_.empty();
    const bool lengths = min || max;
    if (s.contains("pattern") || s.contains("format")) {
      if (s.contains("pattern") && s.contains("format")) {
        fail(path, "'pattern' together with 'format' is not supported");
        return g_.empty();
      }
      if (lengths) {
        fail(path, std::string("'minLength'/'maxLength' together with '") + (s.contains("pattern") ? "pattern" : "format") +
                       "' is not supported");
        return g_.empty();
      }
      std::string regex;
      if (s.contains("pattern")) {
        if (!s["pattern"].is_string()) {
          fail(path + "/pattern", "'pattern' must be a string");
          return g_.empty();
        }
        regex = s["pattern"].get<std::string>();
      } else {
        if (!s["format"].is_string() || kFormats.count(s["format"].get<std::string>()) == 0) {
          fail(path + "/format", "unsupported format '" + (s["format"].is_string() ? s["format"].get<std::string>() : s["format"].dump()) +
                                     "' (supported: date, time, date-time, uuid, email, ipv4)");
          return g_.empty();
        }
        regex = kFormats.at(s["format"].get<std::string>());
      }
      StatusOr<Node> body = compile_regex(g_, regex, RegexText::kJsonString);
      if (!body.is_ok()) {
        fail(path + "/pattern", body.status().message());
        return g_.empty();
      }
      return g_.seq({g_.literal("\""), body.value(), g_.literal("\"")});
    }
    if (!lengths) return any_string();
    if (max && min && *max < *min) {
      fail(path, "'maxLength' is below 'minLength'");
      return g_.empty();
    }
    if (min.value_or(0) > kMaxUnrolledItems) {
      fail(path + "/minLength", "'minLength' over " + std::to_string(kMaxUnrolledItems) + " is not supported");
      return g_.empty();
    }
    int hi = max ? static_cast<int>(std::min<int64_t>(*max, kMaxUnrolledItems)) : GrammarBuilder::kUnbounded;
    return g_.seq({g_.literal("\""), g_.repeat(string_char(), static_cast<int>(min.value_or(0)), hi), g_.literal("\"")});
  }

  // A bound keyword as an exact integer bound (rounded inward for numbers, which narrows
  // the language but keeps every output valid).
  std::optional<NumberBound> bound(const json& s, bool lower, bool integer, const std::string& path) {
    const char* inclusive_key = lower ? "minimum" : "maximum";
    const char* exclusive_key = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    std::optional<NumberBound> out;
    auto tighter = [&](double v, bool exclusive) {
      const double r = lower ? std::ceil(v) : std::floor(v);
      if (r != v) exclusive = false;  // rounded inward: the bound itself is now allowed
      if (std::fabs(r) > static_cast<double>(kMaxExactBound)) {
        if ((lower && r < 0) || (!lower && r > 0)) return;  // beyond the digit cap: no constraint left
        fail(path + "/" + (exclusive ? exclusive_key : inclusive_key), "a bound beyond 1e18 is not supported");
        return;
      }
      NumberBound b{static_cast<int64_t>(r), exclusive};
      if (integer && b.exclusive) b = {b.value + (lower ? 1 : -1), false};
      if (!out) out = b;
      else if (lower ? (b.value > out->value || (b.value == out->value && b.exclusive)) : (b.value < out->value || (b.value == out->value && b.exclusive)))
        out = b;
    };
    if (s.contains(inclusive_key)) {
      if (!s[inclusive_key].is_number()) fail(path + "/" + inclusive_key, std::string("'") + inclusive_key + "' must be a number");
      else tighter(s[inclusive_key].get<double>(), false);
    }
    if (s.contains(exclusive_key)) {
      const json& e = s[exclusive_key];
      if (e.is_boolean()) {  // draft 4: a flag on minimum/maximum
        if (e.get<bool>() && out) {
          NumberBound b = *out;
          out.reset();
          tighter(static_cast<double>(b.value), true);
        }
      } else if (!e.is_number()) {
        fail(path + "/" + exclusive_key, std::string("'") + exclusive_key + "' must be a number");
      } else {
        tighter(e.get<double>(), true);
      }
    }
    return out;
  }

  Node number(const json& s, const std::string& path, bool integer) {
    std::optional<NumberBound> lo = bound(s, true, integer, path), hi = bound(s, false, integer, path);
    if (!error_.empty()) return g_.empty();
    if (lo && hi && (lo->value > hi->value || (lo->value == hi->value && (lo->exclusive || hi->exclusive)))) {
      fail(path, "the bounds allow no number");
      return g_.empty();
    }
    if (integer) {
      return integer_range(g_, lo ? std::optional<int64_t>(lo->value) : std::nullopt,
                           hi ? std::optional<int64_t>(hi->value) : std::nullopt);
    }
    if (!lo && !hi) return any_number(g_);
    return number_range(g_, lo, hi);
  }

  GrammarBuilder& g_;
  const json& root_;
  std::string error_;
  std::map<std::string, int> ref_rules_;
  int ws_ = -1, char_ = -1, string_ = -1, value_ = -1, object_any_ = -1;
};

}  // namespace

StatusOr<int> compile_json_schema(GrammarBuilder& g, const json& schema) {
  return SchemaCompiler(g, schema).compile_root();
}

int json_object_rule(GrammarBuilder& g) {
  static const json kEmpty = json::object();
  SchemaCompiler c(g, kEmpty);
  return c.object_any_rule();
}

}  // namespace tessera::structured
