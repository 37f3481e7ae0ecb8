#include "coordinator/api/batch_jsonl.h"

#include <nlohmann/json.hpp>

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <vector>

#include "coordinator/api/api_error.h"
#include "coordinator/api/api_submission.h"

namespace tessera {

// (Named: in a unity build an anonymous namespace is shared with the other API files.)
namespace batch_jsonl_internal {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

int64_t seconds_since_epoch() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string batch_request_id() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^
                                   static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
  char buf[48];
  std::snprintf(buf, sizeof(buf), "batch_req_%016llx%04llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(counter.fetch_add(1) & 0xffff));
  return buf;
}

json custom_id_json(const std::string& custom_id) { return custom_id.empty() ? json(nullptr) : json(custom_id); }

// A line that is not a request: no response, the error names the line.
std::string line_error(const std::string& custom_id, int64_t line, const std::string& code, const std::string& message) {
  const json out = {{"id", batch_request_id()},
                    {"custom_id", custom_id_json(custom_id)},
                    {"response", nullptr},
                    {"error", {{"code", code}, {"message", "line " + std::to_string(line) + ": " + message}}}};
  return out.dump();
}

std::string response_line(const std::string& custom_id, int status, const std::string& request_id,
                          const std::string& body) {
  json parsed = json::parse(body, nullptr, false);
  const json out = {{"id", batch_request_id()},
                    {"custom_id", custom_id_json(custom_id)},
                    {"response", {{"status_code", status}, {"request_id", request_id}, {"body", std::move(parsed)}}},
                    {"error", nullptr}};
  return out.dump();
}

// One request line as read: its endpoint and body, or why it is not a request.
struct BatchLine {
  std::string custom_id;
  ApiEndpoint endpoint = ApiEndpoint::kCompletions;
  std::string body;
  std::string error_code, error;  // set: not a request
};

BatchLine read_batch_line(const std::string& text, const std::set<std::string>& seen_ids, const std::string& only_url) {
  BatchLine b;
  const json j = json::parse(text, nullptr, false);
  auto refuse = [&b](std::string code, std::string message) {
    b.error_code = std::move(code);
    b.error = std::move(message);
    return b;
  };
  if (j.is_discarded()) return refuse("invalid_json", "not a JSON value");
  if (!j.is_object()) return refuse("invalid_request", "a request line is a JSON object");
  const auto id = j.find("custom_id");
  if (id == j.end() || !id->is_string() || id->get<std::string>().empty())
    return refuse("missing_custom_id", "'custom_id' must be a non-empty string");
  b.custom_id = id->get<std::string>();
  if (seen_ids.count(b.custom_id)) return refuse("duplicate_custom_id", "'custom_id' \"" + b.custom_id + "\" repeats an earlier line's");
  const auto method = j.find("method");
  if (method == j.end() || *method != "POST") return refuse("invalid_method", "'method' must be \"POST\"");
  const auto url = j.find("url");
  if (url == j.end() || !url->is_string()) return refuse("invalid_url", "'url' must be a string");
  if (!only_url.empty() && *url != only_url)
    return refuse("invalid_url", "'url' " + url->dump() + " is not the batch's endpoint " + only_url);
  if (*url == "/v1/completions") {
    b.endpoint = ApiEndpoint::kCompletions;
  } else if (*url == "/v1/chat/completions") {
    b.endpoint = ApiEndpoint::kChatCompletions;
  } else if (*url == "/v1/embeddings") {
    b.endpoint = ApiEndpoint::kEmbeddings;
  } else {
    return refuse("invalid_url", "'url' " + url->dump() +
                                     " is not one of /v1/completions, /v1/chat/completions, /v1/embeddings");
  }
  const auto body = j.find("body");
  if (body == j.end() || !body->is_object()) return refuse("invalid_body", "'body' must be a JSON object");
  if (const auto stream = body->find("stream"); stream != body->end() && *stream == true)
    return refuse("invalid_body", "'body.stream': a batch's results are whole responses, not streams");
  b.body = body->dump();
  return b;
}

// A request in the engine and its choices as they arrive.
struct Running {
  std::string custom_id;
  ApiRequest request;
  std::string id;
  int64_t created = 0;
  ChoiceResults results;
};

class BatchRun {
 public:
  BatchRun(EngineService& service, const ApiContext& api, std::ostream& out, const BatchRunOptions& options)
      : service_(service), api_(api), out_(out), options_(options), start_(Clock::now()) {}

