#include "coordinator/engine/step_cost_model.h"

#include <algorithm>
#include <cmath>

namespace tessera {
namespace {

// Solves the 3×3 system A·x = b by Gaussian elimination with partial pivoting; false when A
// is singular (to rounding).
bool solve3(std::array<std::array<double, 3>, 3> a, std::array<double, 3> b, std::array<double, 3>* x) {
  for (int col = 0; col < 3; ++col) {
    int pivot = col;
    for (int r = col + 1; r < 3; ++r)
      if (std::abs(a[r][col]) > std::abs(a[pivot][col])) pivot = r;
    if (!(std::abs(a[pivot][col]) > 1e-300)) return false;
    std::swap(a[col], a[pivot]);
    std::swap(b[col], b[pivot]);
    for (int r = col + 1; r < 3; ++r) {
      const double f = a[r][col] / a[col][col];
      for (int c = col; c < 3; ++c) a[r][c] -= f * a[col][c];
      b[r] -= f * b[col];
    }
  }
  for (int r = 2; r >= 0; --r) {
    double v = b[r];
    for (int c = r + 1; c < 3; ++c) v -= a[r][c] * (*x)[c];
    (*x)[r] = v / a[r][r];
  }
  return std::isfinite((*x)[0]) && std::isfinite((*x)[1]) && std::isfinite((*x)[2]);
}

}  // namespace

void StepCostModel::observe(int decodes, int prefill_tokens, double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds) || decodes < 0 || prefill_tokens < 0) return;
  if (decodes == 0 && prefill_tokens == 0) return;  // nothing a cap could be learned from
  Sample& slot = window_[static_cast<size_t>(next_)];
  slot = Sample{static_cast<double>(decodes), static_cast<double>(prefill_tokens), seconds};
  uint64_t& seen = prefill_tokens > 0 ? with_prefill_ : without_prefill_;
  seen += 1;
  next_ = (next_ + 1) % kWindow;
  size_ = std::min(size_ + 1, kWindow);
  refit();
}

void StepCostModel::huber_weights(const std::array<double, 3>& fit, std::array<double, kWindow>* weight) const {
  std::array<double, kWindow> relative{};
  for (int i = 0; i < size_; ++i) {
    const Sample& s = window_[static_cast<size_t>(i)];
    const double predicted = fit[0] + fit[1] * s.decodes + fit[2] * s.prefill;
    relative[static_cast<size_t>(i)] = std::abs(s.seconds - predicted) / std::max(predicted > 0 ? predicted : s.seconds, 1e-9);
  }
  std::array<double, kWindow> sorted = relative;
  const auto mid = sorted.begin() + size_ / 2;
  std::nth_element(sorted.begin(), mid, sorted.begin() + size_);
  // 1.4826 × the median absolute residual estimates the noise's standard deviation; a
  // floor of 1% keeps an exact window (synthetic steps, tests) unweighted.
  const double bound = kHuberK * std::max(1.4826 * *mid, 0.01);
  for (int i = 0; i < size_; ++i) {
    const double r = relative[static_cast<size_t>(i)];
    (*weight)[static_cast<size_t>(i)] = r <= bound ? 1.0 : bound / r;
  }
}

