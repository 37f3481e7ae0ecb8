#include "coordinator/engine_service.h"

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

}  // namespace

struct EngineService::Impl {
  struct Pending {
    RequestId id = 0;
    std::shared_ptr<const Request> request;
    GenerateCallback callback;
    Clock::time_point submitted;
  };
  // One choice's output state.
  struct Choice {
    std::unique_ptr<IncrementalDetokenizer> detok;  // null without a tokenizer
    StopStringMatcher stop;
    int completion_tokens = 0;
    Clock::time_point last_token;
    bool has_token = false;
    bool done = false;
  };
  // A request the engine knows; owned by the loop thread.
  struct Live {
    RequestId id = 0;  // the engine's id too
    GenerateCallback callback;
    std::vector<Choice> choices;
    int remaining = 0;  // choices not finished
    int prompt_tokens = 0;
    Clock::time_point submitted;
  };

  Impl(EngineServiceOptions o, StepExecutor& executor, const Tokenizer* tok)
      : options(std::move(o)), tokenizer(tok), engine(options.scheduler, executor) {
    max_model_len = engine.scheduler().max_sequence_len();
    if (options.vocab_size <= 0 && tokenizer) options.vocab_size = tokenizer->vocab_size();
    limits = engine.scheduler().request_limits();
    limits.vocab_size = options.vocab_size;
    limits.max_tokens_must_fit = true;  // an API caller gets what it asked for, or an error
    publish_stats();
  }

  void run();
  void admit(Pending p);
  void abort_request(RequestId id);
  void handle(const SequenceEvent& e);
  // Ends one choice of a live request: its final event and counters; the request is
  // forgotten with its last choice.
  void finish(Live& r, int choice, GenerateEvent ev, FinishReason reason, const std::string& error);
  void deliver(const GenerateCallback& cb, const GenerateEvent& ev, RequestId id);
  void publish_stats();
  void fail_pending_unstarted();
  void count_finish(FinishReason reason);
  // A request that never reached the engine: one final event per choice.
  void end_unstarted(const Pending& p, FinishReason reason, const std::string& error);

  EngineServiceOptions options;
  const Tokenizer* tokenizer;
  int max_model_len = 0;
  RequestLimits limits;  // what submit() validates against

  // Shared with submitters; guarded by mu.
  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<Pending> submits;
  std::vector<RequestId> aborts;
  RequestId next_id = 1;
  bool started = false;
  std::thread::id loop_id;  // set once the loop thread exists
  bool draining = false;
  Clock::time_point deadline;
  int engine_waiting = 0;  // the scheduler's queue at the last loop iteration

  std::mutex join_mu;  // one joiner at a time
  std::thread thread;

  // Loop thread only (or any thread once the loop has been joined / never started).
  Engine engine;
  std::unordered_map<RequestId, Live> live;

  mutable std::mutex stats_mu;  // guards the two below
  EngineServiceStats stats;
  int scheduler_waiting = 0;
};

