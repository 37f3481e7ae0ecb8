#include "common/tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include "common/input_file.h"
#include "common/tokenizer/added_vocabulary.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/tokenization_cleanup.h"
#include "common/tokenizer/json_fields.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/post_processor.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/unicode_utils.h"

namespace tessera {

using tok::Json;

namespace {

StatusOr<std::string> read_whole_file(const std::string& path) {
  return read_input_file(path, std::filesystem::path(path).filename().string());
}

StatusOr<Json> parse_json(const std::string& text) {
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    return invalid_argument(std::string("invalid JSON: ") + e.what());
  }
}

// bos_token / eos_token in tokenizer_config.json: "<s>", {"content": "<s>", ...} or null.
StatusOr<std::string> config_token(const Json& config, const std::string& key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return invalid_argument(key + ": expected a string or {\"content\": ...}");
}

StatusOr<std::vector<tok::AddedToken>> parse_added_tokens(const Json& j) {
  std::vector<tok::AddedToken> tokens;
  auto it = j.find("added_tokens");
  if (it == j.end() || it->is_null()) return tokens;
  if (!it->is_array()) return invalid_argument("added_tokens: expected an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& e = (*it)[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    if (!e.is_object()) return invalid_argument(where + ": expected an object");
    tok::AddedToken t;
    TESSERA_ASSIGN_OR_RETURN(int64_t id, tok::get_int_or(e, "id", where, -1));
    if (id < 0 || id > INT32_MAX) return invalid_argument(where + ".id: expected a non-negative integer");
    t.id = static_cast<int32_t>(id);
    TESSERA_ASSIGN_OR_RETURN(t.content, tok::get_string(e, "content", where));
    TESSERA_ASSIGN_OR_RETURN(t.single_word, tok::get_bool_or(e, "single_word", where, false));
    TESSERA_ASSIGN_OR_RETURN(t.lstrip, tok::get_bool_or(e, "lstrip", where, false));
    TESSERA_ASSIGN_OR_RETURN(t.rstrip, tok::get_bool_or(e, "rstrip", where, false));
    TESSERA_ASSIGN_OR_RETURN(t.special, tok::get_bool_or(e, "special", where, false));
    TESSERA_ASSIGN_OR_RETURN(t.normalized, tok::get_bool_or(e, "normalized", where, !t.special));
    tokens.push_back(std::move(t));
  }
  return tokens;
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& dir) {
  const std::filesystem::path root(dir);
  const std::string tokenizer_path = (root / "tokenizer.json").string();
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) return not_found(dir + ": no such directory");
  TESSERA_ASSIGN_OR_RETURN(std::string tokenizer_json, read_whole_file(tokenizer_path));
  const std::string config_path = (root / "tokenizer_config.json").string();
  std::string config_json;
  TESSERA_ASSIGN_OR_RETURN(const bool has_config, input_path_exists(config_path));
  if (has_config) {
    TESSERA_ASSIGN_OR_RETURN(config_json, read_whole_file(config_path));
    if (config_json.find_first_not_of(" \t\r\n") == std::string::npos) config_json.clear();
    // Checked here so that an error names the right file.
    auto parsed = parse_json(config_json.empty() ? "{}" : config_json);
    if (!parsed.is_ok()) return parsed.status().with_context(config_path);
  }
  auto tokenizer = from_json(tokenizer_json, config_json, tokenizer_path);
  if (!tokenizer.is_ok()) {
    // from_json names tokenizer.json; tokenizer_config.json problems carry their own name.
    return tokenizer.status();
  }
  return tokenizer;
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::from_json(const std::string& tokenizer_json,
                                                          const std::string& config_json,
                                                          const std::string& source) {
  auto parsed = parse_json(tokenizer_json);
  if (!parsed.is_ok()) return parsed.status().with_context(source);
  if (config_json.empty()) return from_parsed(parsed.value(), nullptr, source);
  auto config_parsed = parse_json(config_json);
  if (!config_parsed.is_ok()) return config_parsed.status().with_context("tokenizer_config.json");
  return from_parsed(parsed.value(), &config_parsed.value(), source);
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::from_parsed(const nlohmann::json& j, const nlohmann::json* config,
                                                            const std::string& source) {
  if (!j.is_object()) return invalid_argument(source + ": expected a JSON object at the top level");
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  auto fail = [&source](const Status& s) { return s.with_context(source); };

  // Model.
  auto model_it = j.find("model");
  if (model_it == j.end() || !model_it->is_object()) return fail(invalid_argument("model: missing or not an object"));
  std::string model_type = "BPE";
  if (model_it->contains("type")) {
    auto type = tok::get_string(*model_it, "type", "model");
    if (!type.is_ok()) return fail(type.status());
    model_type = type.value();
  } else if (!model_it->contains("merges")) {
    return fail(invalid_argument("model.type: missing"));
  }
  if (model_type != "BPE") {
    return fail(unimplemented("model.type: unsupported model type '" + model_type + "' (supported: BPE)"));
  }
  auto model = tok::BpeModel::from_json(*model_it, "model");
  if (!model.is_ok()) return fail(model.status());
  t->model_ = std::move(model).value();

  // Pipeline components; null means "none".
  if (auto it = j.find("normalizer"); it != j.end() && !it->is_null()) {
    auto n = tok::parse_normalizer(*it, "normalizer");
    if (!n.is_ok()) return fail(n.status());
    t->normalizer_ = std::move(n).value();
  }
  if (auto it = j.find("pre_tokenizer"); it != j.end() && !it->is_null()) {
    auto p = tok::parse_pre_tokenizer(*it, "pre_tokenizer");
    if (!p.is_ok()) return fail(p.status());
    t->pre_tokenizer_ = std::move(p).value();
  }
  if (auto it = j.find("decoder"); it != j.end() && !it->is_null()) {
    auto d = tok::parse_decoder(*it, "decoder");
    if (!d.is_ok()) return fail(d.status());
    t->decoder_ = std::move(d).value();
  }
  auto model_id = [&t](const std::string& s) { return t->model_->token_to_id(s); };
  if (auto it = j.find("post_processor"); it != j.end() && !it->is_null()) {
    auto p = tok::parse_post_processor(*it, "post_processor", model_id);
    if (!p.is_ok()) return fail(p.status());
    t->post_processor_ = std::move(p).value();
  }

  // Added tokens.
  auto added = parse_added_tokens(j);
  if (!added.is_ok()) return fail(added.status());
  int32_t max_id = t->model_->max_id();
  const uint64_t id_bound = tok::max_token_id_bound(t->model_->vocab_size() + added.value().size());
  for (const auto& a : added.value()) {
    if (static_cast<uint64_t>(a.id) >= id_bound) {
      return fail(invalid_argument("added_tokens: '" + a.content + "' has id " + std::to_string(a.id) +
                                   ", far past the vocabulary's tokens (ids must stay below " +
                                   std::to_string(id_bound) + ", twice the token count plus 65536)"));
    }
    max_id = std::max(max_id, a.id);
  }
  const size_t n_ids = static_cast<size_t>(max_id + 1);
  t->added_content_.assign(n_ids, std::string());
  t->is_added_.assign(n_ids, false);
  t->is_special_.assign(n_ids, false);
  t->raw_matcher_ = std::make_unique<tok::AddedTokenMatcher>();
  t->normalized_matcher_ = std::make_unique<tok::AddedTokenMatcher>();
  std::unordered_set<int32_t> extra_ids;
  for (const auto& a : added.value()) {
    t->added_content_[a.id] = a.content;
    t->is_added_[a.id] = true;
    t->is_special_[a.id] = a.special;
    t->added_ids_.emplace(a.content, a.id);
    if (t->model_->id_to_token(a.id) == nullptr) extra_ids.insert(a.id);
    if (a.normalized) {
      std::string pattern = a.content;
      if (t->normalizer_) t->normalizer_->normalize(pattern);
      t->normalized_matcher_->add(a, std::move(pattern));
    } else {
      t->raw_matcher_->add(a, a.content);
    }
  }
  t->vocab_size_ = static_cast<int64_t>(t->model_->vocab_size() + extra_ids.size());

  // tokenizer_config.json.
  if (config != nullptr) {
    const std::string config_source = "tokenizer_config.json";
    const Json& c = *config;
    if (!c.is_object()) return invalid_argument(config_source + ": expected a JSON object");
    auto resolve = [&](const std::string& key, int32_t* id) -> Status {
      auto name = config_token(c, key);
      if (!name.is_ok()) return name.status().with_context(config_source);
      if (name.value().empty()) return Status::ok();
      *id = t->token_to_id(name.value());
      if (*id < 0) {
        return invalid_argument(config_source + ": " + key + ": token '" + name.value() +
                                "' is neither in the vocabulary nor an added token");
      }
      return Status::ok();
    };
    TESSERA_RETURN_IF_ERROR(resolve("bos_token", &t->bos_id_));
    TESSERA_RETURN_IF_ERROR(resolve("eos_token", &t->eos_id_));
    if (auto it = c.find("clean_up_tokenization_spaces"); it != c.end() && !it->is_null()) {
      if (!it->is_boolean()) {
        return invalid_argument(config_source + ": clean_up_tokenization_spaces: expected true or false, got " +
                                it->dump());
      }
      t->clean_up_tokenization_spaces_ = it->get<bool>();
    }
    if (auto it = c.find("chat_template"); it != c.end() && !it->is_null()) {
      if (it->is_string()) {
        t->chat_template_ = it->get<std::string>();
      } else if (it->is_array()) {
        // Named templates: [{"name": "default", "template": "..."}, ...]
        for (const auto& e : *it) {
          if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string()) {
            t->chat_template_ = e["template"].get<std::string>();
          }
        }
      } else {
        return invalid_argument(config_source + ": chat_template: expected a string or a list of named templates");
      }
    }
    // Like transformers' Llama-family fast tokenizers, explicit add_bos_token /
    // add_eos_token rebuild the template as [BOS] $A [EOS].
    const bool has_bos_flag = c.contains("add_bos_token") && c["add_bos_token"].is_boolean();
    const bool has_eos_flag = c.contains("add_eos_token") && c["add_eos_token"].is_boolean();
    if (has_bos_flag || has_eos_flag) {
      std::vector<int32_t> before, after;
      if (t->post_processor_) t->post_processor_->template_ids(before, after);
      const bool add_bos = has_bos_flag ? c["add_bos_token"].get<bool>() : (!before.empty() && before[0] == t->bos_id_);
      const bool add_eos = has_eos_flag ? c["add_eos_token"].get<bool>() : (!after.empty() && after.back() == t->eos_id_);
      if (add_bos && t->bos_id_ < 0) return invalid_argument(config_source + ": add_bos_token is true but bos_token is not set");
      if (add_eos && t->eos_id_ < 0) return invalid_argument(config_source + ": add_eos_token is true but eos_token is not set");
      std::vector<int32_t> new_before, new_after;
      if (add_bos) new_before.push_back(t->bos_id_);
      if (add_eos) new_after.push_back(t->eos_id_);
      t->post_processor_ = tok::make_wrap_processor(std::move(new_before), std::move(new_after));
    }
  }
  return t;
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  // Added tokens take precedence, as in tokenizers.
  if (auto it = added_ids_.find(std::string(token)); it != added_ids_.end()) return it->second;
  return model_->token_to_id(token);
}

const std::string* Tokenizer::token_string(int32_t id) const {
  if (id >= 0 && static_cast<size_t>(id) < is_added_.size() && is_added_[id]) return &added_content_[id];
  return model_->id_to_token(id);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  const std::string* s = token_string(id);
  return s ? *s : std::string();
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < is_special_.size() && is_special_[id];
}

void Tokenizer::encode_run(std::string_view text, bool at_origin, std::vector<int32_t>& ids) const {
  if (!pre_tokenizer_) {
    model_->tokenize(text, ids);
    return;
  }
  pre_tokenizer_->for_each_word(tok::Piece{std::string(text), at_origin},
                                [this, &ids](std::string_view word) { model_->tokenize(word, ids); });
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  std::string repaired;
  std::string_view text = input;
  if (!tok::is_valid_utf8(input)) {
    repaired = tok::to_valid_utf8(input);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<tok::Segment> raw;
  if (raw_matcher_->empty()) {
    if (!text.empty()) raw.push_back(tok::Segment{0, text.size(), -1});
  } else {
    raw_matcher_->split(text, raw);
  }
  std::vector<tok::Segment> normalized_segments;
  for (const auto& seg : raw) {
    if (seg.token_id >= 0) {
      ids.push_back(seg.token_id);
      continue;
    }
    std::string run(text.substr(seg.start, seg.end - seg.start));
    if (normalizer_) normalizer_->normalize(run);
    if (run.empty()) continue;
    const bool run_at_origin = seg.start == 0;
    if (normalized_matcher_->empty()) {
      encode_run(run, run_at_origin, ids);
      continue;
    }
    normalized_segments.clear();
    normalized_matcher_->split(run, normalized_segments);
    for (const auto& ns : normalized_segments) {
      if (ns.token_id >= 0) {
        ids.push_back(ns.token_id);
      } else {
        encode_run(std::string_view(run).substr(ns.start, ns.end - ns.start), run_at_origin && ns.start == 0, ids);
      }
    }
  }
  if (add_special_tokens && post_processor_) post_processor_->process(ids);
  return ids;
}

std::string Tokenizer::decode_window(const std::vector<int32_t>& ids, size_t begin, size_t end,
                                     bool skip_special_tokens, bool continuation, bool at_end,
                                     bool* unstable) const {
  std::vector<std::string> tokens;
  tokens.reserve(end - begin);
  for (size_t k = begin; k < end; ++k) {
    const std::string* s = token_string(ids[k]);
    if (s == nullptr || (skip_special_tokens && is_special(ids[k]))) continue;
    tokens.push_back(*s);
  }
  const bool had_tokens = !tokens.empty();
  const std::string last_token = had_tokens ? tokens.back() : std::string();
  std::string text;
  if (decoder_) {
    tok::DecodeState state;
    state.continuation = continuation;
    state.at_end = at_end;
    decoder_->decode_chain(tokens, state);
    for (const auto& s : tokens) text += s;
  } else {
    // tokenizers joins with spaces when there is no decoder.
    for (size_t k = 0; k < tokens.size(); ++k) {
      if (k > 0 || (continuation && !tokens.empty())) text += ' ';
      text += tokens[k];
    }
  }
  if (unstable != nullptr) {
    const std::string_view r = tok::kReplacementChar;
    *unstable = had_tokens && ((text.size() >= r.size() && text.compare(text.size() - r.size(), r.size(), r) == 0) ||
                                    (decoder_ && decoder_->unstable_tail(last_token, text)));
  }
  return text;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string text = decode_without_cleanup(ids, skip_special_tokens);
  return clean_up_tokenization_spaces_ ? tok::clean_up_tokenization(text) : text;
}

std::string Tokenizer::decode_without_cleanup(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return decode_window(ids, 0, ids.size(), skip_special_tokens, false, true, nullptr);
}

}  // namespace tessera
