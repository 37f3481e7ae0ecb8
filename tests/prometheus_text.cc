#include "tests/prometheus_text.h"

#include <cmath>
#include <cstdlib>
#include <set>

namespace tessera::testing {
namespace {

bool is_name_start(char c, bool colon_ok) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon_ok && c == ':');
}
bool is_name_char(char c, bool colon_ok) { return is_name_start(c, colon_ok) || (c >= '0' && c <= '9'); }

// Reads a metric (colon_ok) or label name at `pos`; empty when there is none.
std::string read_name(std::string_view line, size_t& pos, bool colon_ok) {
  const size_t start = pos;
  if (pos >= line.size() || !is_name_start(line[pos], colon_ok)) return "";
  while (pos < line.size() && is_name_char(line[pos], colon_ok)) ++pos;
  return std::string(line.substr(start, pos - start));
}

// A sample value: a float, or +Inf / -Inf / NaN.
bool parse_value(std::string_view text, double* out) {
  const std::string s(text);
  if (s == "+Inf" || s == "Inf") {
    *out = INFINITY;
    return true;
  }
  if (s == "-Inf") {
    *out = -INFINITY;
    return true;
  }
  if (s == "NaN") {
    *out = NAN;
    return true;
  }
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

Status line_error(int line_no, const std::string& what, std::string_view line) {
  return invalid_argument("line " + std::to_string(line_no) + ": " + what + ": '" + std::string(line) + "'");
}

// The family a sample belongs to under the TYPE lines seen so far ("" when none does).
std::string family_of(const std::string& sample, const std::map<std::string, std::string>& types) {
  if (types.count(sample)) {
    const std::string& t = types.at(sample);
    if (t == "counter" || t == "gauge" || t == "untyped") return sample;
  }
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string sfx(suffix);
    if (sample.size() <= sfx.size() || sample.compare(sample.size() - sfx.size(), sfx.size(), sfx) != 0) continue;
    const std::string base = sample.substr(0, sample.size() - sfx.size());
    auto it = types.find(base);
    if (it != types.end() && (it->second == "histogram" || (it->second == "summary" && sfx != "_bucket")))
      return base;
  }
  return "";
}

}  // namespace

double PromPage::value(const std::string& name, const PromLabels& match) const {
  double sum = 0;
  for (const PromSample& s : samples) {
    if (s.name != name) continue;
    bool all = true;
    for (const auto& [k, v] : match) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) all = false;
    }
    if (all) sum += s.value;
  }
  return sum;
}

int PromPage::count(const std::string& name, const PromLabels& match) const {
  int n = 0;
  for (const PromSample& s : samples) {
    if (s.name != name) continue;
    bool all = true;
    for (const auto& [k, v] : match) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) all = false;
    }
    if (all) ++n;
  }
  return n;
}

std::string PromPage::type(const std::string& family) const {
  auto it = types.find(family);
  return it == types.end() ? "" : it->second;
}