void StepCostModel::refit() {
  // Least squares over the window, with a ridge term pulling each coefficient towards the
  // previous fit: weight 1e-3 of the feature's (weighted) mean square, enough to pin down a
  // direction the window does not vary in (its coefficient then stays the last one seen)
  // without biasing one it does.
  //
  // Reweighted (Huber, on relative residuals): a step the host stalled (measured at
  // 1 request/s: 145 ms for a step predicted at 60) must not drag the fit. Plain least
  // squares let that one step, among a few with three decodes, turn the lone decode step into
  // 3.6 ms (it is 7) and the per-decode cost into 6.5 ms, and the budgets built on it then fed
  // a prompt one token per step. Residuals are relative to the prediction because noise
  // scales with a step's length (a 128-token prompt's step varies by tens of milliseconds
  // where a decode step varies by one); so a down-weighted step pulls the fit by at most the
  // bound times its predicted time, however long the stall.
  const std::array<double, 3> prior = {fit_.base, fit_.per_decode, fit_.per_prefill_token};
  // Each pass weighs the steps by their residuals against the fit so far, starting from the
  // previous one: a new outlier is judged against the fit it would drag, not against a fit
  // it has already dragged (one stalled step of a rare kind has the leverage to pull an
  // unweighted fit onto itself). From no prior every step weighs the same.
  std::array<double, 3> x = prior;
  std::array<double, kWindow> weight{};
  bool solved = false;
  for (int pass = 0; pass < kRobustPasses; ++pass) {
    huber_weights(x, &weight);
    std::array<std::array<double, 3>, 3> a{};
    std::array<double, 3> b{};
    for (int i = 0; i < size_; ++i) {
      const Sample& s = window_[static_cast<size_t>(i)];
      const double w = weight[static_cast<size_t>(i)];
      const std::array<double, 3> f = {1.0, s.decodes, s.prefill};
      for (int r = 0; r < 3; ++r) {
        for (int c = 0; c < 3; ++c) a[r][c] += w * f[r] * f[c];
        b[r] += w * f[r] * s.seconds;
      }
    }
    for (int r = 0; r < 3; ++r) {
      const double ridge = 1e-3 * a[r][r] / std::max(size_, 1) + 1e-12;
      a[r][r] += ridge;
      b[r] += ridge * prior[r];
    }
    std::array<double, 3> next{};
    if (!solve3(a, b, &next)) break;
    x = next;
    solved = true;
  }
  // The lone decode step, measured where the window has enough of them (light load, where
  // the fit's base + per-decode split is least determined): their median, which no stall
  // moves; kept when they have left the window (lone_decode_seconds says why).
  std::array<double, kWindow> lone{};
  int lone_steps = 0;
  for (int i = 0; i < size_; ++i) {
    const Sample& s = window_[static_cast<size_t>(i)];
    if (s.decodes == 1 && s.prefill == 0) lone[static_cast<size_t>(lone_steps++)] = s.seconds;
  }
  if (lone_steps >= kMinSteps) {
    const auto mid = lone.begin() + lone_steps / 2;
    std::nth_element(lone.begin(), mid, lone.begin() + lone_steps);
    fit_.measured_lone_decode = *mid;
  }
  if (!solved) return;
  fit_.base = x[0];
  fit_.per_decode = x[1];
  fit_.per_prefill_token = x[2];
  fit_.valid = with_prefill_ >= kMinSteps && without_prefill_ >= kMinSteps;
}

std::optional<int> StepCostModel::prefill_cap(int decodes, double slowdown) const {
  const std::optional<double> alone = decodes_alone_seconds(decodes);
  if (!(slowdown > 1.0) || !alone) return std::nullopt;
  return prefill_tokens_within(decodes, slowdown * *alone);
}

std::optional<int> StepCostModel::prefill_tokens_within(int decodes, double seconds) const {
  if (!fit_.valid || decodes <= 0 || std::isnan(seconds) || !(fit_.per_prefill_token > 0)) return std::nullopt;
  const std::optional<double> predicted = decodes_alone_seconds(decodes);
  if (!predicted) return std::nullopt;
  const double alone = *predicted;
  const double tokens = (seconds - alone) / fit_.per_prefill_token;
  if (tokens >= 1e9) return std::nullopt;
  return std::max(1, static_cast<int>(tokens));
}

std::optional<double> StepCostModel::decodes_alone_seconds(int decodes) const {
  const std::optional<double> lone = lone_decode_seconds();
  if (!lone || decodes <= 0) return std::nullopt;
  const double per_decode = std::clamp(fit_.per_decode, 0.0, 2.0 * std::max(0.0, fit_.per_prefill_token));
  const double t = *lone + per_decode * (decodes - 1);
  if (!(t > 0)) return std::nullopt;
  return t;
}

std::optional<double> StepCostModel::lone_decode_seconds() const {
  const double t = fit_.measured_lone_decode > 0 ? fit_.measured_lone_decode : fit_.base + fit_.per_decode;
  if (!fit_.valid || !(t > 0)) return std::nullopt;
  return t;
}

}  // namespace tessera
