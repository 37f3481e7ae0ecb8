#include "coordinator/engine_service.h"

#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/logging.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "coordinator/engine.h"
#include "coordinator/stop_string_matcher.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

Status validate_sampling(const SamplingParams& s) {
  if (!std::isfinite(s.temperature) || s.temperature < 0.0f)
    return invalid_argument("temperature must be >= 0, got " + std::to_string(s.temperature));
  if (s.top_k < 0) return invalid_argument("top_k must be >= 0, got " + std::to_string(s.top_k));
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f))
    return invalid_argument("top_p must be in (0, 1], got " + std::to_string(s.top_p));
  if (!(s.min_p >= 0.0f && s.min_p <= 1.0f))
    return invalid_argument("min_p must be in [0, 1], got " + std::to_string(s.min_p));
  if (!(s.repetition_penalty > 0.0f) || !std::isfinite(s.repetition_penalty))
    return invalid_argument("repetition_penalty must be > 0, got " + std::to_string(s.repetition_penalty));
  if (!std::isfinite(s.presence_penalty) || !std::isfinite(s.frequency_penalty))
    return invalid_argument("presence_penalty and frequency_penalty must be finite");
  if (s.logprobs < 0 || s.logprobs > 20)
    return invalid_argument("logprobs must be in [0, 20], got " + std::to_string(s.logprobs));
  return Status::ok();
}

const char* finish_reason_text(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAborted: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return "error";
}

}  // namespace

struct EngineService::Impl {
  struct Pending {
    SeqId id = 0;
    GenerateRequest request;
    GenerateCallback callback;
    Clock::time_point submitted;
  };
  // A request the engine knows; owned by the loop thread.
  struct Live {
    SeqId id = 0;         // the service's id (what clients see)
    SeqId engine_id = 0;  // the engine's id for the same request
    GenerateCallback callback;
    std::unique_ptr<IncrementalDetokenizer> detok;  // null without a tokenizer
    StopStringMatcher stop;
    int prompt_tokens = 0;
    int completion_tokens = 0;
    Clock::time_point submitted, last_token;
    bool has_token = false;
  };

  Impl(EngineServiceOptions o, StepExecutor& executor, const Tokenizer* tok)
      : options(std::move(o)), tokenizer(tok), engine(options.scheduler, executor) {
    max_model_len = engine.scheduler().max_sequence_len();
    if (options.vocab_size <= 0 && tokenizer) options.vocab_size = tokenizer->vocab_size();
    publish_stats();
  }

  Status validate(const GenerateRequest& r) const;
  void run();
  void admit(Pending p);
  void abort_request(SeqId service_id);
  void handle(const SequenceEvent& e);
  // Ends a live request: one final event, counters, and it is forgotten.
  void finish(Live& r, GenerateEvent ev, const std::string& reason, const std::string& error);
  void deliver(const GenerateCallback& cb, const GenerateEvent& ev, SeqId id);
  void publish_stats();
  void fail_pending_unstarted();

  EngineServiceOptions options;
  const Tokenizer* tokenizer;
  int max_model_len = 0;

  // Shared with submitters; guarded by mu.
  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<Pending> submits;
  std::vector<SeqId> aborts;
  SeqId next_id = 1;
  bool started = false;
  std::thread::id loop_id;  // set once the loop thread exists
  bool draining = false;
  Clock::time_point deadline;
  int engine_waiting = 0;  // the scheduler's queue at the last loop iteration

  std::mutex join_mu;  // one joiner at a time
  std::thread thread;

  // Loop thread only (or any thread once the loop has been joined / never started).
  Engine engine;
  std::unordered_map<SeqId, Live> live;           // by engine id
  std::unordered_map<SeqId, SeqId> engine_id_of;  // service id -> engine id

  mutable std::mutex stats_mu;  // guards the two below
  EngineServiceStats stats;
  int scheduler_waiting = 0;
};

