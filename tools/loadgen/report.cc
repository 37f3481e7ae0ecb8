#include "tools/loadgen/report.h"

#include <cmath>
#include <cstdio>
#include <limits>

namespace tessera::loadgen {

using nlohmann::json;

namespace {

json summary_json(const Summary& s) {
  auto v = [](double x) { return std::isfinite(x) ? json(x) : json(nullptr); };
  return {{"p50", v(s.p50)}, {"p90", v(s.p90)}, {"p99", v(s.p99)}, {"max", v(s.max)},
          {"mean", v(s.mean)}, {"count", s.count}};
}

Summary summary_from_json(const json& j) {
  Summary s;
  auto v = [&](const char* key) {
    const auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : std::numeric_limits<double>::quiet_NaN();
  };
  s.p50 = v("p50");
  s.p90 = v("p90");
  s.p99 = v("p99");
  s.max = v("max");
  s.mean = v("mean");
  s.count = j.value("count", std::isfinite(s.p50) ? size_t{1} : size_t{0});
  return s;
}

std::string ms(double seconds) {
  if (!std::isfinite(seconds)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), seconds * 1e3 < 10 ? "%.2f" : "%.1f", seconds * 1e3);
  return buf;
}

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string pad(const std::string& s, size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}

}  // namespace

json run_to_json(const RunStats& s) {
  json errors = json::object();
  for (const auto& [kind, n] : s.errors) errors[kind] = n;
  json examples = json::object();
  for (const auto& [kind, message] : s.error_examples) examples[kind] = message;
  json j = {{"rate", s.rate},
            {"completed", s.completed},
            {"failed", s.failed},
            {"errors", errors},
            {"error_examples", examples},
            {"requests_per_s", s.requests_per_s},
            {"output_tokens_per_s", s.output_tokens_per_s},
            {"goodput_requests_per_s", s.goodput_requests_per_s},
            {"ttft_s", summary_json(s.ttft)},
            {"tpot_s", summary_json(s.tpot)},
            {"itl_s", summary_json(s.itl)},
            {"e2e_s", summary_json(s.e2e)},
            {"arrival", s.arrival},
            {"issued", s.issued},
            {"duration_s", s.duration_s},
            {"input_tokens", s.input_tokens},
            {"output_tokens", s.output_tokens},
            {"failed_output_tokens", s.failed_output_tokens},
            {"input_tokens_per_s", s.input_tokens_per_s},
            {"slo_met", s.slo_met},
            {"no_token_events", s.no_token_events}};
  j["concurrency"] = s.concurrency ? json(*s.concurrency) : json(nullptr);
  return j;
}

StatusOr<RunStats> run_from_json(const json& j) {
  if (!j.is_object()) return invalid_argument("a run is not a JSON object");
  for (const char* key : {"rate", "completed", "failed", "requests_per_s", "output_tokens_per_s",
                          "goodput_requests_per_s", "ttft_s", "tpot_s", "itl_s", "e2e_s"}) {
    if (!j.contains(key)) return invalid_argument(std::string("a run has no \"") + key + "\"");
  }
  RunStats s;
  try {
    s.rate = j.at("rate").get<double>();
    s.completed = j.at("completed").get<int>();
    s.failed = j.at("failed").get<int>();
    if (j.contains("errors") && j["errors"].is_object()) {
      for (const auto& [kind, n] : j["errors"].items()) s.errors[kind] = n.get<int>();
    }
    if (j.contains("error_examples") && j["error_examples"].is_object()) {
      for (const auto& [kind, m] : j["error_examples"].items()) s.error_examples[kind] = m.get<std::string>();
    }
    s.requests_per_s = j.at("requests_per_s").get<double>();
    s.output_tokens_per_s = j.at("output_tokens_per_s").get<double>();
    s.goodput_requests_per_s = j.at("goodput_requests_per_s").get<double>();
    s.ttft = summary_from_json(j.at("ttft_s"));
    s.tpot = summary_from_json(j.at("tpot_s"));
    s.itl = summary_from_json(j.at("itl_s"));
    s.e2e = summary_from_json(j.at("e2e_s"));
    s.arrival = j.value("arrival", "");
    s.issued = j.value("issued", s.completed + s.failed);
    s.duration_s = j.value("duration_s", 0.0);
    s.input_tokens = j.value("input_tokens", 0LL);
    s.output_tokens = j.value("output_tokens", 0LL);
    s.slo_met = j.value("slo_met", 0);
    if (j.contains("concurrency") && j["concurrency"].is_number_integer()) s.concurrency = j["concurrency"].get<int>();
  } catch (const json::exception& e) {
    return invalid_argument(std::string("a run has a value of the wrong type: ") + e.what());
  }
  return s;
}

std::string format_table(const std::vector<RunStats>& runs, const std::string& label_header,
                         const std::vector<std::string>& labels) {
  const std::vector<std::pair<std::string, size_t>> cols = {
      {"rate", 7},        {"done", 6},       {"fail", 5},       {"req/s", 7},     {"out tok/s", 9},
      {"goodput", 7},     {"TTFT p50", 9},   {"TTFT p99", 9},   {"TPOT p50", 9},  {"TPOT p99", 9},
      {"ITL p99", 8},     {"E2E p50", 8},    {"E2E p99", 8}};
  size_t label_width = label_header.size();
  for (const std::string& l : labels) label_width = std::max(label_width, l.size());
  std::string out;
  if (!labels.empty()) out += label_header + std::string(label_width - label_header.size(), ' ') + " ";
  for (const auto& [name, w] : cols) out += pad(name, w) + " ";
  out += " errors\n";
  if (!labels.empty()) out += std::string(label_width, ' ') + " ";
  const std::vector<std::string> units = {"req/s", "", "", "", "", "req/s", "ms", "ms", "ms", "ms", "ms", "s", "s"};
  for (size_t c = 0; c < cols.size(); ++c) out += pad(units[c], cols[c].second) + " ";
  out += "\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunStats& s = runs[i];
    if (!labels.empty()) {
      const std::string& l = i < labels.size() ? labels[i] : std::string();
      out += l + std::string(label_width - l.size(), ' ') + " ";
    }
    const std::vector<std::string> v = {
        s.concurrency ? "c=" + std::to_string(*s.concurrency) : fixed(s.rate, 2),
        std::to_string(s.completed),
        std::to_string(s.failed),
        fixed(s.requests_per_s, 2),
        fixed(s.output_tokens_per_s, 1),
        fixed(s.goodput_requests_per_s, 2),
        ms(s.ttft.p50),
        ms(s.ttft.p99),
        ms(s.tpot.p50),
        ms(s.tpot.p99),
        ms(s.itl.p99),
        fixed(s.e2e.p50, 2),
        fixed(s.e2e.p99, 2)};
    for (size_t c = 0; c < cols.size(); ++c) out += pad(v[c], cols[c].second) + " ";
    std::string errors;
    for (const auto& [kind, n] : s.errors) errors += (errors.empty() ? " " : ", ") + kind + " " + std::to_string(n);
    out += errors.empty() ? " -" : errors;
    out += "\n";
  }
  // What the failures said (the first of each kind per run): a count alone cannot tell a
  // server's refusal from a client's bug.
  for (size_t i = 0; i < runs.size(); ++i) {
    for (const auto& [kind, message] : runs[i].error_examples) {
      out += "  " + (runs[i].concurrency ? "c=" + std::to_string(*runs[i].concurrency) : "rate " + fixed(runs[i].rate, 2)) +
             ", first " + kind + ": " + message.substr(0, 300) + "\n";
    }
  }
  return out;
}

}  // namespace tessera::loadgen
