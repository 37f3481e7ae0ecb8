// tessera-cli: talk to a running Tessera server from the shell. Completions and chat over the
// OpenAI-compatible HTTP API (streamed by default) or the ZeroMQ client API (--zmq), `embed`
// (one vector per text, either way), plus `models` and `health`. Exit codes: 0 ok, 1 an error (server error, unreachable server, bad
// value), 2 a usage error (unknown flag, missing argument).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/zmq/curve_keys.h"
#include "common/status.h"
#include "tools/client/http_client.h"
#include "tools/client/zmq_client.h"

namespace tessera {
namespace {

using nlohmann::json;

enum class Command { kComplete, kChat, kEmbed, kModels, kHealth };

struct Options {
  Command command = Command::kComplete;
  std::string url = "http://127.0.0.1:8000";
  std::string zmq;
  std::string curve_server_key_file;  // --zmq to a CURVE server (server.curve.client_api)
  std::string api_key;
  double timeout_s = 600;
  bool json = false;
  bool no_stream = false;
  std::string input;  // PROMPT or MESSAGE
  std::string system;
  std::string model;
  std::optional<int> max_tokens, top_k;
  std::optional<double> temperature, top_p;
  std::optional<int64_t> seed;
  std::vector<std::string> stop;
  std::vector<std::string> texts;  // embed: TEXT...
  std::optional<int> dimensions;   // embed: --dimensions
};

// What one completion produced, however it travelled.
struct Outcome {
  std::string text;
  std::optional<std::string> reasoning;  // a reasoning model's thoughts (chat); none when it had none
  std::string finish_reason;
  json usage;  // null when the server sent none
};

std::chrono::milliseconds timeout_of(const Options& o) {
  return std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
}

bool is_chat(const Options& o) { return o.command == Command::kChat; }

// The OpenAI request body (the same for HTTP and ZeroMQ); `stream` only for HTTP.
json request_body(const Options& o, bool http_stream) {
  json body = json::object();
  if (!o.model.empty()) body["model"] = o.model;
  if (is_chat(o)) {
    json messages = json::array();
    if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
    messages.push_back({{"role", "user"}, {"content", o.input}});
    body["messages"] = std::move(messages);
  } else {
    body["prompt"] = o.input;
  }
  if (o.max_tokens) body["max_tokens"] = *o.max_tokens;
  if (o.temperature) body["temperature"] = *o.temperature;
  if (o.top_p) body["top_p"] = *o.top_p;
  if (o.top_k) body["top_k"] = *o.top_k;
  if (o.seed) body["seed"] = *o.seed;
  if (!o.stop.empty()) body["stop"] = o.stop;
  if (http_stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  return body;
}

bool printed_text = false;  // some output text is on stdout (a failure then ends its line first)

void print_piece(const Options& o, const std::string& text) {
  if (o.json || text.empty()) return;
  std::cout << text << std::flush;
  printed_text = true;
}

// A reasoning model's thoughts go to stderr as they come, so stdout holds the answer alone.
void print_thoughts(const Options& o, const std::string& thoughts) {
  if (o.json || thoughts.empty()) return;
  std::cerr << thoughts << std::flush;
}

std::string string_or_empty(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// One line from an `{"error": {...}}` object sent inside a stream.
std::string stream_error_text(const json& error) {
  std::string out;
  if (!string_or_empty(error, "type").empty()) out += string_or_empty(error, "type") + ": ";
  const std::string message = string_or_empty(error, "message");
  return out + (message.empty() ? error.dump() : message);
}

// Takes the first choice's text, finish reason and the usage from a response or chunk.
void absorb(const Options& o, const json& j, Outcome* out, bool print) {
  if (auto usage = j.find("usage"); usage != j.end() && usage->is_object()) out->usage = *usage;
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array()) return;
  for (const json& choice : *choices) {
    if (choice.value("index", 0) != 0) continue;
    std::string text;
    if (is_chat(o)) {
      const char* part = choice.contains("delta") ? "delta" : "message";
      if (auto m = choice.find(part); m != choice.end() && m->is_object()) {
        text = string_or_empty(*m, "content");
        if (auto r = m->find("reasoning_content"); r != m->end() && r->is_string()) {
          out->reasoning = out->reasoning.value_or("") + r->get<std::string>();
          if (print) print_thoughts(o, r->get<std::string>());
        }
      }
    } else {
      text = string_or_empty(choice, "text");
    }
    out->text += text;
    if (print) print_piece(o, text);
    if (const std::string reason = string_or_empty(choice, "finish_reason"); !reason.empty()) {
      out->finish_reason = reason;
    }
  }
}

StatusOr<std::unique_ptr<HttpClient>> http_client(const Options& o) {
  HttpClientOptions co;
  co.api_key = o.api_key;
  co.timeout = timeout_of(o);
  co.user_agent = "tessera-cli";
  return HttpClient::create(o.url, co);
}

StatusOr<Outcome> complete_http(const Options& o) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<HttpClient> client, http_client(o));
  const std::string path = is_chat(o) ? "/v1/chat/completions" : "/v1/completions";
  const std::string where = "POST " + o.url + path;
  Outcome out;
  if (o.no_stream) {
    TESSERA_ASSIGN_OR_RETURN(HttpResponse r, client->post_json(path, request_body(o, false).dump()));
    if (r.status != 200) return invalid_argument(where + ": " + describe_error_response(r));
    const json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return internal_error(where + ": the answer is not a JSON object: " + r.body.substr(0, 200));
    absorb(o, j, &out, /*print=*/true);
    return out;
  }
  std::optional<std::string> error;
  auto on_event = [&](std::string_view payload) {
    const json j = json::parse(payload, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      error = "an event is not a JSON object: " + std::string(payload.substr(0, 200));
      return false;
    }
    if (auto e = j.find("error"); e != j.end()) {
      error = e->is_object() ? stream_error_text(*e) : e->dump();
      return false;
    }
    absorb(o, j, &out, /*print=*/true);
    return true;
  };
  TESSERA_ASSIGN_OR_RETURN(HttpStreamResult r, client->post_stream(path, request_body(o, true).dump(), on_event));
  if (r.response.status != 200) return invalid_argument(where + ": " + describe_error_response(r.response));
  if (error) return internal_error(where + ": " + *error);
  if (!r.done) return Status(StatusCode::kUnavailable, where + ": the stream ended before data: [DONE]");
  return out;
}

// One line from a ZeroMQ Error event.
std::string zmq_error_text(const Options& o, const ZmqClientEvent& ev) {
  std::string msg = o.zmq + ": error " + std::to_string(ev.status);
  if (!ev.error_type.empty()) msg += " " + ev.error_type;
  if (!ev.error_code.empty()) msg += " [" + ev.error_code + "]";
  if (!ev.error_param.empty()) msg += " (param " + ev.error_param + ")";
  return msg + ": " + ev.error_message;
}

// A client of the --zmq endpoint, with the API key and (a CURVE server) its public key.
StatusOr<std::unique_ptr<ZmqClient>> zmq_client(const Options& o) {
  ZmqClientOptions zo;
  zo.api_key = o.api_key;
  if (!o.curve_server_key_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(zo.curve_server_public_key,
                             read_curve_key_file(o.curve_server_key_file, "--curve-server-key-file"));
  }
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<ZmqClient> client, ZmqClient::connect(o.zmq, zo));
  return client;
}