Status EngineService::Impl::validate(const GenerateRequest& r) const {
  if (r.prompt.empty()) return invalid_argument("prompt is empty");
  if (r.max_tokens < 1) return invalid_argument("max_tokens must be >= 1, got " + std::to_string(r.max_tokens));
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
  if (total > max_model_len) {
    return invalid_argument("prompt (" + std::to_string(r.prompt.size()) + " tokens) + max_tokens (" +
                            std::to_string(r.max_tokens) + ") = " + std::to_string(total) +
                            " exceeds max_model_len " + std::to_string(max_model_len));
  }
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    const int32_t t = r.prompt[i];
    if (t < 0 || (options.vocab_size > 0 && t >= options.vocab_size)) {
      return invalid_argument("prompt[" + std::to_string(i) + "] = " + std::to_string(t) +
                              " is outside the vocabulary of " + std::to_string(options.vocab_size) + " tokens");
    }
  }
  TESSERA_RETURN_IF_ERROR(validate_sampling(r.sampling));
  return Status::ok();
}

void EngineService::Impl::deliver(const GenerateCallback& cb, const GenerateEvent& ev, SeqId id) {
  if (!cb) return;
  // A throwing callback must not take the loop (and every other request) down with it.
  try {
    cb(ev);
  } catch (const std::exception& ex) {
    TESSERA_LOG_ERROR("[coord] request {}: callback threw: {}", id, ex.what());
  } catch (...) {
    TESSERA_LOG_ERROR("[coord] request {}: callback threw", id);
  }
}

void EngineService::Impl::admit(Pending p) {
  EngineRequest er;
  er.prompt = p.request.prompt;
  er.sampling = p.request.sampling;
  er.max_new_tokens = p.request.max_tokens;
  er.stop = p.request.stop;
  er.priority = p.request.priority;
  const int prompt_tokens = static_cast<int>(p.request.prompt.size());
  StatusOr<SeqId> engine_id = engine.add_request(std::move(er));
  if (!engine_id.is_ok()) {
    // validate() should have caught it; the engine's own checks are the last word.
    GenerateEvent ev;
    ev.finished = true;
    ev.finish_reason = "error";
    ev.error = engine_id.status().message();
    ev.prompt_tokens = prompt_tokens;
    {
      std::lock_guard<std::mutex> lk(stats_mu);
      ++stats.requests_failed;
    }
    deliver(p.callback, ev, p.id);
    return;
  }
  Live r;
  r.id = p.id;
  r.engine_id = engine_id.value();
  r.callback = std::move(p.callback);
  if (tokenizer) {
    // The prompt gives context (the space before the first generated word); its own text
    // is not emitted.
    r.detok = std::make_unique<IncrementalDetokenizer>(*tokenizer, p.request.skip_special_tokens, p.request.prompt);
    r.stop = StopStringMatcher(std::move(p.request.stop_strings));
  }
  r.prompt_tokens = prompt_tokens;
  r.submitted = p.submitted;
  engine_id_of[r.id] = r.engine_id;
  live.emplace(r.engine_id, std::move(r));
}

void EngineService::Impl::finish(Live& r, GenerateEvent ev, const std::string& reason, const std::string& error) {
  ev.finished = true;
  ev.finish_reason = reason;
  ev.error = error;
  ev.prompt_tokens = r.prompt_tokens;
  ev.completion_tokens = r.completion_tokens;
  {
    std::lock_guard<std::mutex> lk(stats_mu);
    if (reason == "stop") ++stats.requests_finished_stop;
    else if (reason == "length") ++stats.requests_finished_length;
    else if (reason == "abort") ++stats.requests_aborted;
    else ++stats.requests_failed;
    // Only completed generations say something about latency.
    if (reason == "stop" || reason == "length") stats.e2e.observe(seconds_between(r.submitted, Clock::now()));
  }
  GenerateCallback cb = std::move(r.callback);
  const SeqId id = r.id;
  engine_id_of.erase(id);
  live.erase(r.engine_id);  // `r` dangles from here
  deliver(cb, ev, id);
}

void EngineService::Impl::abort_request(SeqId service_id) {
  auto it = engine_id_of.find(service_id);
  if (it == engine_id_of.end()) return;  // unknown or already finished
  auto lit = live.find(it->second);
  engine.abort(it->second);  // frees its KV blocks now
  GenerateEvent ev;
  // Text still held back (partial stop string, incomplete character) is dropped: the
  // client asked to stop listening.
  finish(lit->second, std::move(ev), "abort", "");
}

