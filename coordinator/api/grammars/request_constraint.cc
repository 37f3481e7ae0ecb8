#include "coordinator/api/grammars/request_constraint.h"

#include <list>
#include <map>
#include <mutex>
#include <utility>

#include "coordinator/api/grammars/gbnf_parser.h"
#include "coordinator/api/grammars/json_schema_compiler.h"
#include "coordinator/api/grammars/regex_compiler.h"

namespace tessera::structured {

using json = nlohmann::ordered_json;

StatusOr<Grammar> compile_constraint(ConstraintKind kind, const json& value, ThoughtsBefore thoughts) {
  GrammarBuilder g;
  int root = -1;
  switch (kind) {
    case ConstraintKind::kJsonObject:
      root = json_object_rule(g);
      break;
    case ConstraintKind::kJsonSchema: {
      StatusOr<int> r = compile_json_schema(g, value);
      if (!r.is_ok()) return r.status();
      root = r.value();
      break;
    }
    case ConstraintKind::kRegex: {
      if (!value.is_string()) return Status(StatusCode::kInvalidArgument, "the regex must be a string");
      StatusOr<GrammarBuilder::Node> n = compile_regex(g, value.get<std::string>(), RegexText::kRaw);
      if (!n.is_ok()) return n.status();
      root = g.new_rule("root");
      g.define(root, n.value());
      break;
    }
    case ConstraintKind::kChoice: {
      if (!value.is_array() || value.empty())
        return Status(StatusCode::kInvalidArgument, "the choices must be a non-empty array of strings");
      std::vector<GrammarBuilder::Node> alts;
      for (const json& c : value) {
        if (!c.is_string()) return Status(StatusCode::kInvalidArgument, "the choices must be a non-empty array of strings");
        alts.push_back(g.literal(c.get<std::string>()));
      }
      root = g.new_rule("root");
      g.define(root, g.alt(std::move(alts)));
      break;
    }
    case ConstraintKind::kGrammar: {
      if (!value.is_string()) return Status(StatusCode::kInvalidArgument, "the grammar must be a string");
      StatusOr<int> r = parse_gbnf(g, value.get<std::string>());
      if (!r.is_ok()) return r.status();
      root = r.value();
      break;
    }
  }
  return compile_grammar(g, allow_thoughts_before(g, root, thoughts));
}

namespace {

// Least recently used first.
class ConstraintCache {
 public:
  std::shared_ptr<const TokenConstraint> find(const TokenVocabulary* vocab, const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find({vocab, key});
    if (it == index_.end()) return nullptr;
    order_.splice(order_.end(), order_, it->second);
    return it->second->second;
  }
  void put(const TokenVocabulary* vocab, const std::string& key, std::shared_ptr<const TokenConstraint> c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.count({vocab, key})) return;
    order_.emplace_back(std::make_pair(vocab, key), std::move(c));
    index_[{vocab, key}] = std::prev(order_.end());
    while (order_.size() > kConstraintCacheSize) {
      index_.erase(order_.front().first);
      order_.pop_front();
    }
  }

 private:
  using Key = std::pair<const TokenVocabulary*, std::string>;
  std::mutex mu_;
  std::list<std::pair<Key, std::shared_ptr<const TokenConstraint>>> order_;
  std::map<Key, std::list<std::pair<Key, std::shared_ptr<const TokenConstraint>>>::iterator> index_;
};

ConstraintCache& cache() {
  static ConstraintCache* c = new ConstraintCache();  // never destroyed: requests may outlive statics
  return *c;
}

const char* kFields[] = {"response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar"};

}  // namespace

