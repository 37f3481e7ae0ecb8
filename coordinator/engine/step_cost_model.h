#pragma once
// How long a step takes, predicted from what it carries: t ≈ a + b·decodes + c·prefill_tokens,
// a least-squares fit over the last kWindow steps the engine timed. The scheduler asks it how
// many prompt tokens a step may carry beside running decodes so that those decodes are slowed
// by at most a given factor (SchedulerConfig::max_decode_slowdown): a 128-token prompt that
// takes 370 ms on a CPU must not ride whole in a step of decodes that alone take 25 ms, or
// every running stream stalls for it (issue 17's TPOT of 250 ms at 2 requests/s).
//
// A fit, not a constant: the costs differ by device, model and load, and drift with context
// length. The window forgets old steps; a small pull towards the last good fit keeps the
// solution defined when the window lacks variety (e.g. every step carried the same chunk);
// robust weights keep a step the host stalled from dragging it.
#include <array>
#include <cstdint>
#include <optional>

namespace tessera {

class StepCostModel {
 public:
  static constexpr int kWindow = 64;
  // Steps needed, with and without prompt tokens, before prefill_cap answers (counted since
  // the start, not in the window: under load every step may carry prompt tokens, and the
  // cap must not lapse then).
  static constexpr int kMinSteps = 4;
  // Reweighted fits per step and the Huber bound, in standard
  // deviations of the steps' relative noise, past which a step's weight falls (see refit).
  static constexpr int kRobustPasses = 3;
  static constexpr double kHuberK = 2.0;

  void observe(int decodes, int prefill_tokens, double seconds);

  // The most prompt tokens a step with `decodes` decodes may add so that it is predicted to
  // take at most `slowdown` (> 1) times the decodes alone (decodes_alone_seconds); at least 1, so prompts always
  // progress. nullopt until enough steps of either kind were seen, or when the fit says
  // prompt tokens cost nothing (then no cap is needed).
  std::optional<int> prefill_cap(int decodes, double slowdown) const;

  // The most prompt tokens a step with `decodes` (> 0) decodes may add and still be predicted
  // to take at most `seconds`; at least 1 (even when the decodes alone overrun it). nullopt
  // under the same conditions as prefill_cap.
  std::optional<int> prefill_tokens_within(int decodes, double seconds) const;

  // The time of a step that decodes one sequence and nothing else (batch-1 decode's time per
  // token, as the executor is timed): the median of such steps in the window when it holds at
  // least kMinSteps of them, else the last such median, else the fit's prediction; nullopt
  // until the fit answers. Kept from light load because under load lone steps are rare and
  // the fit's base absorbs the load's own per-step costs (the client and the HTTP streams on
  // the same cores): at 8 requests/s it put the lone step at 8–9 ms against 5.6 measured
  // alone, and the time-per-token target built on it let p50 TPOT reach 16–26 ms.
  // (Since the target is a multiple of this figure, the serving engine's budget is relative
  // to batch-1 decode as it ran at light load.)
  std::optional<double> lone_decode_seconds() const;

  // The predicted time of a step of `decodes` (> 0) decodes alone: the lone decode step plus
  // a per-decode cost kept within [0, 2 × the per-prompt-token cost]. Why bounded: at light
  // load the window sees one to three decodes with noisy times, and the fitted per-decode cost
  // extrapolates wildly (measured at 1 request/s: −53 ms + 62 ms per decode), while the
  // per-token cost is pinned down by chunks of every size; a decode is one more row through
  // the same weights plus its attention, about a prompt token's cost (0.75 against 0.5 ms on
  // the ~100M model on 2 cores), so twice that bounds it. nullopt until the fit answers.
  std::optional<double> decodes_alone_seconds(int decodes) const;

  // The current fit (seconds, seconds per decode, seconds per prompt token, the measured lone
  // decode step); for tests and logs.
  struct Fit {
    double base = 0, per_decode = 0, per_prefill_token = 0;
    double measured_lone_decode = 0;  // the last median of lone decode steps; 0 before any
    bool valid = false;
  };
  const Fit& fit() const { return fit_; }

 private:
  struct Sample {
    double decodes = 0, prefill = 0, seconds = 0;
  };
  void refit();
  // Huber weights of the window's steps for residuals against `fit` (base, per decode, per
  // prompt token), relative to the prediction (refit says why).
  void huber_weights(const std::array<double, 3>& fit, std::array<double, kWindow>* weight) const;

  std::array<Sample, kWindow> window_{};
  int size_ = 0;  // filled entries
  int next_ = 0;  // ring position
  uint64_t with_prefill_ = 0, without_prefill_ = 0;  // steps seen of either kind
  Fit fit_;  // refitted after every step; also the prior of the next fit
};

}  // namespace tessera
