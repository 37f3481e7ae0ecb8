// tessera-loadgen: the load-testing harness (../shared/DESIGN.md §6, docs/benchmarks.md "Load
// generator"). Drives a running Tessera, or any OpenAI-compatible server, over streamed HTTP
// or Tessera's ZeroMQ client API with open-loop arrivals (Poisson, constant, bursts; one
// rate or a sweep) or closed-loop users, measures TTFT, TPOT, every inter-token gap and
// end-to-end latency per request, and writes a table, a JSON result (a contract) and plots.
// Exit codes: 0 ran (failed requests are results, not errors), 1 an error, 2 a usage error.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/zmq/curve_keys.h"
#include "common/status.h"
#include "tools/client/http_client.h"
#include "tools/loadgen/arrival.h"
#include "tools/loadgen/plots.h"
#include "tools/loadgen/progress_bar.h"
#include "tools/loadgen/report.h"
#include "tools/loadgen/runner.h"
#include "tools/loadgen/server_metrics.h"
#include "tools/loadgen/stats.h"
#include "tools/loadgen/target_check.h"
#include "tools/loadgen/workload.h"

namespace tessera::loadgen {
namespace {

using nlohmann::json;

struct Options {
  std::string url = "http://127.0.0.1:8000";
  bool url_given = false;
  std::string zmq, api_key, model;
  std::string curve_server_key_file;
  bool chat = false;
  std::string endpoint = "completions";  // --endpoint completions | chat | embeddings (--chat = chat)
  std::optional<double> rate;
  std::string sweep;
  std::optional<int> concurrency;
  std::string arrival = "poisson";
  int burst = 1;
  int requests = 0;
  double duration_s = 0;
  std::string input_len = "64", output_len = "32";
  std::string dataset;
  uint64_t seed = 0;
  bool text_prompts = false;
  std::string token_range = "10:500";
  bool no_ignore_eos = false;
  bool logprobs = false;
  std::optional<double> temperature;
  std::string slo;
  std::string json_out, plots_dir;
  double request_timeout_s = 300;
  int max_inflight = 256;
  bool allow_remote = false;
  bool no_progress = false;
  std::vector<std::string> compare;
};

std::atomic<bool> g_stop{false};

extern "C" void on_sigint(int) {
  g_stop = true;
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the program at once
}

StatusOr<std::vector<double>> parse_rates(const std::string& text) {
  std::vector<double> rates;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(part, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != part.size() || !(v > 0)) {
      return invalid_argument("--sweep '" + text + "': '" + part + "' is not a positive rate");
    }
    rates.push_back(v);
  }
  if (rates.empty()) return invalid_argument("--sweep: no rates");
  return rates;
}

// The served model's id from GET /v1/models (the first entry).
StatusOr<std::string> discover_model(const Options& o) {
  HttpClientOptions co;
  co.api_key = o.api_key;
  co.user_agent = "tessera-loadgen";
  co.timeout = std::chrono::seconds(30);
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<HttpClient> client, HttpClient::create(o.url, co));
  const std::string where = "GET " + o.url + "/v1/models";
  auto r = client->get("/v1/models");
  if (!r.is_ok()) return r.status();
  if (r->status != 200) return invalid_argument(where + ": " + describe_error_response(r.value()) + " (give --model)");
  const json j = json::parse(r->body, nullptr, false);
  if (j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
      j["data"][0].is_object() && j["data"][0].contains("id") && j["data"][0]["id"].is_string()) {
    return j["data"][0]["id"].get<std::string>();
  }
  return invalid_argument(where + ": no model id in the answer (give --model)");
}

