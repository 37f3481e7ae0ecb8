#pragma once
// What a step costs as a function of the rows (tokens) it carries, measured on the executors
// at start-up (measure_row_costs in engine_warm_up.h), for speculative decoding's back-off.
//
// Checking k proposals adds k rows to a sequence's step. While a step is bound by reading the
// weights, a row more costs little; once the rows fill the device's compute, each costs its
// full share, and a proposal is worth its row only when it is likely to be accepted. Where
// that happens differs by device and model (on 2 CPU cores a ~300 MB model's step of 8 rows
// takes 1.6x one row's; a GPU's stays nearly flat far longer), so it is measured, not
// assumed: steps of 1, 2, 4, ... rows, each timed by the executor, their medians kept here.
#include <string>
#include <utility>
#include <vector>

namespace tessera {

class RowCostCurve {
 public:
  // A measured point: a step of `rows` rows took `seconds`. Points may come in any order;
  // each rows count keeps its last point.
  void add(int rows, double seconds);
  bool empty() const { return measured_.empty(); }
  // The points the curve is drawn through: the lower convex hull of the measured ones, its
  // slopes at least 0. A row more never costs less than the one before it (steps go from
  // reading the weights to filling the compute), so a point above that hull is taken for noise
  // (on 2 CPU cores one median of three came out 26.5 ms at 4 rows against 11.7 at 2 and 26.5
  // at 8), as is one below an earlier smaller step's time.
  const std::vector<std::pair<int, double>>& points() const { return points_; }
  const std::vector<std::pair<int, double>>& measured() const { return measured_; }

  // The predicted time of a step of `rows` (> 0) rows: linear between measured points,
  // extended past the last with the last segment's slope and below the first as flat.
  // 0 for an empty curve.
  double seconds(double rows) const;
  // What one row more costs at a step of `rows` rows: the slope of the segment holding
  // rows (the last segment's past the end); 0 for a curve of fewer than two points.
  double marginal_seconds(double rows) const;
  // The most measured rows whose step the curve puts at most kNearlyFree times a one-row
  // step's (the first point's): where checking proposals stops being nearly free, for logs and
  // tessera-bench (the back-off itself reads the whole curve). 0 when empty.
  static constexpr double kNearlyFree = 1.25;
  int nearly_free_rows() const;
  // The measured points, "1: 12.3 ms, 2: 13.5 ms, ...", for the start-up log.
  std::string describe() const;

 private:
  std::vector<std::pair<int, double>> measured_;  // sorted by rows
  std::vector<std::pair<int, double>> points_;    // points(): the hull, sorted by rows
};

}  // namespace tessera
