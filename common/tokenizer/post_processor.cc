#include "common/tokenizer/post_processor.h"

namespace tessera::tok {
namespace {

class WrapProcessor : public PostProcessor {
 public:
  WrapProcessor(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }
  void template_ids(std::vector<int32_t>& before, std::vector<int32_t>& after) const override {
    before.insert(before.end(), before_.begin(), before_.end());
    after.insert(after.begin(), after_.begin(), after_.end());
  }

 private:
  std::vector<int32_t> before_, after_;
};

class SequenceProcessor : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> parts) : parts_(std::move(parts)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& p : parts_) p->process(ids);
  }
  void template_ids(std::vector<int32_t>& before, std::vector<int32_t>& after) const override {
    for (const auto& p : parts_) p->template_ids(before, after);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

StatusOr<std::unique_ptr<PostProcessor>> parse_template(const Json& j, const std::string& where) {
  TESSERA_ASSIGN_OR_RETURN(const Json* single, get_array(j, "single", where));
  auto specials = j.find("special_tokens");
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& piece = (*single)[i];
    const std::string path = where + ".single[" + std::to_string(i) + "]";
    if (piece.is_object() && piece.contains("Sequence")) {
      if (seen_sequence) return unimplemented(path + ": a template with the sequence twice is not supported");
      seen_sequence = true;
      continue;
    }
    if (!piece.is_object() || !piece.contains("SpecialToken") || !piece["SpecialToken"].is_object()) {
      return invalid_argument(path + ": expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    }
    TESSERA_ASSIGN_OR_RETURN(std::string name, get_string(piece["SpecialToken"], "id", path + ".SpecialToken"));
    if (specials == j.end() || !specials->is_object() || !specials->contains(name)) {
      return invalid_argument(path + ": special token '" + name + "' is not in " + where + ".special_tokens");
    }
    const Json& entry = (*specials)[name];
    const std::string entry_path = where + ".special_tokens['" + name + "']";
    TESSERA_ASSIGN_OR_RETURN(const Json* ids, get_array(entry, "ids", entry_path));
    auto& dst = seen_sequence ? after : before;
    for (const auto& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0) {
        return invalid_argument(entry_path + ".ids: expected non-negative integers");
      }
      dst.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  if (!seen_sequence) return invalid_argument(where + ".single: the template has no {\"Sequence\": ...}");
  return make_wrap_processor(std::move(before), std::move(after));
}

// Roberta/Bert name their tokens as ["<s>", 0].
StatusOr<int32_t> token_pair_id(const Json& j, const std::string& key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer()) {
    return invalid_argument(field_path(where, key) + ": expected [\"token\", id]");
  }
  return static_cast<int32_t>((*it)[1].get<int64_t>());
}

}  // namespace

std::unique_ptr<PostProcessor> make_wrap_processor(std::vector<int32_t> before, std::vector<int32_t> after) {
  return std::make_unique<WrapProcessor>(std::move(before), std::move(after));
}

StatusOr<std::unique_ptr<PostProcessor>> parse_post_processor(
    const Json& j, const std::string& where, const std::function<int32_t(const std::string&)>& token_to_id) {
  TESSERA_ASSIGN_OR_RETURN(std::string type, get_type(j, where));
  if (type == "TemplateProcessing") return parse_template(j, where);
  if (type == "ByteLevel") return make_wrap_processor({}, {});
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    TESSERA_ASSIGN_OR_RETURN(int32_t cls, token_pair_id(j, "cls", where));
    TESSERA_ASSIGN_OR_RETURN(int32_t sep, token_pair_id(j, "sep", where));
    return make_wrap_processor({cls}, {sep});
  }
  if (type == "Sequence") {
    TESSERA_ASSIGN_OR_RETURN(const Json* list, get_array(j, "processors", where));
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (size_t i = 0; i < list->size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(
          auto part, parse_post_processor((*list)[i], where + ".processors[" + std::to_string(i) + "]", token_to_id));
      parts.push_back(std::move(part));
    }
    return std::unique_ptr<PostProcessor>(new SequenceProcessor(std::move(parts)));
  }
  return unimplemented(where + ": unsupported post_processor type '" + type + "'");
}

}  // namespace tessera::tok
