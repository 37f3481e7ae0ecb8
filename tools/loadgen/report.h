#pragma once
// The load generator's outputs other than plots: the JSON result (the layout is a contract,
// ../shared/DESIGN.md §6: never rename its keys) and the table printed on the terminal.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "common/status.h"
#include "tools/loadgen/stats.h"

namespace tessera::loadgen {

// One entry of "runs": the contract keys (rate, completed, failed, errors, requests_per_s,
// output_tokens_per_s, goodput_requests_per_s, ttft_s, tpot_s, itl_s, e2e_s, each summary
// {p50, p90, p99, max}) plus extras (mean, count, durations, token totals, concurrency).
nlohmann::json run_to_json(const RunStats& s);
// Back from a result file (for --compare); InvalidArgument naming the missing key.
StatusOr<RunStats> run_from_json(const nlohmann::json& j);

// A fixed-width table, one row per run; latencies in milliseconds (E2E in seconds).
std::string format_table(const std::vector<RunStats>& runs, const std::string& label_header = "",
                         const std::vector<std::string>& labels = {});

}  // namespace tessera::loadgen
