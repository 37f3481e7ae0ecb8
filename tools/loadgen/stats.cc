#include "tools/loadgen/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace tessera::loadgen {
namespace {

// "500ms" -> 0.5; plain numbers are seconds.
std::optional<double> parse_seconds(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    return std::nullopt;
  }
  const std::string unit = text.substr(used);
  double scale = 1;
  if (unit.empty() || unit == "s") {
    scale = 1;
  } else if (unit == "ms") {
    scale = 1e-3;
  } else if (unit == "us") {
    scale = 1e-6;
  } else {
    return std::nullopt;
  }
  if (!std::isfinite(v) || v <= 0) return std::nullopt;
  return v * scale;
}

}  // namespace

StatusOr<Slo> parse_slo(const std::string& text) {
  Slo slo;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string part = text.substr(start, comma - start);
    start = comma + 1;
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    if (eq == std::string::npos) return invalid_argument("--slo '" + part + "': expected KEY=VALUE (e.g. ttft=500ms)");
    const std::string key = part.substr(0, eq);
    const auto value = parse_seconds(part.substr(eq + 1));
    if (!value) {
      return invalid_argument("--slo " + key + ": '" + part.substr(eq + 1) +
                              "' is not a positive time (seconds, or with s / ms / us)");
    }
    if (key == "ttft") {
      slo.ttft_s = value;
    } else if (key == "tpot") {
      slo.tpot_s = value;
    } else if (key == "itl") {
      slo.itl_s = value;
    } else if (key == "e2e") {
      slo.e2e_s = value;
    } else {
      return invalid_argument("--slo: unknown key '" + key + "' (expected ttft, tpot, itl or e2e)");
    }
  }
  return slo;
}

bool meets_slo(const RequestRecord& r, const Slo& slo) {
  if (!r.ok) return false;
  const bool needs_tokens = slo.ttft_s || slo.tpot_s || slo.itl_s;
  if (needs_tokens && !r.has_first_token()) return false;
  if (slo.ttft_s && r.ttft_s() > *slo.ttft_s) return false;
  if (slo.tpot_s && r.has_tpot() && r.tpot_s() > *slo.tpot_s) return false;
  if (slo.itl_s) {
    for (size_t i = 1; i < r.token_times_s.size(); ++i) {
      if (r.token_times_s[i] - r.token_times_s[i - 1] > *slo.itl_s) return false;
    }
  }
  if (slo.e2e_s && r.e2e_s() > *slo.e2e_s) return false;
  return true;
}

double percentile(const std::vector<double>& sorted, double q) {
  const double h = (static_cast<double>(sorted.size()) - 1) * q / 100.0;
  const size_t lo = static_cast<size_t>(std::floor(h));
  if (lo + 1 >= sorted.size()) return sorted.back();
  return sorted[lo] + (h - static_cast<double>(lo)) * (sorted[lo + 1] - sorted[lo]);
}

Summary summarize(std::vector<double> values) {
  Summary s;
  s.count = values.size();
  if (values.empty()) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    s.p50 = s.p90 = s.p99 = s.max = s.mean = nan;
    return s;
  }
  std::sort(values.begin(), values.end());
  s.p50 = percentile(values, 50);
  s.p90 = percentile(values, 90);
  s.p99 = percentile(values, 99);
  s.max = values.back();
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  return s;
}

RunStats compute_stats(const std::vector<RequestRecord>& records, const Slo& slo, double duration_s) {
  RunStats st;
  st.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestRecord& r : records) {
    ++st.issued;
    if (!r.ok) {
      ++st.failed;
      const std::string kind = r.error_kind.empty() ? "unknown" : r.error_kind;
      ++st.errors[kind];
      st.error_examples.emplace(kind, r.error_message);
      st.failed_output_tokens += r.output_tokens;
      continue;
    }
    ++st.completed;
    st.input_tokens += r.input_tokens;
    st.output_tokens += r.output_tokens;
    if (meets_slo(r, slo)) ++st.slo_met;
    e2e.push_back(r.e2e_s());
    if (!r.has_first_token()) {
      ++st.no_token_events;
      continue;
    }
    ttft.push_back(r.ttft_s());
    if (r.has_tpot()) tpot.push_back(r.tpot_s());
    for (size_t i = 1; i < r.token_times_s.size(); ++i) itl.push_back(r.token_times_s[i] - r.token_times_s[i - 1]);
  }
  if (duration_s > 0) {
    st.requests_per_s = st.completed / duration_s;
    st.input_tokens_per_s = static_cast<double>(st.input_tokens) / duration_s;
    st.output_tokens_per_s = static_cast<double>(st.output_tokens) / duration_s;
    st.goodput_requests_per_s = st.slo_met / duration_s;
  }
  st.ttft = summarize(std::move(ttft));
  st.tpot = summarize(std::move(tpot));
  st.itl = summarize(std::move(itl));
  st.e2e = summarize(std::move(e2e));
  return st;
}

SloThroughput throughput_at_p99_ttft(std::vector<RunStats> runs, double ttft_slo_s) {
  std::sort(runs.begin(), runs.end(), [](const RunStats& a, const RunStats& b) { return a.rate < b.rate; });
  auto meets = [&](const RunStats& r) { return r.ttft.count > 0 && r.ttft.p99 <= ttft_slo_s; };
  SloThroughput best;
  auto consider = [&](double rate, double rps, double tps) {
    if (!best.found || tps > best.output_tokens_per_s) best = {true, rate, rps, tps};
  };
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunStats& a = runs[i];
    if (!meets(a)) continue;
    consider(a.rate, a.requests_per_s, a.output_tokens_per_s);
    if (i + 1 < runs.size() && runs[i + 1].ttft.count > 0 && !meets(runs[i + 1])) {
      const RunStats& b = runs[i + 1];
      const double f = (ttft_slo_s - a.ttft.p99) / (b.ttft.p99 - a.ttft.p99);
      consider(a.rate + f * (b.rate - a.rate), a.requests_per_s + f * (b.requests_per_s - a.requests_per_s),
               a.output_tokens_per_s + f * (b.output_tokens_per_s - a.output_tokens_per_s));
    }
  }
  return best;
}

}  // namespace tessera::loadgen
