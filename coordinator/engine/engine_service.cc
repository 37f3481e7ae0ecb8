#include "coordinator/engine/engine_service.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "common/logging.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "coordinator/engine/engine.h"
#include "coordinator/engine/stop_string_matcher.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A request with several choices is counted once, under the most telling way one of them
// ended: an error outranks an abort, which outranks a length cut, which outranks a stop.
int outcome_rank(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return 0;
    case FinishReason::kStop: return 1;
    case FinishReason::kLength: return 2;
    case FinishReason::kAborted: return 3;
    case FinishReason::kError: return 4;
  }
  return 0;
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
    int min_tokens = 0;  // stop strings end a choice only from this many tokens on
    // The EOS or stop token id that ends a choice is not in its text unless
    // include_stop_str_in_output (vLLM), so skip_special_tokens=false does not end texts in "</s>".
    bool stop_token_in_text = false;
    StopConditions stop;  // the request's: which tokens those are
    // Prompt logprobs by position (0 stays empty), gathered from the prefill's steps; handed
    // to each choice with its first event.
    bool wants_prompt_logprobs = false;
    std::vector<PromptLogprob> prompt_logprobs;
    int prompt_logprobs_received = 0;  // slots filled
    Clock::time_point submitted;
    // For the per-request latency histograms.
    bool scheduled = false;           // some step has run (part of) its prompt
    Clock::time_point first_scheduled;
    bool has_first_token = false;     // of any choice
    Clock::time_point first_token;
    FinishReason outcome = FinishReason::kNone;  // of the choices finished so far (outcome_rank)
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
  // `unavailable`: the step failed because the executor could not run it (GenerateEvent).
  void handle(const SequenceEvent& e, bool unavailable);
  // The executor is not ready: ends every request that has waited longer than
  // options.executor_wait for it (their choices get kError + unavailable).
  void expire_waiting_for_executor(Clock::time_point now);
  // Ends one choice of a live request: its final event and counters; the request is
  // forgotten with its last choice.
  void finish(Live& r, int choice, GenerateEvent ev, FinishReason reason, const std::string& error);
  void deliver(const GenerateCallback& cb, const GenerateEvent& ev, RequestId id);
  void publish_stats();
  void fail_pending_unstarted();
  void count_finish(FinishReason reason);
  // Marks the requests whose first sequence the step that began at `step_start` scheduled.
  void mark_scheduled(Clock::time_point step_start);
  // The request's last choice ended: its counter and latency histograms.
  void count_request(const Live& r, Clock::time_point now);
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
  struct LoraOp {
    bool load = true;
    std::string name, dir;
    std::function<void(Status)> done;
  };
  std::vector<LoraOp> lora_ops;  // queued by load_lora / unload_lora
  std::vector<LoraOp> lora_waiting;  // handed to the engine, waiting for their step
  RequestId next_id = 1;
  bool started = false;
  std::thread::id loop_id;  // set once the loop thread exists
  bool draining = false;
  Clock::time_point deadline;
  int engine_waiting = 0;  // the scheduler's queue at the last loop iteration

  // Loop thread only: since when the executor has not been ready (options.executor_ready).
  std::optional<Clock::time_point> outage_since;

  std::mutex join_mu;  // one joiner at a time
  std::thread thread;

  // Loop thread only (or any thread once the loop has been joined / never started).
  Engine engine;
  std::unordered_map<RequestId, Live> live;
  std::vector<RequestId> unscheduled;  // live requests no step has scheduled yet

  mutable std::mutex stats_mu;  // guards the two below
  EngineServiceStats stats;
  int scheduler_waiting = 0;
  int engine_requests_waiting = 0;  // live requests not running, at the last loop iteration
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

void EngineService::Impl::count_request(const Live& r, Clock::time_point now) {
  count_finish(r.outcome);
  // Only completed generations say something about latency.
  if (r.outcome != FinishReason::kStop && r.outcome != FinishReason::kLength) return;
  std::lock_guard<std::mutex> lk(stats_mu);
  stats.e2e.observe(seconds_between(r.submitted, now));
  if (r.scheduled) stats.queue.observe(seconds_between(r.submitted, r.first_scheduled));
  if (r.scheduled && r.has_first_token) stats.prefill.observe(seconds_between(r.first_scheduled, r.first_token));
  if (r.has_first_token) stats.decode.observe(seconds_between(r.first_token, now));
}

