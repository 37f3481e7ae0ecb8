#include "tools/loadgen/workload.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>

namespace tessera::loadgen {
namespace {

// Common English words for --text-prompts (one word is one to two tokens for most tokenizers).
const char* const kWords[] = {
    "the",   "of",    "and",   "to",    "in",    "is",    "that",  "for",    "it",     "as",    "was",
    "with",  "be",    "by",    "on",    "not",   "he",    "this",  "are",    "or",     "his",   "from",
    "at",    "which", "but",   "have",  "an",    "had",   "they",  "you",    "were",   "their", "one",
    "all",   "we",    "can",   "her",   "has",   "there", "been",  "if",     "more",   "when",  "will",
    "would", "who",   "so",    "no",    "time",  "people", "water", "light", "house",  "world", "day",
    "land",  "city",  "river", "king",  "word",  "book",  "night", "earth",  "heaven", "sea",   "field"};
constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);

std::optional<int> to_int(const std::string& text) {
  if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoi(text);
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t at; (at = text.find(sep, start)) != std::string::npos; start = at + 1) out.push_back(text.substr(start, at - start));
  out.push_back(text.substr(start));
  return out;
}

}  // namespace

StatusOr<LengthDist> parse_length(const std::string& flag, const std::string& text) {
  auto bad = [&](const std::string& why) {
    return invalid_argument(flag + " '" + text + "': " + why +
                            " (expected N, uniform:MIN:MAX or lognormal:MEDIAN:SIGMA[:MAX])");
  };
  LengthDist d;
  d.text = text;
  const std::vector<std::string> parts = split(text, ':');
  if (parts.size() == 1) {
    const auto n = to_int(parts[0]);
    if (!n || *n < 1) return bad("not a positive integer");
    d.kind = LengthDist::Kind::kFixed;
    d.a = d.b = *n;
    return d;
  }
  if (parts[0] == "uniform") {
    if (parts.size() != 3) return bad("uniform takes MIN:MAX");
    const auto lo = to_int(parts[1]), hi = to_int(parts[2]);
    if (!lo || !hi || *lo < 1 || *hi < *lo) return bad("need 1 <= MIN <= MAX");
    d.kind = LengthDist::Kind::kUniform;
    d.a = *lo;
    d.b = *hi;
    return d;
  }
  if (parts[0] == "lognormal") {
    if (parts.size() != 3 && parts.size() != 4) return bad("lognormal takes MEDIAN:SIGMA[:MAX]");
    const auto median = to_int(parts[1]);
    double sigma = -1;
    try {
      size_t used = 0;
      sigma = std::stod(parts[2], &used);
      if (used != parts[2].size()) sigma = -1;
    } catch (...) {
    }
    if (!median || *median < 1) return bad("MEDIAN must be a positive integer");
    if (!(sigma >= 0) || sigma > 10) return bad("SIGMA must be a number in [0, 10]");
    d.kind = LengthDist::Kind::kLogNormal;
    d.a = *median;
    d.sigma = sigma;
    d.b = 10 * *median;
    if (parts.size() == 4) {
      const auto mx = to_int(parts[3]);
      if (!mx || *mx < 1) return bad("MAX must be a positive integer");
      d.b = *mx;
    }
    return d;
  }
  return bad("unknown distribution '" + parts[0] + "'");
}

int draw_length(const LengthDist& d, Random& rng) {
  switch (d.kind) {
    case LengthDist::Kind::kFixed:
      return d.a;
    case LengthDist::Kind::kUniform:
      return static_cast<int>(rng.uniform_int(d.a, d.b));
    case LengthDist::Kind::kLogNormal: {
      const double v = std::round(d.a * std::exp(d.sigma * rng.normal()));
      return static_cast<int>(std::clamp(v, 1.0, static_cast<double>(d.b)));
    }
  }
  return d.a;
}

StatusOr<std::vector<DatasetEntry>> read_dataset(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("--dataset " + path + ": cannot open");
  std::vector<DatasetEntry> out;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number) + ": ";
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return invalid_argument(where + "not a JSON object");
    DatasetEntry e;
    const auto prompt = j.find("prompt");
    if (prompt == j.end()) return invalid_argument(where + "no \"prompt\"");
    if (prompt->is_string()) {
      e.prompt_text = prompt->get<std::string>();
      if (e.prompt_text.empty()) return invalid_argument(where + "empty \"prompt\"");
    } else if (prompt->is_array() && !prompt->empty()) {
      for (const auto& id : *prompt) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
          return invalid_argument(where + "\"prompt\" must be a string or an array of token ids");
        }
        e.prompt_ids.push_back(id.get<int32_t>());
      }
    } else {
      return invalid_argument(where + "\"prompt\" must be a string or a non-empty array of token ids");
    }
    for (const char* key : {"output_len", "max_tokens"}) {
      const auto it = j.find(key);
      if (it == j.end() || it->is_null()) continue;
      if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > 1000000) {
        return invalid_argument(where + "\"" + key + "\" must be a positive integer");
      }
      e.output_len = it->get<int>();
      break;
    }
    out.push_back(std::move(e));
  }
  if (out.empty()) return invalid_argument("--dataset " + path + ": no prompts");
  return out;
}

Workload::Workload(WorkloadOptions options, std::vector<DatasetEntry> dataset)
    : options_(std::move(options)), dataset_(std::move(dataset)) {}

RequestSpec Workload::request(int index) const {
  RequestSpec r;
  r.index = index;
  Random out_rng(options_.seed, kStreamOutputLen, static_cast<uint64_t>(index));
  if (!dataset_.empty()) {
    const DatasetEntry& e = dataset_[static_cast<size_t>(index) % dataset_.size()];
    r.prompt_ids = e.prompt_ids;
    r.prompt_text = e.prompt_text;
    r.input_len = e.prompt_ids.empty() ? 0 : static_cast<int>(e.prompt_ids.size());
    r.output_len = e.output_len > 0 ? e.output_len : draw_length(options_.output_len, out_rng);
    return r;
  }
  Random in_rng(options_.seed, kStreamInputLen, static_cast<uint64_t>(index));
  r.input_len = draw_length(options_.input_len, in_rng);
  r.output_len = draw_length(options_.output_len, out_rng);
  Random prompt_rng(options_.seed, kStreamPrompt, static_cast<uint64_t>(index));
  if (options_.text_prompts) {
    for (int i = 0; i < r.input_len; ++i) {
      if (i > 0) r.prompt_text += ' ';
      r.prompt_text += kWords[prompt_rng.uniform_int(0, kNumWords - 1)];
    }
  } else {
    r.prompt_ids.reserve(static_cast<size_t>(r.input_len));
    for (int i = 0; i < r.input_len; ++i) {
      r.prompt_ids.push_back(static_cast<int32_t>(prompt_rng.uniform_int(options_.token_min, options_.token_max)));
    }
  }
  return r;
}

}  // namespace tessera::loadgen