StatusOr<Outcome> complete_zmq(const Options& o) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<ZmqClient> client, zmq_client(o));
  const ZmqRequestKind kind = is_chat(o) ? ZmqRequestKind::kChat : ZmqRequestKind::kCompletion;
  auto submitted = client->submit(kind, request_body(o, false).dump());
  if (!submitted.is_ok()) return submitted.status().with_context(o.zmq);
  const uint64_t id = submitted.value();
  Outcome out;
  while (true) {
    auto ev = client->next_event(timeout_of(o));
    if (!ev.is_ok()) return ev.status().with_context(o.zmq);
    if (ev->request_id != id) continue;
    switch (ev->kind) {
      case ZmqClientEvent::Kind::kDelta:
        if (ev->index == 0) {
          out.text += ev->text;
          if (!o.no_stream) print_piece(o, ev->text);
          if (!ev->reasoning.empty()) {
            out.reasoning = out.reasoning.value_or("") + ev->reasoning;
            if (!o.no_stream) print_thoughts(o, ev->reasoning);
          }
        }
        break;
      case ZmqClientEvent::Kind::kFinal: {
        if (!ev->finish_reasons.empty()) out.finish_reason = ev->finish_reasons[0];
        const int completion = ev->completion_tokens.empty() ? 0 : ev->completion_tokens[0];
        out.usage = {{"prompt_tokens", ev->prompt_tokens},
                     {"completion_tokens", completion},
                     {"total_tokens", ev->prompt_tokens + completion}};
        if (o.no_stream) {
          print_thoughts(o, out.reasoning.value_or(""));
          print_piece(o, out.text);
        }
        return out;
      }
      case ZmqClientEvent::Kind::kError: {
        return invalid_argument(zmq_error_text(o, *ev));
      }
    }
  }
}

