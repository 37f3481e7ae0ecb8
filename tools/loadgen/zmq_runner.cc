// The ZeroMQ side of runner.h: one ZmqClient (one DEALER connection) and this thread carry
// every request of the run; events of different requests interleave and are timestamped
// as they are read.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "tools/client/zmq_client.h"
#include "tools/loadgen/run_clock.h"
#include "tools/loadgen/runner.h"

namespace tessera::loadgen {

StatusOr<RunOutput> run_load_zmq(const TargetOptions& target, const Workload& workload, const RunPlan& plan,
                                 Progress* progress, const std::atomic<bool>* stop) {
  ZmqClientOptions zo;
  zo.api_key = target.api_key;
  zo.curve_server_public_key = target.curve_server_public_key;
  auto connected = ZmqClient::connect(target.zmq, zo);
  if (!connected.is_ok()) return connected.status().with_context("--zmq " + target.zmq);
  ZmqClient& client = *connected.value();
  const ZmqRequestKind kind = target.format.chat         ? ZmqRequestKind::kChat
                              : target.format.embeddings ? ZmqRequestKind::kEmbeddings
                                                         : ZmqRequestKind::kCompletion;

  RunClock clock;
  std::optional<ArrivalSchedule> schedule;
  if (plan.arrivals) schedule.emplace(*plan.arrivals);
  double next_time = schedule ? schedule->next() : 0;
  int next_index = 0;
  bool issuing = true;
  std::map<uint64_t, RequestRecord> live;
  std::vector<RequestRecord> done;

  auto finish = [&](std::map<uint64_t, RequestRecord>::iterator it, double t) {
    RequestRecord& rec = it->second;
    rec.end_s = t;
    if (progress != nullptr) {
      ++(rec.ok ? progress->ok : progress->failed);
      progress->output_tokens += rec.output_tokens;
    }
    done.push_back(std::move(rec));
    live.erase(it);
  };
  auto fail = [&](std::map<uint64_t, RequestRecord>::iterator it, double t, std::string kind_name, std::string message) {
    it->second.ok = false;
    it->second.error_kind = std::move(kind_name);
    it->second.error_message = std::move(message);
    finish(it, t);
  };

  while (true) {
    double now = clock.now();
    // Issue what is due.
    while (issuing) {
      const bool due = schedule ? next_time <= now : static_cast<int>(live.size()) < plan.concurrency;
      if (!due) break;
      const double t = schedule ? next_time : now;
      if (!may_issue(plan, next_index, t, stop)) {
        issuing = false;
        break;
      }
      const RequestSpec spec = workload.request(next_index);
      RequestRecord rec;
      rec.index = next_index++;
      rec.scheduled_s = t;
      rec.sent_s = clock.now();
      rec.input_tokens = static_cast<int>(spec.prompt_ids.size());
      if (progress != nullptr) ++progress->issued;
      auto id = client.submit(kind, request_json(spec, target.format, /*http_stream=*/false));
      // A failed handshake (CURVE on one side only) is for good: no request can get through.
      if (!id.is_ok() && id.status().code() == StatusCode::kInvalidArgument)
        return id.status().with_context("--zmq " + target.zmq);
      if (!id.is_ok()) {
        rec.ok = false;
        rec.error_kind = "transport";
        rec.error_message = id.status().message();
        rec.end_s = clock.now();
        if (progress != nullptr) ++progress->failed;
        done.push_back(std::move(rec));
      } else {
        live.emplace(id.value(), std::move(rec));
      }
      if (schedule) next_time = schedule->next();
      now = clock.now();
    }
    if (!issuing && live.empty()) break;

    // Requests over their time limit, or all of them when stopped.
    const bool stop_now = stop != nullptr && stop->load();
    for (auto it = live.begin(); it != live.end();) {
      auto cur = it++;
      if (stop_now || now - cur->second.sent_s > target.request_timeout_s) {
        (void)client.abort(cur->first);  // its late Final is ignored: the id is no longer live
        fail(cur, now, stop_now ? "cancelled" : "timeout",
             stop_now ? "stopped by the user" : "longer than --request-timeout");
      }
    }
    if (stop_now) issuing = false;
    if (!issuing && live.empty()) break;

    double wait_s = 0.05;
    if (issuing && schedule) wait_s = std::clamp(next_time - now, 0.0, 0.05);
    auto ev = client.next_event(std::chrono::milliseconds(static_cast<int64_t>(std::ceil(wait_s * 1e3))));
    const double t = clock.now();
    if (!ev.is_ok() && ev.status().code() == StatusCode::kInvalidArgument)
      return ev.status().with_context("--zmq " + target.zmq);  // the handshake failed for good
    if (!ev.is_ok()) continue;  // timed out: nothing arrived
    auto it = live.find(ev->request_id);
    if (it == live.end()) continue;
    RequestRecord& rec = it->second;
    switch (ev->kind) {
      case ZmqClientEvent::Kind::kDelta:
        if (!ev->token_ids.empty()) {
          rec.token_times_s.push_back(t);
          rec.output_tokens += static_cast<int>(ev->token_ids.size());
        }
        break;
      case ZmqClientEvent::Kind::kFinal: {
        rec.input_tokens = ev->prompt_tokens;
        if (!ev->completion_tokens.empty()) rec.output_tokens = ev->completion_tokens[0];
        const std::string reason = ev->finish_reasons.empty() ? "" : ev->finish_reasons[0];
        if (reason == "abort") {
          fail(it, t, "aborted", "the server aborted the request (finish_reason abort)");
        } else {
          rec.ok = true;
          finish(it, t);
        }
        break;
      }
      case ZmqClientEvent::Kind::kError:
        fail(it, t, "http_" + std::to_string(ev->status),
             (ev->error_code.empty() ? ev->error_type : ev->error_code) + ": " + ev->error_message);
        break;
    }
  }
  RunOutput out;
  out.duration_s = clock.now();
  std::sort(done.begin(), done.end(), [](const RequestRecord& a, const RequestRecord& b) { return a.index < b.index; });
  out.records = std::move(done);
  return out;
}

}  // namespace tessera::loadgen
