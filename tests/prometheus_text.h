#pragma once
// A small parser for the Prometheus text exposition format (version 0.0.4), for tests that
// read /metrics the way a scraper does: every line must parse, every sample must belong to
// the family its "# TYPE" line declared before it (histograms: NAME_bucket with an "le"
// label, NAME_sum, NAME_count), and each histogram's buckets must be cumulative with the
// "+Inf" bucket equal to its count. Anything else is an error naming the line.
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tessera::testing {

using PromLabels = std::map<std::string, std::string>;

struct PromSample {
  std::string name;  // as written: "vllm:e2e_request_latency_seconds_bucket"
  PromLabels labels;
  double value = 0;
};

struct PromPage {
  std::map<std::string, std::string> types;  // family name -> counter | gauge | histogram | summary | untyped
  std::map<std::string, std::string> help;   // family name -> its HELP text
  std::vector<PromSample> samples;

  // Sum of the samples named `name` whose labels include every label of `match`.
  double value(const std::string& name, const PromLabels& match = {}) const;
  // How many samples named `name` have every label of `match`.
  int count(const std::string& name, const PromLabels& match = {}) const;
  // The declared type of a family; "" when it has no TYPE line.
  std::string type(const std::string& family) const;
};

StatusOr<PromPage> parse_prometheus_text(std::string_view text);

}  // namespace tessera::testing