bool read_request_constraint(const json& body, const std::shared_ptr<const TokenVocabulary>& vocabulary,
                             std::optional<RequestedConstraint>* out, std::string* param, std::string* message) {
  out->reset();
  const char* field = nullptr;
  ConstraintKind kind = ConstraintKind::kJsonObject;
  json value;
  for (const char* name : kFields) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) continue;
    if (std::string(name) == "response_format") {
      const json& rf = *it;
      auto type = rf.is_object() ? rf.find("type") : rf.end();
      if (!rf.is_object() || type == rf.end() || !type->is_string()) {
        *param = "response_format";
        *message = "'response_format' must be an object with a 'type' (text, json_object or json_schema)";
        return false;
      }
      const std::string t = type->get<std::string>();
      if (t == "text" && rf.size() == 1) continue;
      if (t == "json_object" && rf.size() == 1) {
        kind = ConstraintKind::kJsonObject;
      } else if (t == "json_schema") {
        auto js = rf.find("json_schema");
        if (js == rf.end() || !js->is_object()) {
          *param = "response_format.json_schema";
          *message = "'response_format.json_schema' must be an object with 'name' and 'schema'";
          return false;
        }
        for (auto k = js->begin(); k != js->end(); ++k) {
          const bool known = k.key() == "name" || k.key() == "schema" || k.key() == "strict" || k.key() == "description";
          if (!known || (k.key() == "strict" && !k->is_boolean() && !k->is_null()) ||
              ((k.key() == "name" || k.key() == "description") && !k->is_string())) {
            *param = "response_format.json_schema." + k.key();
            *message = known ? "'response_format.json_schema." + k.key() + "' has the wrong type"
                             : "unknown field 'response_format.json_schema." + k.key() + "'";
            return false;
          }
        }
        for (auto k = rf.begin(); k != rf.end(); ++k) {
          if (k.key() != "type" && k.key() != "json_schema") {
            *param = "response_format." + k.key();
            *message = "unknown field 'response_format." + k.key() + "'";
            return false;
          }
        }
        auto schema = js->find("schema");
        if (schema == js->end() || schema->is_null()) {
          kind = ConstraintKind::kJsonObject;  // no schema: any JSON object
        } else {
          kind = ConstraintKind::kJsonSchema;
          value = *schema;
        }
      } else {
        *param = "response_format";
        *message = "'response_format' type '" + t + "' is not one of text, json_object, json_schema" +
                   (t == "text" || t == "json_object" ? " (with no other fields)" : "");
        return false;
      }
    } else if (std::string(name) == "guided_json") {
      kind = ConstraintKind::kJsonSchema;
      value = *it;
      if (value.is_string()) {  // vLLM accepts the schema as JSON text too
        value = json::parse(it->get<std::string>(), nullptr, false);
        if (value.is_discarded()) {
          *param = name;
          *message = "'guided_json' is a string that is not valid JSON";
          return false;
        }
      }
    } else if (std::string(name) == "guided_regex") {
      kind = ConstraintKind::kRegex;
      value = *it;
    } else if (std::string(name) == "guided_choice") {
      kind = ConstraintKind::kChoice;
      value = *it;
    } else {
      kind = ConstraintKind::kGrammar;
      value = *it;
    }
    if (field != nullptr) {
      *param = name;
      *message = "'" + std::string(name) + "' and '" + field + "' both constrain the output; send only one";
      return false;
    }
    field = name;
  }
  if (field == nullptr) return true;
  if (vocabulary == nullptr) {
    *param = field;
    *message = "'" + std::string(field) + "': structured output needs the model's tokenizer, and this server has none";
    return false;
  }
  *out = RequestedConstraint{kind, std::move(value), field};
  return true;
}

bool compile_requested_constraint(const RequestedConstraint& requested,
                                  const std::shared_ptr<const TokenVocabulary>& vocabulary, ThoughtsBefore thoughts,
                                  std::shared_ptr<const TokenConstraint>* out, std::string* param,
                                  std::string* message) {
  const std::string key = std::to_string(static_cast<int>(requested.kind)) + "\x01" + thoughts_key(thoughts) + "\x01" +
                          requested.value.dump();
  StatusOr<std::shared_ptr<const TokenConstraint>> c = cached_constraint(
      vocabulary, key, [&] { return compile_constraint(requested.kind, requested.value, thoughts); });
  if (!c.is_ok()) {
    *param = requested.field;
    *message = "'" + requested.field + "': " + c.status().message();
    return false;
  }
  *out = std::move(c).value();
  return true;
}

bool parse_request_constraint(const json& body, const std::shared_ptr<const TokenVocabulary>& vocabulary,
                              std::shared_ptr<const TokenConstraint>* out, std::string* param, std::string* message,
                              ThoughtsBefore thoughts) {
  out->reset();
  std::optional<RequestedConstraint> requested;
  if (!read_request_constraint(body, vocabulary, &requested, param, message)) return false;
  return !requested || compile_requested_constraint(*requested, vocabulary, thoughts, out, param, message);
}

StatusOr<std::shared_ptr<const TokenConstraint>> cached_constraint(
    const std::shared_ptr<const TokenVocabulary>& vocabulary, const std::string& key,
    const std::function<StatusOr<Grammar>()>& compile) {
  if (auto hit = cache().find(vocabulary.get(), key)) return hit;
  StatusOr<Grammar> grammar = compile();
  if (!grammar.is_ok()) return grammar.status();
  auto constraint = std::make_shared<const TokenConstraint>(std::move(grammar).value(), vocabulary);
  cache().put(vocabulary.get(), key, constraint);
  return std::shared_ptr<const TokenConstraint>(std::move(constraint));
}

}  // namespace tessera::structured