void EngineService::Impl::handle(const SequenceEvent& e) {
  auto it = live.find(e.seq_id);
  if (it == live.end()) return;  // aborted between schedule and result
  Live& r = it->second;
  GenerateEvent ev;
  ev.tokens = e.new_tokens;
  std::string piece;
  if (!e.new_tokens.empty()) {
    const Clock::time_point now = Clock::now();
    {
      std::lock_guard<std::mutex> lk(stats_mu);
      stats.generation_tokens_total += e.new_tokens.size();
      if (!r.has_token) {
        stats.ttft.observe(seconds_between(r.submitted, now));
        stats.prompt_tokens_total += static_cast<uint64_t>(r.prompt_tokens);
      } else {
        stats.itl.observe(seconds_between(r.last_token, now));
      }
    }
    r.has_token = true;
    r.last_token = now;
    r.completion_tokens += static_cast<int>(e.new_tokens.size());
    if (r.detok) {
      for (const SampledToken& t : e.new_tokens) piece += r.detok->push(t.token);
    }
  }
  if (e.finished && r.detok) piece += r.detok->finish();
  StopStringMatcher::Result m = r.stop.push(piece);
  ev.text = std::move(m.text);
  ev.prompt_tokens = r.prompt_tokens;
  ev.completion_tokens = r.completion_tokens;
  if (m.stopped) {
    if (!e.finished) engine.abort(r.engine_id);  // free its blocks; no more steps for it
    finish(r, std::move(ev), "stop", "");
    return;
  }
  if (e.finished) {
    ev.text += r.stop.finish();
    finish(r, std::move(ev), finish_reason_text(e.reason), e.reason == FinishReason::kError ? e.error : "");
    return;
  }
  if (ev.text.empty() && ev.tokens.empty()) return;
  deliver(r.callback, ev, r.id);
}

void EngineService::Impl::publish_stats() {
  const SchedulerStats s = engine.scheduler().stats();
  int queued = 0;
  {
    std::lock_guard<std::mutex> lk(mu);
    engine_waiting = s.num_waiting;
    queued = static_cast<int>(submits.size());
  }
  std::lock_guard<std::mutex> lk(stats_mu);
  stats.num_running = s.num_running;
  stats.num_waiting = s.num_waiting + queued;
  scheduler_waiting = s.num_waiting;
  stats.kv_blocks_total = s.num_blocks;
  stats.kv_blocks_free = s.num_free_blocks;
  stats.prefix_cache_hit_tokens = s.prefix_hit_tokens;
  stats.preemptions = s.num_preemptions;
  stats.kv_window_released_blocks = s.window_releases;
}

void EngineService::Impl::run() {
  bool idle_wait = false;
  for (;;) {
    std::vector<Pending> new_submits;
    std::vector<SeqId> new_aborts;
    bool drain = false;
    Clock::time_point drain_deadline;
    {
      std::unique_lock<std::mutex> lk(mu);
      auto ready = [&] { return !submits.empty() || !aborts.empty() || draining || engine.has_work(); };
      if (idle_wait) {
        // The engine has work but could not schedule any (should not happen; guards a spin).
        cv.wait_for(lk, std::chrono::milliseconds(1), [&] { return !submits.empty() || !aborts.empty() || draining; });
      } else {
        cv.wait(lk, ready);
      }
      new_submits.swap(submits);
      new_aborts.swap(aborts);
      drain = draining;
      drain_deadline = deadline;
    }
    for (Pending& p : new_submits) admit(std::move(p));
    for (SeqId id : new_aborts) abort_request(id);
    if (drain && Clock::now() >= drain_deadline) {
      std::vector<SeqId> rest;
      for (const auto& [service_id, engine_id] : engine_id_of) rest.push_back(service_id);
      for (SeqId id : rest) abort_request(id);
    }
    bool stepped = false;
    if (engine.has_work()) {
      const uint64_t before = engine.steps();
      std::vector<SequenceEvent> events = engine.step();
      stepped = engine.steps() != before;
      for (const SequenceEvent& e : events) handle(e);
    }
    publish_stats();
    if (drain && live.empty()) {
      std::lock_guard<std::mutex> lk(mu);
      if (submits.empty()) break;  // nothing can be added any more: draining refuses submits
    }
    idle_wait = engine.has_work() && !stepped;
  }
}

