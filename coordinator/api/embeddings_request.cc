// /v1/embeddings: the request body read into one embedding Request per input, and the
// response built from the pooled vectors (OpenAI's shape; vLLM's truncate_prompt_tokens).
#include <cmath>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "common/string_util.h"
#include "coordinator/api/openai_api.h"
#include "coordinator/api/prompt_input.h"
#include "coordinator/api/request_body.h"

namespace tessera {

namespace {

using nlohmann::json;

const std::set<std::string>& embeddings_fields() {
  static const std::set<std::string> kFields = {"model", "input", "encoding_format", "dimensions", "user",
                                                "truncate_prompt_tokens"};
  return kFields;
}

// An integer field in [lo, hi] (absent or null: untouched); false with a 400 naming it.
bool read_int_field(const json& j, const char* name, int64_t lo, int64_t hi, int* out, ApiError* error) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return true;
  const bool in_range = it->is_number_integer() && !(it->is_number_unsigned() && it->get<uint64_t>() > INT64_MAX) &&
                        it->get<int64_t>() >= lo && it->get<int64_t>() <= hi;
  if (!in_range) {
    *error = bad_request(name, std::string("'") + name + "' must be an integer in [" + std::to_string(lo) + ", " +
                                   std::to_string(hi) + "]");
    return false;
  }
  *out = static_cast<int>(it->get<int64_t>());
  return true;
}

bool read_user(const json& j, ApiRequest* out, ApiError* error) {
  auto u = j.find("user");
  if (u == j.end() || u->is_null()) return true;
  if (!u->is_string()) {
    *error = bad_request("user", "'user' must be a string");
    return false;
  }
  out->user = u->get<std::string>();
  return true;
}

bool read_encoding_format(const json& j, ApiRequest* out, ApiError* error) {
  auto it = j.find("encoding_format");
  if (it == j.end() || it->is_null()) return true;
  if (!it->is_string() || (*it != "float" && *it != "base64")) {
    *error = bad_request("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
    return false;
  }
  out->embedding_base64 = *it == "base64";
  return true;
}

// Each input within max_model_len, or cut to its last `truncate` tokens when asked.
bool fit_inputs(std::vector<std::vector<int32_t>>* inputs, int truncate, const ApiContext& ctx, ApiError* error) {
  for (size_t i = 0; i < inputs->size(); ++i) {
    std::vector<int32_t>& ids = (*inputs)[i];
    if (truncate > 0 && ids.size() > static_cast<size_t>(truncate))
      ids.erase(ids.begin(), ids.end() - truncate);
    if (ids.size() > static_cast<size_t>(ctx.max_model_len)) {
      const std::string param = inputs->size() > 1 ? "input[" + std::to_string(i) + "]" : "input";
      *error = bad_request(param, "'" + param + "' has " + std::to_string(ids.size()) +
                                      " tokens, more than max_model_len " + std::to_string(ctx.max_model_len) +
                                      (ctx.max_model_len_limit.empty() ? "" : " (" + ctx.max_model_len_limit + ")") +
                                      "; send truncate_prompt_tokens to keep only the last tokens");
      error->code = "context_length_exceeded";
      return false;
    }
  }
  return true;
}

}  // namespace

std::vector<float> finish_embedding(const std::vector<float>& v, int dimensions, bool normalize) {
  std::vector<float> out(v.begin(), dimensions > 0 && static_cast<size_t>(dimensions) < v.size()
                                        ? v.begin() + dimensions
                                        : v.end());
  if (!normalize) return out;
  double sq = 0;
  for (float x : out) sq += static_cast<double>(x) * x;
  // As torch.nn.functional.normalize: a zero vector stays zero (eps 1e-12).
  const double scale = 1.0 / std::max(std::sqrt(sq), 1e-12);
  for (float& x : out) x = static_cast<float>(x * scale);
  return out;
}

bool parse_embeddings_request(std::string_view body, const ApiContext& ctx, ApiRequest* out, ApiError* error) {
  *out = ApiRequest();
  out->endpoint = ApiEndpoint::kEmbeddings;
  out->model = ctx.model_name;
  nlohmann::ordered_json body_json;
  if (!read_request_object(body, embeddings_fields(), "/v1/embeddings", ctx.served(), &body_json, error)) return false;
  const json j = body_json;
  if (j.contains("model") && j["model"].is_string() && ctx.served().find(j["model"].get<std::string>(), &out->lora) &&
      !out->lora.empty())
    out->model = out->lora;
  if (!read_user(j, out, error)) return false;
  if (!ctx.embeddings) {
    *error = bad_request("", "this server does not answer /v1/embeddings (server.task is generate)");
    return false;
  }
  const EmbeddingPooling& pooling = *ctx.embeddings;
  auto input = j.find("input");
  if (input == j.end() || input->is_null()) {
    *error = bad_request("input", "'input' is required");
    return false;
  }
  const int64_t max_dimensions = pooling.embedding_size > 0 ? pooling.embedding_size : INT32_MAX;
  int truncate = 0;
  if (!read_encoding_format(j, out, error) || !read_int_field(j, "dimensions", 1, max_dimensions, &out->dimensions, error) ||
      !read_int_field(j, "truncate_prompt_tokens", -1, INT32_MAX, &truncate, error))
    return false;
  if (truncate == 0 && j.contains("truncate_prompt_tokens") && !j["truncate_prompt_tokens"].is_null()) {
    *error = bad_request("truncate_prompt_tokens", "'truncate_prompt_tokens' must be -1 (max_model_len) or >= 1");
    return false;
  }
  if (truncate < 0) truncate = ctx.max_model_len;
  out->normalize_embedding = pooling.normalize;

  std::vector<std::vector<int32_t>> inputs;
  if (!read_prompt_input(*input, "input", ctx.tokenizer, &inputs, &out->prompt_texts, error)) return false;
  if (!fit_inputs(&inputs, truncate, ctx, error)) return false;
  for (std::vector<int32_t>& ids : inputs) {
    auto r = std::make_shared<Request>();
    r->prompt = std::move(ids);
    r->max_tokens = 1;  // not used: an embedding generates nothing
    r->pooling = pooling.pooling;
    r->speculative = false;
    r->lora = out->lora;
    out->requests.push_back(std::move(r));
  }
  return true;
}

std::string embeddings_response_body(const ApiRequest& request, const std::string& id, int64_t created,
                                     const std::vector<ChoiceOutput>& choices) {
  json data = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const std::vector<float> v = finish_embedding(choices[i].embedding, request.dimensions, request.normalize_embedding);
    json item = {{"object", "embedding"}, {"index", i}};
    if (request.embedding_base64) {
      std::string bytes(v.size() * sizeof(float), '\0');
      std::memcpy(bytes.data(), v.data(), bytes.size());  // little-endian hosts only (x86-64, aarch64)
      item["embedding"] = base64_encode(bytes);
    } else {
      item["embedding"] = v;
    }
    data.push_back(std::move(item));
  }
  const Usage usage = usage_of(request, choices);
  json out = {{"id", id},
              {"object", "list"},
              {"created", created},
              {"model", request.model},
              {"data", std::move(data)},
              {"usage", {{"prompt_tokens", usage.prompt_tokens}, {"total_tokens", usage.prompt_tokens}}}};
  return out.dump();
}

}  // namespace tessera
