#include "coordinator/server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace tessera {

namespace {

// The shortest decimal that reads back as `v` ("0.005", not 5.0000000000000001e-03).
std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

// A bucket bound as Prometheus' own clients print it: the shortest decimal, with ".0" on
// whole numbers (le="1.0", le="0.005"), so series join with those of vLLM's exporters.
std::string bound_label(double v) {
  std::string s = num(v);
  if (s.find_first_of(".eEIN") == std::string::npos) s += ".0";
  return s;
}

std::string escape_label(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void header(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name + "{" + labels + "} " + num(v) + "\n";
}

}  // namespace

std::string render_vllm_series(const EngineServiceStats& s, const std::string& labels) {
  std::string out;
  auto one = [&](const std::string& name, const char* type, const std::string& help, double v) {
    header(out, name, type, help);
    sample(out, name, labels, v);
  };
  auto u = [](uint64_t v) { return static_cast<double>(v); };
  one("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", s.num_requests_running);
  one("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", s.num_requests_waiting);
  const double usage =
      s.kv_blocks_total > 0 ? 1.0 - static_cast<double>(s.kv_blocks_free) / s.kv_blocks_total : 0.0;
  one("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage);
  one("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", u(s.prompt_tokens_total));
  if (!s.collectives.empty()) {
    header(out, "tessera:collectives_info", "gauge", "How the tensor-parallel ranks reduce (worker.collectives as chosen).");
    sample(out, "tessera:collectives_info", labels + (labels.empty() ? "" : ",") + "kind=\"" + escape_label(s.collectives) + "\"",
           1.0);
  }
  if (s.max_lora > 0) {
    // vLLM's shape, which the Gateway API Inference Extension's endpoint picker reads: the
    // adapters in the batch and waiting as comma-separated labels; the value is the time.
    auto names = [](const std::set<std::string>& set) {
      std::string joined;
      for (const std::string& n : set) joined += (joined.empty() ? "" : ",") + escape_label(n);
      return joined;
    };
    header(out, "vllm:lora_requests_info", "gauge", "Running stats on lora requests.");
    sample(out, "vllm:lora_requests_info",
           labels + (labels.empty() ? "" : ",") + "max_lora=\"" + std::to_string(s.max_lora) +
               "\",running_lora_adapters=\"" + names(s.running_lora) + "\",waiting_lora_adapters=\"" +
               names(s.waiting_lora) + "\"",
           static_cast<double>(std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count()));
  }
  one("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
      u(s.generation_tokens_total));
  header(out, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
  const std::string sep = labels.empty() ? "" : ",";
  const std::pair<const char*, uint64_t> reasons[] = {{"stop", s.requests_finished_stop},
                                                      {"length", s.requests_finished_length},
                                                      {"abort", s.requests_aborted},
                                                      {"error", s.requests_failed}};
  for (const auto& [reason, count] : reasons)
    sample(out, "vllm:request_success_total", labels + sep + "finished_reason=\"" + reason + "\"", u(count));
  one("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
      u(s.preemptions));
  one("vllm:prefix_cache_queries_total", "counter",
      "Prefix cache queries, in terms of number of queried tokens.", u(s.prefix_cache_query_tokens));
  one("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
      u(s.prefix_cache_hit_tokens));
  one("vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", u(s.spec.num_drafts));
  one("vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", u(s.spec.num_draft_tokens));
  one("vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
      u(s.spec.num_accepted_tokens));
  header(out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
         "Accepted tokens per draft position.");
  for (size_t i = 0; i < s.spec.accepted_per_pos.size(); ++i)
    sample(out, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
           labels + sep + "position=\"" + std::to_string(i) + "\"", u(s.spec.accepted_per_pos[i]));
  out += render_histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                          labels, s.ttft);
  out += render_histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                          labels, s.itl);
  out += render_histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                          labels, s.e2e);
  out += render_histogram("vllm:request_queue_time_seconds",
                          "Histogram of time spent in WAITING phase for request.", labels, s.queue);
  out += render_histogram("vllm:request_prefill_time_seconds",
                          "Histogram of time spent in PREFILL phase for request.", labels, s.prefill);
  out += render_histogram("vllm:request_decode_time_seconds",
                          "Histogram of time spent in DECODE phase for request.", labels, s.decode);
  return out;
}

std::string render_histogram(const std::string& name, const std::string& help, const std::string& labels,
                             const LatencyHistogram& h) {
  std::string out;
  header(out, name, "histogram", help);
  const std::string sep = labels.empty() ? "" : ",";
  for (size_t i = 0; i < h.bounds().size(); ++i) {
    sample(out, name + "_bucket", labels + sep + "le=\"" + bound_label(h.bounds()[i]) + "\"",
           static_cast<double>(h.cumulative(i)));
  }
  sample(out, name + "_bucket", labels + sep + "le=\"+Inf\"", static_cast<double>(h.count()));
  sample(out, name + "_sum", labels, h.sum());
  sample(out, name + "_count", labels, static_cast<double>(h.count()));
  return out;
}