void EngineService::Impl::mark_scheduled(Clock::time_point step_start) {
  std::erase_if(unscheduled, [&](RequestId id) {
    auto it = live.find(id);
    if (it == live.end()) return true;  // ended before any step ran it
    // Choice 0 exists from the start (the others fork from it); a finished one is no longer found.
    const Sequence* seq = engine.scheduler().find(choice_seq_id(id, 0));
    if (seq != nullptr && seq->state() == SequenceState::kWaiting) return false;
    it->second.scheduled = true;
    it->second.first_scheduled = step_start;
    return true;
  });
}

void EngineService::Impl::end_unstarted(const Pending& p, FinishReason reason, const std::string& error) {
  count_finish(reason);  // once: it is one request whatever its n
  for (int c = 0; c < p.request->n; ++c) {
    GenerateEvent ev;
    ev.choice = c;
    ev.finished = true;
    ev.finish_reason = reason;
    ev.error = error;
    ev.prompt_tokens = static_cast<int>(p.request->prompt.size());
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
    c.stop = StopStringMatcher(req.stop_strings, req.include_stop_str_in_output);
  }
  r.remaining = req.n;
  r.prompt_tokens = prompt_tokens;
  r.min_tokens = req.sampling.min_tokens;
  r.stop_token_in_text = req.include_stop_str_in_output;
  r.stop = req.stop;
  r.wants_prompt_logprobs = req.sampling.prompt_logprobs >= 0;
  if (r.wants_prompt_logprobs) r.prompt_logprobs.resize(static_cast<size_t>(prompt_tokens));
  r.submitted = p.submitted;
  if (!req.lora.empty()) {
    std::lock_guard<std::mutex> lk(stats_mu);
    ++stats.lora_requests[req.lora];
  }
  unscheduled.push_back(r.id);
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
  if (outcome_rank(reason) > outcome_rank(r.outcome)) r.outcome = reason;
  const RequestId id = r.id;
  if (--r.remaining > 0) return deliver(r.callback, ev, id);
  count_request(r, Clock::now());
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

void EngineService::Impl::handle(const SequenceEvent& e, bool unavailable) {
  auto it = live.find(request_of(e.seq_id));
  if (it == live.end()) return;  // aborted between schedule and result
  Live& r = it->second;
  const int c = choice_of(e.seq_id);
  Choice& ch = r.choices.at(static_cast<size_t>(c));
  if (r.wants_prompt_logprobs) {
    for (const PromptLogprob& lp : e.prompt_logprobs) {
      if (lp.position < 1 || lp.position >= r.prompt_tokens) continue;
      PromptLogprob& slot = r.prompt_logprobs[static_cast<size_t>(lp.position)];
      if (slot.position == 0) ++r.prompt_logprobs_received;  // a recomputed prompt repeats positions
      slot = lp;
    }
  }
  if (ch.done) return;  // ended by its stop string; the engine's last word is dropped
  GenerateEvent ev;
  ev.choice = c;
  ev.tokens = e.new_tokens;
  if (r.wants_prompt_logprobs && !ch.has_token && (!e.new_tokens.empty() || e.finished)) {
    ev.prompt_logprobs.reserve(static_cast<size_t>(r.prompt_logprobs_received));
    for (const PromptLogprob& lp : r.prompt_logprobs)
      if (lp.position > 0) ev.prompt_logprobs.push_back(lp);
  }
  std::string piece;
  if (!e.new_tokens.empty()) {
    const Clock::time_point now = Clock::now();
    {
      std::lock_guard<std::mutex> lk(stats_mu);
      stats.generation_tokens_total += e.new_tokens.size();
      if (!r.has_first_token) {  // the request's prompt is in: counted once, whatever its n
        stats.ttft.observe(seconds_between(r.submitted, now));
        stats.prompt_tokens_total += static_cast<uint64_t>(r.prompt_tokens);
      }
      if (ch.has_token) stats.itl.observe(seconds_between(ch.last_token, now));
    }
    if (!r.has_first_token) {
      r.has_first_token = true;
      r.first_token = now;
    }
    ch.has_token = true;
    ch.last_token = now;
  }
  // Token by token, as if each came in its own event (speculative decoding brings several):
  // a stop string ends the choice at the token that completes it, and the tokens after it
  // are not the choice's.
  // A choice the engine stopped on its EOS or a stop token id: that last token is not text
  // (a completed grammar also ends with kStop, on a token that may be text).
  size_t text_tokens = e.new_tokens.size();
  if (ch.detok && text_tokens > 0 && e.finished && e.reason == FinishReason::kStop && !r.stop_token_in_text &&
      is_stop_token(r.stop, e.new_tokens.back().token))
    --text_tokens;
  StopStringMatcher::Result m;
  const size_t pushes = std::max<size_t>(1, e.new_tokens.size());
  for (size_t i = 0; i < pushes; ++i) {
    if (i < e.new_tokens.size()) ++ch.completion_tokens;
    if (ch.detok && i < text_tokens) piece = ch.detok->push(e.new_tokens[i].token);
    if (e.finished && ch.detok && i + 1 == pushes) piece += ch.detok->finish();
    StopStringMatcher::Result part = ch.stop.push(piece, ch.completion_tokens >= r.min_tokens);
    piece.clear();
    m.text += part.text;
    if (part.stopped) {
      m.stopped = true;
      if (i + 1 < ev.tokens.size()) {
        std::lock_guard<std::mutex> lk(stats_mu);
        stats.generation_tokens_total -= ev.tokens.size() - (i + 1);  // counted above, not the choice's
        ev.tokens.resize(i + 1);
      }
      break;
    }
  }
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
    if (!e.embedding.empty()) {
      ev.embedding = e.embedding;
      std::lock_guard<std::mutex> lk(stats_mu);
      stats.prompt_tokens_total += static_cast<uint64_t>(r.prompt_tokens);
    }
    ev.unavailable = unavailable && e.reason == FinishReason::kError;
    finish(r, c, std::move(ev), e.reason, e.reason == FinishReason::kError ? e.error : "");
    return;
  }
  if (ev.text.empty() && ev.tokens.empty()) return;
  deliver(r.callback, ev, r.id);
}

