#include "tools/loadgen/runner.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "tools/client/http_client.h"
#include "tools/loadgen/run_clock.h"

namespace tessera::loadgen {

StatusOr<RunOutput> run_load_zmq(const TargetOptions& target, const Workload& workload, const RunPlan& plan,
                                 Progress* progress, const std::atomic<bool>* stop);

namespace {

bool stopped(const std::atomic<bool>* stop) { return stop != nullptr && stop->load(); }

// One /v1/embeddings request over `client`: a single answer, no tokens out.
RequestRecord execute_embeddings(HttpClient& client, const TargetOptions& target, const RequestSpec& spec,
                                 double scheduled_s, const RunClock& clock, Progress* progress) {
  RequestRecord rec;
  rec.index = spec.index;
  rec.scheduled_s = scheduled_s;
  rec.sent_s = clock.now();
  if (progress != nullptr) ++progress->issued;
  auto result = client.post_json("/v1/embeddings", request_json(spec, target.format, /*http_stream=*/false));
  rec.end_s = clock.now();
  rec.input_tokens = static_cast<int>(spec.prompt_ids.size());
  if (!result.is_ok()) {
    rec.error_kind = transport_error_kind(result.status().message());
    rec.error_message = result.status().message();
  } else if (result->status != 200) {
    rec.error_kind = "http_" + std::to_string(result->status);
    rec.error_message = describe_error_response(result.value());
  } else {
    const nlohmann::json j = nlohmann::json::parse(result->body, nullptr, /*allow_exceptions=*/false);
    rec.ok = j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty();
    if (!rec.ok) {
      rec.error_kind = "bad_response";
      rec.error_message = "no 'data' list in the answer: " + result->body.substr(0, 120);
    } else if (j.contains("usage") && j["usage"].is_object()) {
      rec.input_tokens = j["usage"].value("prompt_tokens", rec.input_tokens);
    }
  }
  if (progress != nullptr) ++(rec.ok ? progress->ok : progress->failed);
  return rec;
}

// One streamed request over `client`, timestamped on `clock`.
RequestRecord execute_http(HttpClient& client, const TargetOptions& target, const RequestSpec& spec,
                           double scheduled_s, const RunClock& clock, Progress* progress,
                           const std::atomic<bool>* stop) {
  if (target.format.embeddings) return execute_embeddings(client, target, spec, scheduled_s, clock, progress);
  const bool chat = target.format.chat;
  const bool responses = target.format.responses;
  const std::string path = responses ? "/v1/responses" : chat ? "/v1/chat/completions" : "/v1/completions";
  const std::string body = request_json(spec, target.format, /*http_stream=*/true);
  RequestRecord rec;
  rec.index = spec.index;
  rec.scheduled_s = scheduled_s;
  rec.sent_s = clock.now();
  if (progress != nullptr) ++progress->issued;

  int chunk_tokens = 0;
  std::optional<int> usage_prompt, usage_completion;
  std::optional<std::string> stream_error;
  std::string finish_reason;
  bool bad_json = false, cancelled = false, timed_out = false;
  auto on_event = [&](std::string_view payload) {
    const double t = clock.now();
    const StreamChunk c = responses ? parse_responses_event(payload) : parse_stream_chunk(payload, chat);
    if (!c.valid) {
      bad_json = true;
      stream_error = "an event is not a JSON object: " + std::string(payload.substr(0, 120));
      return false;
    }
    if (c.error) {
      stream_error = *c.error;
      return false;
    }
    if (c.tokens > 0) {
      rec.token_times_s.push_back(t);
      chunk_tokens += c.tokens;
    }
    if (c.finished) finish_reason = c.finish_reason;
    if (c.prompt_tokens) usage_prompt = c.prompt_tokens;
    if (c.completion_tokens) usage_completion = c.completion_tokens;
    if (stopped(stop)) {
      cancelled = true;
      return false;
    }
    if (t - rec.sent_s > target.request_timeout_s) {
      timed_out = true;
      return false;
    }
    return true;
  };
  auto result = client.post_stream(path, body, on_event);
  rec.end_s = clock.now();
  rec.input_tokens = usage_prompt.value_or(static_cast<int>(spec.prompt_ids.size()));
  rec.output_tokens = usage_completion.value_or(chunk_tokens);
  auto fail = [&](std::string kind, std::string message) {
    rec.ok = false;
    rec.error_kind = std::move(kind);
    rec.error_message = std::move(message);
  };
  if (!result.is_ok()) {
    fail(transport_error_kind(result.status().message()), result.status().message());
  } else if (result->response.status != 200) {
    fail("http_" + std::to_string(result->response.status), describe_error_response(result->response));
  } else if (bad_json) {
    fail("bad_response", *stream_error);
  } else if (stream_error) {
    fail("stream_error", *stream_error);
  } else if (cancelled) {
    fail("cancelled", "stopped by the user");
  } else if (timed_out) {
    fail("timeout", "longer than --request-timeout");
  } else if (!result->done && !(responses && !finish_reason.empty())) {  // a Responses stream ends with its last event
    fail("incomplete_stream", "the stream ended before data: [DONE]");
  } else if (finish_reason == "abort") {
    fail("aborted", "the server aborted the request (finish_reason abort)");
  } else {
    rec.ok = true;
  }
  if (progress != nullptr) {
    ++(rec.ok ? progress->ok : progress->failed);
    progress->output_tokens += rec.output_tokens;
  }
  return rec;
}

StatusOr<std::unique_ptr<HttpClient>> make_client(const TargetOptions& target) {
  HttpClientOptions co;
  co.api_key = target.api_key;
  co.user_agent = "tessera-loadgen";
  co.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::max(1.0, target.request_timeout_s * 1000)));
  return HttpClient::create(target.url, co);
}