StatusOr<PromPage> parse_prometheus_text(std::string_view text) {
  PromPage page;
  static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary", "untyped"};
  // Histogram checks: per (family, labels without le), the buckets in order and the count.
  struct HistogramSeries {
    std::vector<std::pair<double, double>> buckets;  // (le, cumulative count)
    double count = -1;
  };
  std::map<std::pair<std::string, PromLabels>, HistogramSeries> histograms;
  int line_no = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) return invalid_argument("the last line does not end with a newline");
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (line.empty()) continue;
    if (line[0] == '#') {
      // "# HELP name text" and "# TYPE name type"; other comments are allowed.
      if (line.rfind("# HELP ", 0) != 0 && line.rfind("# TYPE ", 0) != 0) continue;
      const bool is_type = line[2] == 'T';
      size_t pos = 7;
      const std::string name = read_name(line, pos, true);
      if (name.empty() || pos >= line.size() || line[pos] != ' ') return line_error(line_no, "bad metric name", line);
      const std::string rest(line.substr(pos + 1));
      if (is_type) {
        if (!kTypes.count(rest)) return line_error(line_no, "unknown type '" + rest + "'", line);
        if (page.types.count(name)) return line_error(line_no, "second TYPE line for " + name, line);
        for (const PromSample& s : page.samples)
          if (s.name == name) return line_error(line_no, "TYPE after samples of " + name, line);
        page.types[name] = rest;
      } else {
        if (page.help.count(name)) return line_error(line_no, "second HELP line for " + name, line);
        page.help[name] = rest;
      }
      continue;
    }
    PromSample s;
    size_t pos = 0;
    s.name = read_name(line, pos, true);
    if (s.name.empty()) return line_error(line_no, "bad metric name", line);
    if (pos < line.size() && line[pos] == '{') {
      ++pos;
      while (pos < line.size() && line[pos] != '}') {
        const std::string key = read_name(line, pos, false);
        if (key.empty() || pos + 1 >= line.size() || line[pos] != '=' || line[pos + 1] != '"')
          return line_error(line_no, "bad label", line);
        pos += 2;
        std::string value;
        bool closed = false;
        while (pos < line.size()) {
          const char c = line[pos++];
          if (c == '"') {
            closed = true;
            break;
          }
          if (c == '\\') {
            if (pos >= line.size()) break;
            const char e = line[pos++];
            if (e == 'n') {
              value += '\n';
            } else if (e == '\\' || e == '"') {
              value += e;
            } else {
              return line_error(line_no, "bad escape in label value", line);
            }
            continue;
          }
          value += c;
        }
        if (!closed) return line_error(line_no, "unterminated label value", line);
        if (!s.labels.emplace(key, value).second) return line_error(line_no, "label " + key + " twice", line);
        if (pos < line.size() && line[pos] == ',') ++pos;
      }
      if (pos >= line.size()) return line_error(line_no, "unterminated label set", line);
      ++pos;  // '}'
    }
    if (pos >= line.size() || line[pos] != ' ') return line_error(line_no, "no value", line);
    std::string_view rest = line.substr(pos + 1);
    const size_t space = rest.find(' ');
    if (space != std::string_view::npos) {  // an optional timestamp (integer milliseconds)
      const std::string_view ts = rest.substr(space + 1);
      if (ts.empty() || ts.find_first_not_of("-0123456789") != std::string_view::npos)
        return line_error(line_no, "bad timestamp", line);
      rest = rest.substr(0, space);
    }
    if (!parse_value(rest, &s.value)) return line_error(line_no, "bad value", line);
    const std::string family = family_of(s.name, page.types);
    if (family.empty()) return line_error(line_no, "sample of no TYPE'd family", line);
    if (page.type(family) == "histogram") {
      PromLabels key_labels = s.labels;
      key_labels.erase("le");
      HistogramSeries& h = histograms[{family, key_labels}];
      if (s.name == family + "_bucket") {
        auto le = s.labels.find("le");
        double bound = 0;
        if (le == s.labels.end() || !parse_value(le->second, &bound))
          return line_error(line_no, "bucket without a numeric le label", line);
        if (!h.buckets.empty() && (bound <= h.buckets.back().first || s.value < h.buckets.back().second))
          return line_error(line_no, "buckets not increasing and cumulative", line);
        h.buckets.emplace_back(bound, s.value);
      } else if (s.name == family + "_count") {
        h.count = s.value;
      }
    }
    page.samples.push_back(std::move(s));
  }
  for (const auto& [key, h] : histograms) {
    if (h.buckets.empty() || !std::isinf(h.buckets.back().first))
      return invalid_argument("histogram " + key.first + " has no le=\"+Inf\" bucket");
    if (h.count != h.buckets.back().second)
      return invalid_argument("histogram " + key.first + ": the +Inf bucket differs from _count");
  }
  return page;
}

}  // namespace tessera::testing