void EngineService::Impl::publish_stats() {
  const SchedulerStats s = engine.scheduler().stats();
  // A request runs while one of its choices is in the batch; it waits otherwise (queued, or
  // every unfinished choice preempted).
  const int requests_running = s.num_running_requests;
  const int requests_live = static_cast<int>(live.size());
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
  stats.num_requests_running = requests_running;
  stats.num_requests_waiting = std::max(0, requests_live - requests_running);
  engine_requests_waiting = std::max(0, requests_live - requests_running);
  stats.kv_blocks_total = s.num_blocks;
  stats.kv_blocks_free = s.num_free_blocks;
  stats.prefix_cache_hit_tokens = s.prefix_hit_tokens;
  stats.prefix_cache_query_tokens = s.prefix_query_tokens;
  stats.preemptions = s.num_preemptions;
  stats.kv_window_released_blocks = s.window_releases;
  stats.prefill_capped_steps = s.prefill_capped_steps;
  stats.deferred_masks = s.deferred_masks;
  stats.running_lora = s.running_lora;
  stats.waiting_lora = s.waiting_lora;
  stats.prefill_token_cap = s.prefill_token_cap;
  stats.spec = s.spec;
}

void EngineService::Impl::expire_waiting_for_executor(Clock::time_point now) {
  std::vector<RequestId> expired;
  for (const auto& [id, r] : live) {
    if (now - std::max(r.submitted, *outage_since) >= options.executor_wait) expired.push_back(id);
  }
  if (expired.empty()) return;
  const std::string why =
      "the workers are unavailable: the worker group is incomplete (a rank was lost) and not whole again "
      "after " +
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(options.executor_wait).count()) +
      " s (server.worker_restart_wait_s); retry later";
  TESSERA_LOG_WARN("[coord] {} request(s) waited too long for the worker group: ending them", expired.size());
  for (RequestId id : expired) {
    engine.abort(id);  // out of the scheduler: no step will take it
    const int n = static_cast<int>(live.at(id).choices.size());
    for (int c = 0; c < n; ++c) {
      auto it = live.find(id);  // the last finish erases the request
      if (it == live.end()) break;
      if (it->second.choices[static_cast<size_t>(c)].done) continue;
      GenerateEvent ev;
      ev.unavailable = true;
      finish(it->second, c, std::move(ev), FinishReason::kError, why);
    }
  }
}