  StatusOr<BatchCounts> run(std::istream& in) {
    std::string text;
    int64_t line = 0;
    while (!cancelled() && std::getline(in, text)) {
      ++line;
      if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
      ++counts_.total;
      BatchLine b = read_batch_line(text, seen_ids_, options_.only_url);
      if (!b.custom_id.empty() && b.error_code != "duplicate_custom_id") seen_ids_.insert(b.custom_id);
      if (!b.error.empty()) {
        write_failure(line_error(b.custom_id, line, b.error_code, b.error));
        continue;
      }
      submit(std::move(b));
      write_finished();
    }
    if (in.bad()) return Status(StatusCode::kInvalidArgument, "reading the batch input failed at line " + std::to_string(line + 1));
    counts_.input_done = true;
    wait_until([this] { return in_flight_ == 0; });
    counts_.seconds = elapsed();
    if (options_.on_progress) options_.on_progress(counts_);
    if (cancelled()) {
      return Status(StatusCode::kUnavailable, "the batch was cancelled: " + std::to_string(counts_.finished()) +
                                                  " of the " + std::to_string(counts_.total) +
                                                  " requests read so far have results");
    }
    out_.flush();
    if (options_.errors != nullptr) options_.errors->flush();
    if (!out_ || (options_.errors != nullptr && !*options_.errors))
      return Status(StatusCode::kInternal, "writing the batch results failed");
    return counts_;
  }