Status run_completion(const Options& o) {
  TESSERA_ASSIGN_OR_RETURN(Outcome out, o.zmq.empty() ? complete_http(o) : complete_zmq(o));
  if (o.json) {
    json j = {{"text", out.text},
              {"reasoning", out.reasoning ? json(*out.reasoning) : json(nullptr)},
              {"finish_reason", out.finish_reason.empty() ? json(nullptr) : json(out.finish_reason)},
              {"usage", out.usage}};
    std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << std::endl;
  } else {
    std::cout << std::endl;
  }
  return Status::ok();
}

json embeddings_body(const Options& o) {
  json body = {{"input", o.texts}};
  if (!o.model.empty()) body["model"] = o.model;
  if (o.dimensions) body["dimensions"] = *o.dimensions;
  return body;
}

// The vectors of o.texts, in order, and the prompt tokens they took.
StatusOr<std::pair<std::vector<std::vector<float>>, int>> embed(const Options& o) {
  std::vector<std::vector<float>> vectors;
  if (o.zmq.empty()) {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<HttpClient> client, http_client(o));
    const std::string where = "POST " + o.url + "/v1/embeddings";
    TESSERA_ASSIGN_OR_RETURN(HttpResponse r, client->post_json("/v1/embeddings", embeddings_body(o).dump()));
    if (r.status != 200) return invalid_argument(where + ": " + describe_error_response(r));
    const json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("data") || !j["data"].is_array())
      return internal_error(where + ": the answer has no 'data' list: " + r.body.substr(0, 200));
    for (const json& item : j["data"]) vectors.push_back(item.value("embedding", std::vector<float>{}));
    return std::make_pair(std::move(vectors), j.contains("usage") ? j["usage"].value("prompt_tokens", 0) : 0);
  }
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<ZmqClient> client, zmq_client(o));
  auto submitted = client->submit(ZmqRequestKind::kEmbeddings, embeddings_body(o).dump());
  if (!submitted.is_ok()) return submitted.status().with_context(o.zmq);
  while (true) {
    auto ev = client->next_event(timeout_of(o));
    if (!ev.is_ok()) return ev.status().with_context(o.zmq);
    if (ev->request_id != submitted.value()) continue;
    if (ev->kind == ZmqClientEvent::Kind::kError) return invalid_argument(zmq_error_text(o, *ev));
    if (ev->kind == ZmqClientEvent::Kind::kFinal) return std::make_pair(std::move(ev->embeddings), ev->prompt_tokens);
  }
}

// One line of space-separated values per text (--json: {"embeddings": [[...]], "prompt_tokens"}).
Status run_embed(const Options& o) {
  TESSERA_ASSIGN_OR_RETURN(auto result, embed(o));
  const auto& [vectors, prompt_tokens] = result;
  if (o.json) {
    std::cout << json{{"embeddings", vectors}, {"prompt_tokens", prompt_tokens}}.dump() << std::endl;
    return Status::ok();
  }
  for (const std::vector<float>& v : vectors) {
    for (size_t i = 0; i < v.size(); ++i) std::cout << (i > 0 ? " " : "") << v[i];
    std::cout << "\n";
  }
  std::cout << std::flush;
  return Status::ok();
}

Status run_get(const Options& o) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<HttpClient> client, http_client(o));
  const std::string path = o.command == Command::kModels ? "/v1/models" : "/health";
  TESSERA_ASSIGN_OR_RETURN(HttpResponse r, client->get(path));
  if (r.status != 200) return invalid_argument("GET " + o.url + path + ": " + describe_error_response(r));
  const json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (o.json || !j.is_object()) {
    std::cout << r.body << std::endl;
  } else if (o.command == Command::kModels) {
    for (const json& m : j.value("data", json::array())) std::cout << string_or_empty(m, "id") << "\n";
    std::cout << std::flush;
  } else {
    std::cout << string_or_empty(j, "status") << std::endl;
  }
  return Status::ok();
}