void EngineService::Impl::run() {
  bool idle_wait = false;
  bool holding = false;  // waiting for the executor to be ready again
  for (;;) {
    std::vector<Pending> new_submits;
    std::vector<RequestId> new_aborts;
    std::vector<LoraOp> new_lora_ops;
    bool drain = false;
    Clock::time_point drain_deadline;
    {
      std::unique_lock<std::mutex> lk(mu);
      auto ready = [&] {
        return !submits.empty() || !aborts.empty() || !lora_ops.empty() || draining || engine.has_work();
      };
      if (holding) {
        // Polls the executor (it says nothing when it becomes ready) while reacting at once
        // to submits, aborts and a drain.
        cv.wait_for(lk, std::chrono::milliseconds(10), [&] { return !submits.empty() || !aborts.empty() || draining; });
      } else if (idle_wait) {
        // The engine has work but could not schedule any (should not happen; guards a spin).
        cv.wait_for(lk, std::chrono::milliseconds(1), [&] { return !submits.empty() || !aborts.empty() || draining; });
      } else {
        cv.wait(lk, ready);
      }
      new_submits.swap(submits);
      new_aborts.swap(aborts);
      new_lora_ops.swap(lora_ops);
      drain = draining;
      drain_deadline = deadline;
    }
    for (Pending& p : new_submits) admit(std::move(p));
    for (RequestId id : new_aborts) abort_request(id);
    for (LoraOp& op : new_lora_ops) {
      if (op.load) {
        engine.add_lora_load(op.name, op.dir);
      } else {
        engine.add_lora_unload(op.name);
      }
      lora_waiting.push_back(std::move(op));
    }
    if (drain && Clock::now() >= drain_deadline) {
      std::vector<RequestId> rest;
      for (const auto& [id, r] : live) rest.push_back(id);
      for (RequestId id : rest) abort_request(id);
    }
    bool stepped = false;
    holding = false;
    if (engine.has_work() && options.executor_ready && !options.executor_ready()) {
      // A rank is lost: no step could run. Requests wait (up to executor_wait) for the group.
      const Clock::time_point now = Clock::now();
      if (!outage_since) {
        outage_since = now;
        TESSERA_LOG_WARN("[coord] the worker group is not whole: {} request(s) wait up to {} ms for it", live.size(),
                         options.executor_wait.count());
      }
      expire_waiting_for_executor(now);
      holding = engine.has_work();
    } else if (engine.has_work()) {
      if (outage_since) {
        TESSERA_LOG_INFO("[coord] the worker group is whole again: resuming {} request(s)", live.size());
        outage_since.reset();
      }
      const uint64_t before = engine.steps();
      const Clock::time_point step_start = Clock::now();
      std::vector<SequenceEvent> events = engine.step();
      stepped = engine.steps() != before;
      mark_scheduled(step_start);
      // A step refused or cut because a rank is gone (not a fault of the requests in it).
      const bool unavailable =
          engine.last_step_unavailable() && options.executor_ready && !options.executor_ready();
      for (const SequenceEvent& e : events) handle(e, unavailable);
      for (const Engine::LoraChangeDone& change : engine.take_lora_changes_done()) {
        for (auto it = lora_waiting.begin(); it != lora_waiting.end();) {
          if (it->name != change.name || it->load != change.load) {
            ++it;
            continue;
          }
          it->done(change.status);
          it = lora_waiting.erase(it);
        }
      }
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

bool EngineService::has_untaken_submissions() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return !impl_->submits.empty();
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

void EngineService::load_lora(const std::string& name, const std::string& dir, std::function<void(Status)> done) {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->lora_ops.push_back({true, name, dir, std::move(done)});
  }
  impl_->cv.notify_one();
}

void EngineService::unload_lora(const std::string& name, std::function<void(Status)> done) {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->lora_ops.push_back({false, name, "", std::move(done)});
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
  s.num_requests_waiting = impl_->engine_requests_waiting + queued;
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