json config_json(const Options& o, const RequestFormat& format) {
  json c = {{"url", o.zmq.empty() || o.url_given ? json(o.url) : json(nullptr)},
            {"zmq", o.zmq.empty() ? json(nullptr) : json(o.zmq)},
            {"model", format.model.empty() ? json(nullptr) : json(format.model)},
            {"endpoint", o.endpoint},
            {"arrival", o.concurrency ? "closed" : o.arrival},
            {"burst", o.burst},
            {"requests", o.requests},
            {"duration_s", o.duration_s},
            {"input_len", o.dataset.empty() ? json(o.input_len) : json(nullptr)},
            {"output_len", o.output_len},
            {"dataset", o.dataset.empty() ? json(nullptr) : json(o.dataset)},
            {"seed", o.seed},
            {"text_prompts", o.text_prompts},
            {"ignore_eos", format.ignore_eos},
            {"logprobs", format.logprobs},
            {"slo", o.slo.empty() ? json(nullptr) : json(o.slo)},
            {"request_timeout_s", o.request_timeout_s}};
  return c;
}

Status write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) return invalid_argument("cannot write " + path);
  return Status::ok();
}

void report_plots(const std::string& dir, const std::vector<PlotSeries>& series,
                  std::optional<double> ttft_slo_s = std::nullopt) {
  std::vector<std::string> images;
  const Status st = write_plots(dir, series, &images, ttft_slo_s);
  if (!st.is_ok()) {
    std::cerr << "tessera-loadgen: " << st.message() << std::endl;
    return;
  }
  for (const std::string& img : images) std::cout << "plot: " << img << "\n";
}

// --compare LABEL=FILE ...: tables, throughput at the p99-TTFT objective, one sweep plot.
Status run_compare(const Options& o) {
  std::vector<PlotSeries> series;
  std::vector<RunStats> rows;
  std::vector<std::string> row_labels;
  for (const std::string& item : o.compare) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) return invalid_argument("--compare '" + item + "': expected LABEL=FILE.json");
    const std::string label = item.substr(0, eq), path = item.substr(eq + 1);
    std::ifstream in(path);
    if (!in) return not_found("--compare " + path + ": cannot open");
    const json j = json::parse(in, nullptr, false);
    if (!j.is_object() || !j.contains("runs") || !j["runs"].is_array()) {
      return invalid_argument("--compare " + path + ": not a tessera-loadgen result (no \"runs\")");
    }
    PlotSeries s;
    s.label = label;
    for (const json& run : j["runs"]) {
      auto st = run_from_json(run);
      if (!st.is_ok()) return st.status().with_context(path);
      s.runs.push_back({st.value(), {}});
      rows.push_back(st.value());
      row_labels.push_back(label);
    }
    series.push_back(std::move(s));
  }
  std::cout << format_table(rows, "series", row_labels);
  TESSERA_ASSIGN_OR_RETURN(Slo slo, parse_slo(o.slo));
  if (slo.ttft_s) {
    std::cout << "\nthroughput at p99 TTFT <= " << *slo.ttft_s << " s (interpolated between sweep points):\n";
    std::vector<SloThroughput> at;
    for (const PlotSeries& s : series) {
      std::vector<RunStats> runs;
      for (const PlotRun& r : s.runs) runs.push_back(r.stats);
      at.push_back(throughput_at_p99_ttft(runs, *slo.ttft_s));
      const SloThroughput& t = at.back();
      if (t.found) {
        std::printf("  %-12s %.3f req/s, %.1f output tok/s (at %.3f req/s offered)\n", s.label.c_str(),
                    t.requests_per_s, t.output_tokens_per_s, t.rate);
      } else {
        std::printf("  %-12s no run met the objective\n", s.label.c_str());
      }
    }
    if (at.size() >= 2 && at[0].found && at[1].found && at[1].output_tokens_per_s > 0) {
      std::printf("  ratio %s / %s: %.2fx (output tok/s), %.2fx (req/s)\n", series[0].label.c_str(),
                  series[1].label.c_str(), at[0].output_tokens_per_s / at[1].output_tokens_per_s,
                  at[0].requests_per_s / at[1].requests_per_s);
    }
  }
  if (!o.plots_dir.empty()) report_plots(o.plots_dir, series, slo.ttft_s);
  return Status::ok();
}

