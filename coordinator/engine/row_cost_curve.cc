#include "coordinator/engine/row_cost_curve.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tessera {

void RowCostCurve::add(int rows, double seconds) {
  if (rows <= 0 || !std::isfinite(seconds) || seconds < 0) return;
  auto at = std::lower_bound(measured_.begin(), measured_.end(), rows,
                             [](const std::pair<int, double>& p, int r) { return p.first < r; });
  if (at != measured_.end() && at->first == rows) {
    at->second = seconds;
  } else {
    measured_.insert(at, {rows, seconds});
  }
  // The lower convex hull (monotone chain), then no slope below 0: a larger step measured
  // faster than a smaller one was noise, and a negative marginal cost would make proposals
  // look better than free.
  points_.clear();
  for (const auto& p : measured_) {
    while (points_.size() >= 2) {
      const auto& [r0, t0] = points_[points_.size() - 2];
      const auto& [r1, t1] = points_.back();
      // Drop the middle point when it lies on or above the line from r0 to p.
      if ((t1 - t0) * (p.first - r0) >= (p.second - t0) * (r1 - r0)) {
        points_.pop_back();
      } else {
        break;
      }
    }
    points_.push_back(p);
  }
  for (size_t i = 1; i < points_.size(); ++i) points_[i].second = std::max(points_[i].second, points_[i - 1].second);
}

double RowCostCurve::seconds(double rows) const {
  if (points_.empty()) return 0;
  if (rows <= points_.front().first) return points_.front().second;
  size_t i = 1;
  while (i + 1 < points_.size() && points_[i].first < rows) ++i;
  if (points_.size() == 1) return points_.front().second;
  const auto& [r0, t0] = points_[i - 1];
  const auto& [r1, t1] = points_[i];
  return t0 + (t1 - t0) * (rows - r0) / (r1 - r0);
}

double RowCostCurve::marginal_seconds(double rows) const {
  if (points_.size() < 2) return 0;
  size_t i = 1;
  while (i + 1 < points_.size() && points_[i].first <= rows) ++i;
  const auto& [r0, t0] = points_[i - 1];
  const auto& [r1, t1] = points_[i];
  return (t1 - t0) / (r1 - r0);
}

int RowCostCurve::nearly_free_rows() const {
  int rows = 0;
  for (const auto& point : measured_) {
    if (seconds(point.first) <= kNearlyFree * points_.front().second) rows = point.first;
  }
  return rows;
}

std::string RowCostCurve::describe() const {
  std::string out;
  for (const auto& [r, t] : measured_) {
    char item[48];
    std::snprintf(item, sizeof item, "%s%d: %.1f ms", out.empty() ? "" : ", ", r, t * 1e3);
    out += item;
  }
  return out;
}

}  // namespace tessera
