#include "tools/loadgen/arrival.h"

#include "tools/loadgen/random.h"

namespace tessera::loadgen {

StatusOr<ArrivalKind> parse_arrival_kind(const std::string& text) {
  if (text == "poisson") return ArrivalKind::kPoisson;
  if (text == "constant") return ArrivalKind::kConstant;
  return invalid_argument("--arrival '" + text + "': expected poisson or constant");
}

std::string arrival_name(const ArrivalOptions& options) {
  std::string name = options.kind == ArrivalKind::kPoisson ? "poisson" : "constant";
  if (options.burst > 1) name += "-burst" + std::to_string(options.burst);
  return name;
}

double ArrivalSchedule::next() {
  const int64_t i = issued_++;
  const int64_t burst = options_.burst > 1 ? options_.burst : 1;
  if (i > 0 && i % burst == 0) {
    const int64_t gap_index = i / burst - 1;
    const double mean_gap = static_cast<double>(burst) / options_.rate;
    if (options_.kind == ArrivalKind::kPoisson) {
      Random rng(options_.seed, kStreamArrival, static_cast<uint64_t>(gap_index));
      group_time_ += mean_gap * rng.exponential();
    } else {
      group_time_ = mean_gap * static_cast<double>(i / burst);
    }
  }
  return group_time_;
}

std::vector<double> arrival_times(const ArrivalOptions& options, int count) {
  ArrivalSchedule schedule(options);
  std::vector<double> out;
  out.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) out.push_back(schedule.next());
  return out;
}

}  // namespace tessera::loadgen
