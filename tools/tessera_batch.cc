// tessera-batch IN.jsonl OUT.jsonl: an offline batch in OpenAI's Batch API shape, without a
// server. It starts the model's workers as tessera-serve does, runs every request line of IN
// through the same API layer (completions, chat, embeddings) and writes one result line per
// request to OUT as each finishes (coordinator/api/batch_jsonl.h; docs/api.md, "Offline
// batches"). It schedules for throughput: the latency budgets are off unless --set turns
// them on, and enough requests are kept in the engine to fill its largest batch.
#include <CLI/CLI.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "common/crash_report.h"
#include "common/logging.h"
#include "coordinator/api/batch_jsonl.h"
#include "tools/lib/main_guard.h"
#include "tools/lib/serve_runtime.h"
#include "tools/lib/serving_flags.h"

namespace {

// Throughput first: a time-per-token or per-step budget only holds requests back here.
const std::vector<std::string> kBatchDefaults = {"scheduler.max_tpot_slowdown=0", "scheduler.max_decode_slowdown=0"};

tessera::Status check_paths(const std::string& in, const std::string& out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_regular_file(in, ec)) return tessera::invalid_argument("IN '" + in + "' is not a readable file");
  if (fs::exists(out, ec) && fs::equivalent(in, out, ec))
    return tessera::invalid_argument("OUT '" + out + "' is IN: the results would overwrite the requests");
  return tessera::Status::ok();
}

int batch_main(int argc, char** argv) {
  tessera::ServingFlags flags;
  std::string in_path, out_path;
  int max_in_flight = 0;
  double progress_s = 5;
  CLI::App app{"tessera-batch: run a JSONL of OpenAI requests (the Batch API's input) and write their results"};
  app.add_option("IN", in_path, "requests, one per line: {\"custom_id\", \"method\": \"POST\", \"url\", \"body\"}")
      ->required();
  app.add_option("OUT", out_path, "results, one per request in the order they finish (overwritten)")->required();
  app.add_option("--max-in-flight", max_in_flight,
                 "requests in the engine at once (default: 2 x scheduler.max_num_seqs)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--progress-s", progress_s, "seconds between progress lines, 0 = only the last (default: 5)")
      ->check(CLI::Range(0.0, 86400.0));
  tessera::add_serving_flags(app, flags, /*http=*/false);
  CLI11_PARSE(app, argc, argv);
  tessera::init_logging("coord");
  tessera::install_crash_report("coord");

  auto fail = [](const tessera::Status& st) {
    std::cerr << "tessera-batch: " << st.to_string() << std::endl;
    return 1;
  };
  if (tessera::Status st = check_paths(in_path, out_path); !st.is_ok()) return fail(st);
  tessera::StatusOr<tessera::TesseraConfig> config = tessera::config_from_serving_flags(flags, kBatchDefaults);
  if (!config.is_ok()) return fail(config.status());
  std::ifstream in(in_path);
  if (!in) return fail(tessera::invalid_argument("IN '" + in_path + "' cannot be opened"));
  std::ofstream out(out_path, std::ios::trunc);
  if (!out) return fail(tessera::invalid_argument("OUT '" + out_path + "' cannot be written"));

  tessera::ServeOptions options;
  options.config = std::move(config).value();
  options.spawn_workers = true;
  // (Unchanged when a signal stops the start-up: the front end never runs.)
  tessera::StatusOr<tessera::BatchCounts> result =
      tessera::Status(tessera::StatusCode::kUnavailable, "stopped by a signal during start-up; no request was run");
  const tessera::Status st = tessera::run_engine_stack(options, [&](tessera::EngineStack& stack) -> tessera::Status {
    TESSERA_ASSIGN_OR_RETURN(const bool started, stack.start_engine());
    if (!started) return tessera::Status::ok();
    std::atomic<bool> cancel{false};
    stack.signals.set_handler([&cancel](int sig, int) {
      TESSERA_LOG_WARN("signal {}: stopping the batch (running requests are cut; finished results are kept)", sig);
      cancel.store(true);
    });
    tessera::BatchRunOptions bo;
    bo.max_in_flight = max_in_flight > 0 ? max_in_flight : 2 * stack.config.scheduler.max_num_seqs;
    bo.cancel = &cancel;
    bo.progress_every = std::chrono::milliseconds(static_cast<int64_t>(progress_s * 1000));
    bo.on_progress = [](const tessera::BatchCounts& c) { TESSERA_LOG_INFO("batch: {}", tessera::describe_batch_progress(c)); };
    TESSERA_LOG_INFO("batch: {} -> {}, up to {} requests in flight (scheduler.max_tpot_slowdown {}, max_decode_slowdown {})",
                     in_path, out_path, bo.max_in_flight, stack.config.scheduler.max_tpot_slowdown,
                     stack.config.scheduler.max_decode_slowdown);
    result = tessera::run_batch_jsonl(stack.service, stack.api, in, out, bo);
    stack.signals.set_handler(nullptr);  // it uses `cancel`
    return tessera::Status::ok();
  });
  if (!st.is_ok()) return fail(st);
  if (!result.is_ok()) return fail(result.status());
  std::cout << "tessera-batch: " << result->total << " requests: " << result->completed << " completed, "
            << result->failed << " failed; " << result->prompt_tokens << " prompt and " << result->completion_tokens
            << " completion tokens in " << result->seconds << " s" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run_guarded("tessera-batch", [&] { return batch_main(argc, argv); });
}