// Requests submitted to a service whose loop never ran still get their one final event.
void EngineService::Impl::fail_pending_unstarted() {
  std::vector<Pending> pending;
  {
    std::lock_guard<std::mutex> lk(mu);
    pending.swap(submits);
    aborts.clear();
  }
  for (Pending& p : pending) {
    GenerateEvent ev;
    ev.finished = true;
    ev.finish_reason = "abort";
    ev.prompt_tokens = static_cast<int>(p.request.prompt.size());
    {
      std::lock_guard<std::mutex> lk(stats_mu);
      ++stats.requests_aborted;
    }
    deliver(p.callback, ev, p.id);
  }
  publish_stats();
}

EngineService::EngineService(EngineServiceOptions options, StepExecutor& executor, const Tokenizer* tokenizer)
    : impl_(std::make_unique<Impl>(std::move(options), executor, tokenizer)) {}

EngineService::~EngineService() { stop(); }

void EngineService::start() {
  std::lock_guard<std::mutex> join_lk(impl_->join_mu);
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    if (impl_->started || impl_->draining) return;
    impl_->started = true;
  }
  impl_->thread = std::thread([impl = impl_.get()] {
    {
      // Before any callback runs, so drain_and_stop from a callback knows not to join.
      std::lock_guard<std::mutex> lk(impl->mu);
      impl->loop_id = std::this_thread::get_id();
    }
    impl->run();
  });
}

void EngineService::drain_and_stop(std::chrono::milliseconds deadline) {
  bool on_loop_thread = false;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    on_loop_thread = impl_->loop_id == std::this_thread::get_id();
    const Clock::time_point d = Clock::now() + deadline;
    if (!impl_->draining) {
      impl_->draining = true;
      impl_->deadline = d;
    } else if (d < impl_->deadline) {
      impl_->deadline = d;  // a later, stricter stop (e.g. the destructor) shortens the drain
    }
  }
  {
    std::lock_guard<std::mutex> lk(impl_->stats_mu);
    impl_->stats.draining = true;
  }
  impl_->cv.notify_all();
  // Called from a callback (the loop thread): the loop ends by itself; joining would deadlock.
  if (on_loop_thread) return;
  std::lock_guard<std::mutex> join_lk(impl_->join_mu);
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->fail_pending_unstarted();
}

StatusOr<SeqId> EngineService::submit(GenerateRequest request, GenerateCallback callback) {
  TESSERA_RETURN_IF_ERROR(impl_->validate(request));
  SeqId id = 0;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    if (impl_->draining) return Status(StatusCode::kUnavailable, "the server is shutting down");
    const int queued = static_cast<int>(impl_->submits.size()) + impl_->engine_waiting;
    if (queued >= impl_->options.max_queued_requests) {
      return resource_exhausted("request queue is full (" + std::to_string(queued) + " of " +
                                std::to_string(impl_->options.max_queued_requests) + " requests waiting)");
    }
    id = impl_->next_id++;
    impl_->submits.push_back(Impl::Pending{id, std::move(request), std::move(callback), Clock::now()});
  }
  impl_->cv.notify_one();
  return id;
}

void EngineService::abort(SeqId id) {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->aborts.push_back(id);
  }
  impl_->cv.notify_one();
}

EngineServiceStats EngineService::stats() const {
  int queued = 0;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    queued = static_cast<int>(impl_->submits.size());
  }
  std::lock_guard<std::mutex> lk(impl_->stats_mu);
  EngineServiceStats s = impl_->stats;
  // Submits not yet taken by the loop wait too (the loop may not be running).
  s.num_waiting = impl_->scheduler_waiting + queued;
  return s;
}

int EngineService::max_model_len() const { return impl_->max_model_len; }

}  // namespace tessera
