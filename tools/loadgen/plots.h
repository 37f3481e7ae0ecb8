#pragma once
// Plots of load-generator results, drawn by gnuplot from a generated script and data files
// (all left in the plots folder, so a plot can be restyled by editing plots.gp):
//   latency_cdf.{svg,png}  CDFs of TTFT, TPOT and end-to-end latency, one curve per run
//                          (needs the per-request records, so not for --compare)
//   sweep.{svg,png}        output tokens/s, p99 TTFT and p99 TPOT against the request rate,
//                          one line per series (when a series has two runs or more)
// PNG only when gnuplot has the pngcairo terminal.
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "tools/loadgen/record.h"
#include "tools/loadgen/stats.h"

namespace tessera::loadgen {

struct PlotRun {
  RunStats stats;
  std::vector<RequestRecord> records;  // may be empty
};
struct PlotSeries {
  std::string label;  // "" for a single series
  std::vector<PlotRun> runs;
};

// True when `gnuplot` can be run.
bool gnuplot_available();

// Writes the data, the script and the images into `dir` (created if missing). `written`
// gets the image paths. Unavailable when gnuplot is missing (the data and script are still
// written), Internal when it fails.
// `ttft_slo_s`, when set, is drawn as a dashed line on the sweep's p99-TTFT panel.
Status write_plots(const std::string& dir, const std::vector<PlotSeries>& series, std::vector<std::string>* written,
                   std::optional<double> ttft_slo_s = std::nullopt);

}  // namespace tessera::loadgen
