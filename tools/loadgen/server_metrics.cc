#include "tools/loadgen/server_metrics.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <sstream>

#include "tools/client/http_client.h"

namespace tessera::loadgen {

ServerCounters parse_server_counters(const std::string& text) {
  ServerCounters c;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string::npos) continue;
    const std::string name = line.substr(0, name_end);
    std::string labels;
    size_t value_at = name_end;
    if (line[name_end] == '{') {
      const size_t close = line.find('}', name_end);
      if (close == std::string::npos) continue;
      labels = line.substr(name_end + 1, close - name_end - 1);
      value_at = close + 1;
    }
    double value = 0;
    try {
      value = std::stod(line.substr(value_at));
    } catch (...) {
      continue;
    }
    if (name == "tessera:prompt_tokens_total") {
      c.prompt_tokens += value;
    } else if (name == "tessera:generation_tokens_total") {
      c.generation_tokens += value;
    } else if (name == "tessera:request_success_total") {
      c.request_success += value;
    } else if (name == "tessera:request_failure_total") {
      c.request_failure += value;
    } else if (name == "tessera:http_responses_total") {
      const size_t at = labels.find("code=\"");
      if (at == std::string::npos) continue;
      const size_t end = labels.find('"', at + 6);
      c.http_responses[labels.substr(at + 6, end - at - 6)] += value;
    } else {
      continue;
    }
    c.found = true;
  }
  return c;
}

StatusOr<ServerCounters> scrape_server_counters(const std::string& url) {
  HttpClientOptions co;
  co.user_agent = "tessera-loadgen";
  co.timeout = std::chrono::seconds(10);
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<HttpClient> client, HttpClient::create(url, co));
  TESSERA_ASSIGN_OR_RETURN(HttpResponse r, client->get("/metrics"));
  if (r.status != 200) return invalid_argument("GET " + url + "/metrics: " + describe_error_response(r));
  return parse_server_counters(r.body);
}

std::string counters_delta_json(const ServerCounters& before, const ServerCounters& after) {
  auto n = [](double v) { return static_cast<long long>(std::llround(v)); };
  nlohmann::json j = {{"prompt_tokens", n(after.prompt_tokens - before.prompt_tokens)},
                      {"generation_tokens", n(after.generation_tokens - before.generation_tokens)},
                      {"request_success", n(after.request_success - before.request_success)},
                      {"request_failure", n(after.request_failure - before.request_failure)}};
  nlohmann::json codes = nlohmann::json::object();
  for (const auto& [code, v] : after.http_responses) {
    const auto it = before.http_responses.find(code);
    const long long d = n(v - (it == before.http_responses.end() ? 0 : it->second));
    if (d != 0) codes[code] = d;
  }
  j["http_responses"] = codes;
  return j.dump();
}

}  // namespace tessera::loadgen
