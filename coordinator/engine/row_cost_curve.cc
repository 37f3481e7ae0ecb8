#include "coordinator/engine/row_cost_curve.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tessera {

void RowCostCurve::add(int rows, double seconds) {
  if (rows <= 0 || !std::isfinite(seconds) || seconds < 0) return;
  auto at = std::lower_bound(points_.begin(), points_.end(), rows,
                             [](const std::pair<int, double>& p, int r) { return p.first < r; });
  if (at != points_.end() && at->first == rows) {
    at->second = seconds;
  } else {
    points_.insert(at, {rows, seconds});
  }
  // Non-decreasing from the first point on: a larger step measured faster than a smaller one
  // was noise, and a negative marginal cost would make proposals look better than free.
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
  for (const auto& [r, t] : points_) {
    if (t <= kNearlyFree * points_.front().second) rows = r;
  }
  return rows;
}

std::string RowCostCurve::describe() const {
  std::string out;
  for (const auto& [r, t] : points_) {
    char item[48];
    std::snprintf(item, sizeof item, "%s%d: %.1f ms", out.empty() ? "" : ", ", r, t * 1e3);
    out += item;
  }
  return out;
}

}  // namespace tessera