// Flags of `complete` and `chat`.
void add_generation_options(CLI::App* sub, Options& o) {
  sub->add_option("--model", o.model, "model name (default: the served model)");
  sub->add_option("--max-tokens", o.max_tokens, "most tokens to generate (default: the server's)");
  sub->add_option("--temperature", o.temperature, "sampling temperature, 0 = greedy (default: the server's)");
  sub->add_option("--top-p", o.top_p, "nucleus sampling mass (default: the server's)");
  sub->add_option("--top-k", o.top_k, "sample from the k most likely tokens (default: the server's)");
  sub->add_option("--seed", o.seed, "random seed for sampling (default: none)");
  sub->add_option("--stop", o.stop, "text that ends the output, not printed (repeatable) (default: none)");
  sub->add_flag("--no-stream", o.no_stream, "wait for the whole answer instead of streaming it");
}

int usage_error(const std::string& message) {
  std::cerr << "tessera-cli: " << message << " (see tessera-cli --help)" << std::endl;
  return 2;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  using tessera::Command;
  tessera::Options o;
  for (const char* var : {"TESSERA_API_KEY", "OPENAI_API_KEY"}) {
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0' && o.api_key.empty()) o.api_key = v;
  }
  CLI::App app{"tessera-cli: completions, chat, embeddings, models and health of a running Tessera server"};
  app.require_subcommand(1);
  app.fallthrough();
  auto* url = app.add_option("--url", o.url, "server URL, http://HOST:PORT")->capture_default_str();
  auto* zmq = app.add_option("--zmq", o.zmq, "use the ZeroMQ client API at this endpoint (tcp://HOST:PORT, ipc://PATH)")
                  ->excludes(url);
  app.add_option("--curve-server-key-file", o.curve_server_key_file,
                 "with --zmq: the server's CURVE public key file (server.curve.server_public_key_file) when "
                 "server.curve.client_api encrypts the ZeroMQ client API")
      ->needs(zmq);
  app.add_option("--api-key", o.api_key,
                 "API key: HTTP Authorization: Bearer, or the ZeroMQ request's key (default: $TESSERA_API_KEY or "
                 "$OPENAI_API_KEY)");
  app.add_option("--timeout", o.timeout_s, "seconds to wait for the server (connecting, each piece of the answer)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", o.json, "print one JSON object at the end instead of the text");

  auto* complete = app.add_subcommand("complete", "text completion of PROMPT (POST /v1/completions)");
  complete->add_option("PROMPT", o.input, "the prompt text")->required();
  auto* chat = app.add_subcommand("chat", "one chat turn (POST /v1/chat/completions)");
  chat->add_option("MESSAGE", o.input, "the user's message")->required();
  chat->add_option("--system", o.system, "a system message before it (default: none)");
  for (CLI::App* sub : {complete, chat}) {
    sub->fallthrough();
    tessera::add_generation_options(sub, o);
  }
  auto* embed = app.add_subcommand("embed", "one embedding per TEXT, a line of numbers each (POST /v1/embeddings)");
  embed->add_option("TEXT", o.texts, "the texts to embed")->required();
  embed->add_option("--model", o.model, "model name (default: the served model)");
  embed->add_option("--dimensions", o.dimensions, "keep the first N values, then normalise (default: all)")
      ->check(CLI::PositiveNumber);
  embed->fallthrough();
  auto* models = app.add_subcommand("models", "list the served models (GET /v1/models)");
  auto* health = app.add_subcommand("health", "the server's health (GET /health)");
  models->fallthrough();
  health->fallthrough();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    return tessera::usage_error(e.what());
  }
  if (complete->parsed()) o.command = Command::kComplete;
  if (chat->parsed()) o.command = Command::kChat;
  if (embed->parsed()) o.command = Command::kEmbed;
  if (models->parsed()) o.command = Command::kModels;
  if (health->parsed()) o.command = Command::kHealth;
  if (!o.zmq.empty() && (o.command == Command::kModels || o.command == Command::kHealth)) {
    return tessera::usage_error(std::string(o.command == Command::kModels ? "models" : "health") +
                                " works over HTTP only (--url), not --zmq");
  }

  const bool completion = o.command == Command::kComplete || o.command == Command::kChat;
  const tessera::Status st = completion                       ? tessera::run_completion(o)
                             : o.command == Command::kEmbed ? tessera::run_embed(o)
                                                            : tessera::run_get(o);
  if (!st.is_ok()) {
    if (tessera::printed_text) std::cout << std::endl;
    std::cerr << "tessera-cli: " << st.message() << std::endl;
    return 1;
  }
  return 0;
}