 private:
  bool cancelled() const { return options_.cancel != nullptr && options_.cancel->load(); }
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  // Waits (writing finished results and reporting progress meanwhile) until `done` holds; a
  // cancellation aborts every running request first.
  void wait_until(const std::function<bool()>& done) {
    bool aborted = false;
    for (;;) {
      write_finished();
      if (cancelled() && !aborted) {
        abort_all();
        aborted = true;
      }
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (done()) break;
        cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return !finished_.empty(); });
      }
      report_if_due();
    }
    write_finished();  // what finished between the last write and the check
  }

  void report_if_due() {
    if (!options_.on_progress || options_.progress_every.count() <= 0 ||
        Clock::now() - last_report_ < options_.progress_every)
      return;
    last_report_ = Clock::now();
    counts_.seconds = elapsed();
    options_.on_progress(counts_);
  }

  void abort_all() {
    std::vector<RequestId> ids;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [serial, ids_of] : engine_ids_) ids.insert(ids.end(), ids_of.begin(), ids_of.end());
    }
    abort_api_request(service_, ids);
  }

  void submit(BatchLine b) {
    auto r = std::make_unique<Running>();
    r->custom_id = std::move(b.custom_id);
    ApiError error;
    if (!parse_api_request(b.endpoint, b.body, api_, &r->request, &error)) {
      write_failure(response_line(r->custom_id, error.http_status, batch_request_id(), error_body(error)));
      return;
    }
    r->id = make_response_id(r->request.endpoint);
    r->created = seconds_since_epoch();
    r->results = ChoiceResults(r->request.num_choices());
    for (;;) {
      wait_until([this] { return in_flight_ < options_.max_in_flight; });
      if (cancelled()) return;  // this line is not started: it has no result
      const uint64_t serial = next_serial_++;
      const Running* submitted = r.get();
      {
        std::lock_guard<std::mutex> lock(mu_);
        running_[serial] = std::move(r);
        ++in_flight_;
      }
      StatusOr<std::vector<RequestId>> ids = submit_api_request(service_, submitted->request, callback(serial));
      int still_in_flight = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (ids.is_ok()) {
          // (Its results may already be in: the callback runs on the engine's thread.)
          if (running_.count(serial)) engine_ids_[serial] = std::move(ids).value();
          return;
        }
        // A failed submit's prompts were aborted: the choices of the prompt that failed never
        // report, so the request is still here whatever late events came.
        r = std::move(running_.at(serial));
        running_.erase(serial);
        still_in_flight = --in_flight_;
      }
      if (ids.status().code() != StatusCode::kResourceExhausted || still_in_flight == 0) {
        const ApiError e = api_error_of(ids.status());
        write_failure(response_line(r->custom_id, e.http_status, r->id, error_body(e)));
        return;
      }
      // The engine's queue is full (other clients share it): wait for one of ours to finish.
      wait_until([this, still_in_flight] { return in_flight_ < still_in_flight; });
    }
  }

  ChoiceCallback callback(uint64_t serial) {
    return [this, serial](size_t index, const GenerateEvent& ev) {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = running_.find(serial);
      if (it == running_.end()) return;
      ChoiceResults& results = it->second->results;
      if (!results.add(index, ev) || !results.complete()) return;
      finished_.push_back(std::move(it->second));
      running_.erase(it);
      engine_ids_.erase(serial);
      --in_flight_;
      cv_.notify_all();
    };
  }

  // Writes the results that came in (rendered here, off the engine's thread).
  void write_finished() {
    std::deque<std::unique_ptr<Running>> finished;
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished.swap(finished_);
    }
    for (const std::unique_ptr<Running>& g : finished) {
      const ChoiceResults& results = g->results;
      if (!results.error.empty() || results.cut) {
        const ApiError e = !results.error.empty() ? generation_error(results.error, results.unavailable)
                                                  : api_error(503, "service_unavailable", "cancelled",
                                                              "the batch stopped before this request finished");
        write_failure(response_line(g->custom_id, e.http_status, g->id, error_body(e)));
        continue;
      }
      const Usage usage = usage_of(g->request, results.outputs);
      counts_.prompt_tokens += usage.prompt_tokens;
      counts_.completion_tokens += usage.completion_tokens;
      ++counts_.completed;
      out_ << response_line(g->custom_id, 200, g->id, response_body(g->request, g->id, g->created, results.outputs, api_.tokenizer))
           << '\n';
    }
    // Results reach the file as they come, so a process killed mid-batch loses none it counted.
    out_.flush();
    if (options_.errors != nullptr) options_.errors->flush();
  }

  void write_failure(const std::string& line) {
    ++counts_.failed;
    (options_.errors != nullptr ? *options_.errors : out_) << line << '\n';
  }

  EngineService& service_;
  const ApiContext& api_;
  std::ostream& out_;
  const BatchRunOptions& options_;
  const Clock::time_point start_;
  Clock::time_point last_report_ = Clock::now();
  BatchCounts counts_;  // the calling thread's
  std::set<std::string> seen_ids_;
  uint64_t next_serial_ = 1;

  std::mutex mu_;  // guards what follows (the engine's thread calls back)
  std::condition_variable cv_;
  std::map<uint64_t, std::unique_ptr<Running>> running_;
  std::map<uint64_t, std::vector<RequestId>> engine_ids_;
  std::deque<std::unique_ptr<Running>> finished_;
  int in_flight_ = 0;
};

}  // namespace batch_jsonl_internal

StatusOr<BatchCounts> run_batch_jsonl(EngineService& service, const ApiContext& api, std::istream& in,
                                      std::ostream& out, const BatchRunOptions& options) {
  if (options.max_in_flight < 1) return invalid_argument("a batch needs at least one request in flight");
  batch_jsonl_internal::BatchRun run(service, api, out, options);
  return run.run(in);
}

std::string describe_batch_progress(const BatchCounts& c) {
  std::string s = std::to_string(c.finished()) + (c.input_done ? " of " + std::to_string(c.total) : "") + " done";
  if (c.failed > 0) s += " (" + std::to_string(c.failed) + " failed)";
  char buf[96];
  if (c.seconds > 0) {
    std::snprintf(buf, sizeof(buf), ", %.0f tokens/s", static_cast<double>(c.completion_tokens) / c.seconds);
    s += buf;
  }
  if (c.input_done && c.finished() > 0 && c.finished() < c.total && c.seconds > 0) {
    const double eta = c.seconds / static_cast<double>(c.finished()) * static_cast<double>(c.total - c.finished());
    std::snprintf(buf, sizeof(buf), ", ETA %.0f s", eta);
    s += buf;
  }
  return s;
}

}  // namespace tessera