void EngineService::Impl::deliver(const GenerateCallback& cb, const GenerateEvent& ev, RequestId id) {
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

void EngineService::Impl::count_finish(FinishReason reason) {
  std::lock_guard<std::mutex> lk(stats_mu);
  switch (reason) {
    case FinishReason::kStop: ++stats.requests_finished_stop; break;
    case FinishReason::kLength: ++stats.requests_finished_length; break;
    case FinishReason::kAborted: ++stats.requests_aborted; break;
    case FinishReason::kError:
    case FinishReason::kNone: ++stats.requests_failed; break;
  }
}

void EngineService::Impl::end_unstarted(const Pending& p, FinishReason reason, const std::string& error) {
  for (int c = 0; c < p.request->n; ++c) {
    GenerateEvent ev;
    ev.choice = c;
    ev.finished = true;
    ev.finish_reason = reason;
    ev.error = error;
    ev.prompt_tokens = static_cast<int>(p.request->prompt.size());
    count_finish(reason);
    deliver(p.callback, ev, p.id);
  }
}

void EngineService::Impl::admit(Pending p) {
  const Request& req = *p.request;
  const int prompt_tokens = static_cast<int>(req.prompt.size());
  if (Status st = engine.add_request(p.id, p.request); !st.is_ok()) {
    // validate_request() in submit() should have caught it; the engine's checks are the last word.
    end_unstarted(p, FinishReason::kError, st.message());
    return;
  }
  Live r;
  r.id = p.id;
  r.callback = std::move(p.callback);
  r.choices.resize(static_cast<size_t>(req.n));
  for (Choice& c : r.choices) {
    if (!tokenizer) continue;
    // The prompt gives context (the space before the first generated word); its own text
    // is not emitted.
    c.detok = std::make_unique<IncrementalDetokenizer>(*tokenizer, req.skip_special_tokens, req.prompt);
    c.stop = StopStringMatcher(req.stop_strings);
  }
  r.remaining = req.n;
  r.prompt_tokens = prompt_tokens;
  r.submitted = p.submitted;
  live.emplace(r.id, std::move(r));
}

void EngineService::Impl::finish(Live& r, int choice, GenerateEvent ev, FinishReason reason,
                                 const std::string& error) {
  ev.choice = choice;
  ev.finished = true;
  ev.finish_reason = reason;
  ev.error = error;
  ev.prompt_tokens = r.prompt_tokens;
  ev.completion_tokens = r.choices[static_cast<size_t>(choice)].completion_tokens;
  r.choices[static_cast<size_t>(choice)].done = true;
  count_finish(reason);
  // Only completed generations say something about latency.
  if (reason == FinishReason::kStop || reason == FinishReason::kLength) {
    std::lock_guard<std::mutex> lk(stats_mu);
    stats.e2e.observe(seconds_between(r.submitted, Clock::now()));
  }
  const RequestId id = r.id;
  if (--r.remaining > 0) return deliver(r.callback, ev, id);
  GenerateCallback cb = std::move(r.callback);
  live.erase(id);  // `r` dangles from here
  deliver(cb, ev, id);
}

void EngineService::Impl::abort_request(RequestId id) {
  auto it = live.find(id);
  if (it == live.end()) return;  // unknown or already finished
  engine.abort(id);  // frees its KV blocks now
  // Text still held back (partial stop string, incomplete character) is dropped: the
  // client asked to stop listening.
  const int n = static_cast<int>(it->second.choices.size());
  for (int c = 0; c < n; ++c) {
    it = live.find(id);  // the last finish erases the request
    if (it == live.end()) break;
    if (!it->second.choices[static_cast<size_t>(c)].done) finish(it->second, c, GenerateEvent(), FinishReason::kAborted, "");
  }
}

void EngineService::Impl::handle(const SequenceEvent& e) {
  auto it = live.find(request_of(e.seq_id));
  if (it == live.end()) return;  // aborted between schedule and result
  Live& r = it->second;
  const int c = choice_of(e.seq_id);
  Choice& ch = r.choices.at(static_cast<size_t>(c));
  if (ch.done) return;  // ended by its stop string; the engine's last word is dropped
  GenerateEvent ev;
  ev.choice = c;
  ev.tokens = e.new_tokens;
  std::string piece;
  if (!e.new_tokens.empty()) {
    const Clock::time_point now = Clock::now();
    {
      std::lock_guard<std::mutex> lk(stats_mu);
      stats.generation_tokens_total += e.new_tokens.size();
      if (!ch.has_token) {
        stats.ttft.observe(seconds_between(r.submitted, now));
        stats.prompt_tokens_total += static_cast<uint64_t>(r.prompt_tokens);
      } else {
        stats.itl.observe(seconds_between(ch.last_token, now));
      }
    }
    ch.has_token = true;
    ch.last_token = now;
    ch.completion_tokens += static_cast<int>(e.new_tokens.size());
    if (ch.detok) {
      for (const SampledToken& t : e.new_tokens) piece += ch.detok->push(t.token);
    }
  }
  if (e.finished && ch.detok) piece += ch.detok->finish();
  StopStringMatcher::Result m = ch.stop.push(piece);
  ev.text = std::move(m.text);
  ev.prompt_tokens = r.prompt_tokens;
  ev.completion_tokens = ch.completion_tokens;
  if (m.stopped) {
    if (!e.finished) engine.abort_choice(r.id, c);  // free its blocks; no more steps for it
    finish(r, c, std::move(ev), FinishReason::kStop, "");
    return;
  }
  if (e.finished) {
    ev.text += ch.stop.finish();
    finish(r, c, std::move(ev), e.reason, e.reason == FinishReason::kError ? e.error : "");
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
    engine_waiting = s.num_waiting_requests;  // the queue bound counts requests, not choices
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
    std::vector<RequestId> new_aborts;
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
    for (RequestId id : new_aborts) abort_request(id);
    if (drain && Clock::now() >= drain_deadline) {
      std::vector<RequestId> rest;
      for (const auto& [id, r] : live) rest.push_back(id);
      for (RequestId id : rest) abort_request(id);
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
  for (const Pending& p : pending) end_unstarted(p, FinishReason::kAborted, "");
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

StatusOr<RequestId> EngineService::submit(std::shared_ptr<const Request> request, GenerateCallback callback) {
  if (request == nullptr) return invalid_argument("no request");
  TESSERA_RETURN_IF_ERROR(validate_request(*request, impl_->limits));
  RequestId id = 0;
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

void EngineService::abort(RequestId id) {
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

int EngineService::max_queued_requests() const { return impl_->options.max_queued_requests; }

std::string EngineService::max_model_len_limit() const {
  const RequestLimits& l = impl_->limits;
  if (l.max_model_len > 0 && l.max_sequence_len >= l.max_model_len) return "";
  return sequence_limit_name(l);
}

}  // namespace tessera