std::string render_metrics(const EngineServiceStats& s, const std::string& model_name,
                           const std::map<int, uint64_t>& http_responses,
                           const std::map<int, uint64_t>& zmq_replies) {
  const std::string m = "model_name=\"" + escape_label(model_name) + "\"";
  std::string out;
  auto gauge = [&](const std::string& name, const std::string& help, double v) {
    header(out, name, "gauge", help);
    sample(out, name, m, v);
  };
  auto counter = [&](const std::string& name, const std::string& help, double v) {
    header(out, name, "counter", help);
    sample(out, name, m, v);
  };
  gauge("tessera:num_requests_running", "Number of sequences (choices) in the running batch (prefill or decode).",
        s.num_running);
  gauge("tessera:num_requests_waiting", "Number of sequences (choices) waiting to be scheduled.", s.num_waiting);
  const double usage =
      s.kv_blocks_total > 0 ? 1.0 - static_cast<double>(s.kv_blocks_free) / s.kv_blocks_total : 0.0;
  gauge("tessera:kv_cache_usage_perc", "KV-cache usage: fraction of blocks in use (1 = full).", usage);
  gauge("tessera:kv_cache_blocks_total", "KV-cache blocks in the pool.", s.kv_blocks_total);
  gauge("tessera:kv_cache_blocks_free", "KV-cache blocks free (including evictable prefix-cache blocks).",
        s.kv_blocks_free);
  gauge("tessera:draining", "1 while the server drains (new requests are refused).", s.draining ? 1 : 0);
  counter("tessera:prompt_tokens_total", "Prompt tokens processed.", static_cast<double>(s.prompt_tokens_total));
  counter("tessera:generation_tokens_total", "Tokens generated.", static_cast<double>(s.generation_tokens_total));

  header(out, "tessera:request_success_total", "counter", "Requests finished, by finish reason.");
  sample(out, "tessera:request_success_total", m + ",finished_reason=\"stop\"",
         static_cast<double>(s.requests_finished_stop));
  sample(out, "tessera:request_success_total", m + ",finished_reason=\"length\"",
         static_cast<double>(s.requests_finished_length));
  sample(out, "tessera:request_success_total", m + ",finished_reason=\"abort\"",
         static_cast<double>(s.requests_aborted));
  counter("tessera:request_failure_total", "Requests that ended with an error.",
          static_cast<double>(s.requests_failed));
  counter("tessera:prefix_cache_hits_total", "Prompt tokens served from the prefix cache.",
          static_cast<double>(s.prefix_cache_hit_tokens));
  counter("tessera:num_preemptions_total", "Sequences preempted (recomputed later) for lack of KV blocks.",
          static_cast<double>(s.preemptions));
  counter("tessera:kv_window_released_blocks_total",
          "KV blocks given back early because every layer's sliding window had moved past them.",
          static_cast<double>(s.kv_window_released_blocks));
  counter("tessera:prefill_capped_steps_total",
          "Steps whose prompt tokens were capped to bound running decodes' latency (scheduler.max_decode_slowdown, max_tpot_slowdown).",
          static_cast<double>(s.prefill_capped_steps));
  gauge("tessera:prefill_token_cap", "The last step's cap on prompt tokens beside decodes (0: none).",
        s.prefill_token_cap);
  counter("tessera:structured_mask_deferrals_total",
          "Structured-output masks not done within a step's budget (scheduler.structured_mask_budget_ms): "
          "their sequence sat out steps while the others went on.",
          static_cast<double>(s.deferred_masks));
  if (!s.lora_requests.empty()) {
    header(out, "tessera:lora_requests_total", "counter", "Requests admitted with each LoRA adapter.");
    for (const auto& [name, count] : s.lora_requests)
      sample(out, "tessera:lora_requests_total", m + ",lora_name=\"" + escape_label(name) + "\"",
             static_cast<double>(count));
  }

  out += render_histogram("tessera:time_to_first_token_seconds", "Time to first token in seconds.", m,
                          s.ttft);
  out += render_histogram("tessera:time_per_output_token_seconds",
                          "Time per output token (inter-token latency) in seconds.", m, s.itl);
  out += render_histogram("tessera:e2e_request_latency_seconds", "End-to-end request latency in seconds.", m,
                          s.e2e);

  out += render_vllm_series(s, m);

  if (!http_responses.empty()) {
    header(out, "tessera:http_responses_total", "counter", "HTTP responses sent, by status code.");
    for (const auto& [code, count] : http_responses)
      sample(out, "tessera:http_responses_total", m + ",code=\"" + std::to_string(code) + "\"",
             static_cast<double>(count));
  }
  if (!zmq_replies.empty()) {
    header(out, "tessera:zmq_replies_total", "counter",
           "ZeroMQ client API replies (Final = 200, Error = its status), by status code.");
    for (const auto& [code, count] : zmq_replies)
      sample(out, "tessera:zmq_replies_total", m + ",code=\"" + std::to_string(code) + "\"",
             static_cast<double>(count));
  }
  return out;
}

}  // namespace tessera