// Records from many threads.
class RecordSink {
 public:
  void add(RequestRecord r) {
    std::lock_guard<std::mutex> lock(mu_);
    records_.push_back(std::move(r));
  }
  std::vector<RequestRecord> take() {
    std::lock_guard<std::mutex> lock(mu_);
    std::sort(records_.begin(), records_.end(),
              [](const RequestRecord& a, const RequestRecord& b) { return a.index < b.index; });
    return std::move(records_);
  }

 private:
  std::mutex mu_;
  std::vector<RequestRecord> records_;
};

StatusOr<RunOutput> run_http_closed(const TargetOptions& target, const Workload& workload, const RunPlan& plan,
                                    Progress* progress, const std::atomic<bool>* stop) {
  RunClock clock;
  RecordSink sink;
  std::atomic<int> next{0};
  std::vector<std::thread> users;
  Status first_error;
  std::mutex error_mu;
  for (int u = 0; u < plan.concurrency; ++u) {
    users.emplace_back([&] {
      auto client = make_client(target);
      if (!client.is_ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        first_error = client.status();
        return;
      }
      for (;;) {
        const double t = clock.now();
        const int i = next.fetch_add(1);
        if (!may_issue(plan, i, t, stop)) return;
        sink.add(execute_http(*client.value(), target, workload.request(i), t, clock, progress, stop));
      }
    });
  }
  for (std::thread& t : users) t.join();
  if (!first_error.is_ok()) return first_error;
  RunOutput out;
  out.duration_s = clock.now();
  out.records = sink.take();
  return out;
}

// Open loop: the calling thread follows the schedule and hands each request to a pool of
// threads that grows (up to max_inflight) whenever none is idle.
StatusOr<RunOutput> run_http_open(const TargetOptions& target, const Workload& workload, const RunPlan& plan,
                                  Progress* progress, const std::atomic<bool>* stop) {
  TESSERA_RETURN_IF_ERROR(make_client(target).status());  // the URL is valid
  struct Job {
    int index;
    double scheduled_s;
  };
  RunClock clock;
  RecordSink sink;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> jobs;
  int idle = 0;
  bool closing = false;
  std::vector<std::thread> threads;
  auto worker = [&] {
    auto client = std::move(make_client(target)).value();
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      ++idle;
      cv.wait(lock, [&] { return closing || !jobs.empty(); });
      --idle;
      if (jobs.empty()) return;
      const Job job = jobs.front();
      jobs.pop_front();
      lock.unlock();
      sink.add(execute_http(*client, target, workload.request(job.index), job.scheduled_s, clock, progress, stop));
      lock.lock();
    }
  };
  ArrivalSchedule schedule(*plan.arrivals);
  for (int i = 0;; ++i) {
    const double t = schedule.next();
    if (!may_issue(plan, i, t, stop)) break;
    while (!stopped(stop)) {
      const double wait = t - clock.now();
      if (wait <= 0) break;
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(wait, 0.05)));
    }
    if (stopped(stop)) break;
    std::lock_guard<std::mutex> lock(mu);
    jobs.push_back({i, t});
    if (idle == 0 && static_cast<int>(threads.size()) < target.max_inflight) {
      threads.emplace_back(worker);
    } else {
      cv.notify_one();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    closing = true;
  }
  cv.notify_all();
  for (std::thread& t : threads) t.join();
  RunOutput out;
  out.duration_s = clock.now();
  out.records = sink.take();
  return out;
}

}  // namespace

std::string transport_error_kind(const std::string& message) {
  if (message.find("cannot connect") != std::string::npos || message.find("cannot resolve") != std::string::npos) {
    return "connect";
  }
  if (message.find("timed out") != std::string::npos) return "timeout";
  if (message.find("closed the connection") != std::string::npos) return "disconnected";
  return "transport";
}

StatusOr<RunOutput> run_load(const TargetOptions& target, const Workload& workload, const RunPlan& plan,
                             Progress* progress, const std::atomic<bool>* stop) {
  if (plan.requests <= 0 && plan.duration_s <= 0) {
    return invalid_argument("a run needs --requests or --duration (runs are bounded)");
  }
  if (!plan.arrivals && plan.concurrency < 1) return invalid_argument("a run needs a rate or a concurrency");
  if (plan.arrivals && !(plan.arrivals->rate > 0)) return invalid_argument("the request rate must be positive");
  if (!target.zmq.empty()) return run_load_zmq(target, workload, plan, progress, stop);
  return plan.arrivals ? run_http_open(target, workload, plan, progress, stop)
                       : run_http_closed(target, workload, plan, progress, stop);
}

}  // namespace tessera::loadgen