Status run_main(const Options& o) {
  if (!o.compare.empty()) return run_compare(o);

  // What and where.
  if (o.zmq.empty() || o.url_given) TESSERA_RETURN_IF_ERROR(check_http_target(o.url, o.allow_remote));
  if (!o.zmq.empty()) TESSERA_RETURN_IF_ERROR(check_zmq_target(o.zmq, o.allow_remote));
  TESSERA_ASSIGN_OR_RETURN(Slo slo, parse_slo(o.slo));

  WorkloadOptions wo;
  wo.seed = o.seed;
  wo.text_prompts = o.text_prompts || o.chat || o.endpoint == "responses";
  TESSERA_ASSIGN_OR_RETURN(wo.input_len, parse_length("--input-len", o.input_len));
  TESSERA_ASSIGN_OR_RETURN(wo.output_len, parse_length("--output-len", o.output_len));
  {
    const size_t colon = o.token_range.find(':');
    bool ok = colon != std::string::npos;
    if (ok) {
      try {
        wo.token_min = std::stoi(o.token_range.substr(0, colon));
        wo.token_max = std::stoi(o.token_range.substr(colon + 1));
      } catch (...) {
        ok = false;
      }
    }
    if (!ok || wo.token_min < 0 || wo.token_max < wo.token_min) {
      return invalid_argument("--token-range '" + o.token_range + "': expected MIN:MAX with 0 <= MIN <= MAX");
    }
  }
  std::vector<DatasetEntry> dataset;
  if (!o.dataset.empty()) {
    TESSERA_ASSIGN_OR_RETURN(dataset, read_dataset(o.dataset));
    if (o.chat || o.endpoint == "responses") {
      for (const DatasetEntry& e : dataset) {
        if (e.prompt_text.empty())
          return invalid_argument("--endpoint " + o.endpoint + " needs text prompts; " + o.dataset + " has token ids");
      }
    }
  }
  const Workload workload(wo, std::move(dataset));

  TargetOptions target;
  target.url = o.url;
  target.zmq = o.zmq;
  target.api_key = o.api_key;
  if (!o.curve_server_key_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(target.curve_server_public_key,
                             read_curve_key_file(o.curve_server_key_file, "--curve-server-key-file"));
  }
  target.request_timeout_s = o.request_timeout_s;
  target.max_inflight = o.max_inflight;
  target.format.chat = o.chat;
  target.format.embeddings = o.endpoint == "embeddings";
  target.format.responses = o.endpoint == "responses";
  target.format.model = o.model;
  target.format.ignore_eos = !o.no_ignore_eos;
  target.format.logprobs = o.logprobs;
  target.format.temperature = o.temperature;
  if (target.format.model.empty() && o.zmq.empty()) {
    TESSERA_ASSIGN_OR_RETURN(target.format.model, discover_model(o));
  }
  const bool scrape = o.zmq.empty() || o.url_given;

  // The runs: one per rate, or one closed-loop run.
  std::vector<RunPlan> plans;
  if (o.concurrency) {
    RunPlan p;
    p.concurrency = *o.concurrency;
    plans.push_back(p);
  } else {
    std::vector<double> rates;
    if (o.rate) {
      rates.push_back(*o.rate);
    } else {
      TESSERA_ASSIGN_OR_RETURN(rates, parse_rates(o.sweep));
    }
    TESSERA_ASSIGN_OR_RETURN(ArrivalKind kind, parse_arrival_kind(o.arrival));
    for (double r : rates) {
      RunPlan p;
      p.arrivals = ArrivalOptions{kind, r, o.burst, o.seed};
      plans.push_back(p);
    }
  }
  for (RunPlan& p : plans) {
    p.requests = o.requests;
    p.duration_s = o.duration_s;
  }

  std::signal(SIGINT, on_sigint);
  json runs_json = json::array();
  std::vector<RunStats> all_stats;
  PlotSeries series;
  bool warned_no_tokens = false;
  for (size_t i = 0; i < plans.size() && !g_stop; ++i) {
    const RunPlan& plan = plans[i];
    std::optional<ServerCounters> before;
    if (scrape) {
      auto c = scrape_server_counters(o.url);
      if (c.is_ok() && c->found) before = c.value();
    }
    Progress progress;
    std::string label = plan.arrivals ? "rate " + json(plan.arrivals->rate).dump() + " req/s"
                                      : std::to_string(plan.concurrency) + " users";
    ProgressBar bar(label, plan.requests, plan.duration_s, progress, !o.no_progress);
    auto out = run_load(target, workload, plan, &progress, &g_stop);
    bar.stop();
    if (!out.is_ok()) return out.status();
    RunStats st = compute_stats(out->records, slo, out->duration_s);
    if (plan.arrivals) {
      st.rate = plan.arrivals->rate;
      st.arrival = arrival_name(*plan.arrivals);
    } else {
      st.rate = st.duration_s > 0 ? st.issued / st.duration_s : 0;
      st.concurrency = plan.concurrency;
      st.arrival = "closed";
    }
    json rj = run_to_json(st);
    if (before) {
      auto after = scrape_server_counters(o.url);
      if (after.is_ok()) rj["server_metrics"] = json::parse(counters_delta_json(*before, after.value()));
    }
    if (st.no_token_events > 0 && !warned_no_tokens) {
      warned_no_tokens = true;
      std::cerr << "tessera-loadgen: " << st.no_token_events
                << " completed requests streamed no token events (a model without a tokenizer sends no text): "
                   "TTFT/TPOT/ITL are missing for them; --logprobs makes the server send one event per token"
                << std::endl;
    }
    std::fprintf(stderr, "%s: %d completed, %d failed in %.1f s, %.2f req/s, %.1f output tok/s\n", label.c_str(),
                 st.completed, st.failed, st.duration_s, st.requests_per_s, st.output_tokens_per_s);
    runs_json.push_back(std::move(rj));
    all_stats.push_back(st);
    series.runs.push_back({st, std::move(out->records)});
  }
  if (g_stop) std::cerr << "tessera-loadgen: interrupted; writing what was measured" << std::endl;

  std::cout << format_table(all_stats);
  json result = {{"runs", runs_json}, {"config", config_json(o, target.format)}, {"interrupted", g_stop.load()}};
  TESSERA_RETURN_IF_ERROR(write_text(o.json_out, result.dump(2) + "\n"));
  std::cout << "json: " << o.json_out << "\n";
  if (!o.plots_dir.empty()) report_plots(o.plots_dir, {series});
  return Status::ok();
}

}  // namespace
}  // namespace tessera::loadgen

int main(int argc, char** argv) {
  using tessera::loadgen::Options;
  Options o;
  CLI::App app{
      "tessera-loadgen: load a Tessera (or any OpenAI-compatible) server with streamed requests and measure "
      "TTFT, TPOT, inter-token latency, end-to-end latency, throughput and goodput"};
  auto* url = app.add_option("--url", o.url, "server, http://HOST:PORT (also read for GET /metrics)")->capture_default_str();
  auto* zmq = app.add_option("--zmq", o.zmq, "send the requests over Tessera's ZeroMQ client API at this endpoint instead");
  app.add_option("--api-key", o.api_key, "API key (HTTP Bearer / ZeroMQ request key)");
  app.add_option("--curve-server-key-file", o.curve_server_key_file,
                 "with --zmq: the server's CURVE public key file (server.curve.server_public_key_file) when "
                 "server.curve.client_api encrypts the ZeroMQ client API")
      ->needs(zmq);
  app.add_option("--model", o.model, "the request's model (default: the first of GET /v1/models; absent over --zmq)");
  auto* chat = app.add_flag("--chat", o.chat, "use /v1/chat/completions (text prompts) instead of /v1/completions");
  app.add_option("--endpoint", o.endpoint,
                 "completions, chat (= --chat), embeddings (each prompt one /v1/embeddings input; --output-len unused) "
                 "or responses (/v1/responses, text prompts, streamed events; no ignore_eos)")
      ->check(CLI::IsMember({"completions", "chat", "embeddings", "responses"}))
      ->capture_default_str()
      ->excludes(chat);
  auto* rate = app.add_option("--rate", o.rate, "open loop at this mean request rate (req/s)")->check(CLI::PositiveNumber);
  auto* sweep = app.add_option("--sweep", o.sweep, "one open-loop run per rate, e.g. 2,4,8 (same requests each)");
  auto* conc = app.add_option("--concurrency", o.concurrency, "closed loop: N users, each sending its next request when "
                                                              "its last one ends")->check(CLI::PositiveNumber);
  app.add_option("--arrival", o.arrival, "open-loop gaps: poisson or constant")->capture_default_str();
  app.add_option("--burst", o.burst, "requests arriving together (bursts come at rate / N)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--requests", o.requests, "requests per run")->check(CLI::PositiveNumber);
  app.add_option("--duration", o.duration_s, "seconds per run: no request starts later")->check(CLI::PositiveNumber);
  app.add_option("--input-len", o.input_len, "prompt length: N, uniform:MIN:MAX or lognormal:MEDIAN:SIGMA[:MAX]")
      ->capture_default_str();
  app.add_option("--output-len", o.output_len, "output length (max_tokens with ignore_eos), same forms")
      ->capture_default_str();
  app.add_option("--dataset", o.dataset, "JSONL prompts: {\"prompt\": TEXT | [ids], \"output_len\": N}, used in order");
  app.add_option("--seed", o.seed, "seed of the prompts, lengths and arrival times")->capture_default_str();
  app.add_flag("--text-prompts", o.text_prompts, "synthetic prompts of words instead of token ids");
  app.add_option("--token-range", o.token_range, "range of random prompt token ids, MIN:MAX")->capture_default_str();
  app.add_flag("--no-ignore-eos", o.no_ignore_eos, "do not send ignore_eos (outputs may end early)");
  app.add_flag("--logprobs", o.logprobs, "ask for logprobs so every token comes as its own event");
  app.add_option("--temperature", o.temperature, "the requests' temperature (default: the server's)");
  app.add_option("--slo", o.slo, "goodput objectives, e.g. ttft=500ms,tpot=50ms (keys ttft, tpot, itl, e2e)");
  auto* json_out = app.add_option("--json", o.json_out, "write the result here (JSON)");
  app.add_option("--plots", o.plots_dir, "write latency CDFs and the sweep plot here (gnuplot: SVG, PNG)");
  app.add_option("--request-timeout", o.request_timeout_s, "seconds one request may take")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-inflight", o.max_inflight, "HTTP: most requests in flight (later arrivals wait)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_flag("--allow-remote", o.allow_remote, "allow a target that is not on this machine");
  app.add_flag("--no-progress", o.no_progress, "no progress bar");
  auto* compare = app.add_option("--compare", o.compare,
                                 "LABEL=FILE.json (repeatable): no load; tabulate and plot saved results together "
                                 "(with --slo ttft=X: throughput at that p99 TTFT and the ratio of the first two)");
  rate->excludes(sweep)->excludes(conc)->excludes(compare);
  sweep->excludes(conc)->excludes(compare);
  conc->excludes(compare);
  json_out->excludes(compare);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "tessera-loadgen: " << e.what() << " (see tessera-loadgen --help)" << std::endl;
    return 2;
  }
  o.url_given = url->count() > 0;
  if (o.chat) o.endpoint = "chat";
  o.chat = o.endpoint == "chat";
  auto usage = [](const std::string& m) {
    std::cerr << "tessera-loadgen: " << m << " (see tessera-loadgen --help)" << std::endl;
    return 2;
  };
  if (o.compare.empty()) {
    if (!o.rate && o.sweep.empty() && !o.concurrency) return usage("give --rate, --sweep or --concurrency");
    if (o.requests <= 0 && o.duration_s <= 0) return usage("give --requests or --duration (runs are bounded)");
    if (o.json_out.empty()) return usage("--json OUT.json is required");
    if (o.endpoint == "responses" && !o.zmq.empty())
      return usage("--endpoint responses is HTTP only (the ZeroMQ client API has no Responses kind)");
  }
  const tessera::Status st = tessera::loadgen::run_main(o);
  if (!st.is_ok()) {
    std::cerr << "tessera-loadgen: " << st.message() << std::endl;
    return 1;
  }
  return 0;
}
