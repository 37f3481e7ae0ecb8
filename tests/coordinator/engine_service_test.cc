// EngineService: the thread-safe engine loop the API front ends use. A scripted executor
// makes outputs deterministic (each request's tokens are a function of its prompt's first
// token), so tests can check token counts, stop strings across token boundaries, aborts,
// draining and the one-final-event rule under many concurrent submitters. The last tests
// run the real kjv-llama model through the service and compare with the fixture goldens.
#include "coordinator/engine/engine_service.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "kernels/backend.h"
#include "tests/scripted_executor.h"
#include "tests/test_support.h"
#include "worker/executor.h"
#include "worker/transformer.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;

// The scripted model (tests/scripted_executor.h): tokens are pseudo-random ids of a 1024-id
// vocabulary (or the tokenizer's) by (sequence, index), so a preempted and recomputed sequence
// draws the same tokens, never EOS unless scripted; per-prompt scripts and failures key on
// the prompt's first token (so the tests turn prefix caching off: every sequence's first
// step shows its first token).
using testing::hashed_tokens;
using testing::ScriptedExecutor;
constexpr int32_t kScriptVocab = 1024;

// Everything one request's callback saw.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<GenerateEvent> events;
  int finished = 0;
  bool event_after_finish = false;

  GenerateCallback callback() {
    return [this](const GenerateEvent& e) {
      std::lock_guard<std::mutex> lk(mu);
      if (finished > 0) event_after_finish = true;
      events.push_back(e);
      if (e.finished) ++finished;
      cv.notify_all();
    };
  }
  bool wait(std::chrono::milliseconds timeout = 20s) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, timeout, [&] { return finished > 0; });
  }
  std::string text() {
    std::lock_guard<std::mutex> lk(mu);
    std::string s;
    for (const auto& e : events) s += e.text;
    return s;
  }
  std::vector<int32_t> tokens() {
    std::lock_guard<std::mutex> lk(mu);
    std::vector<int32_t> t;
    for (const auto& e : events)
      for (const auto& s : e.tokens) t.push_back(s.token);
    return t;
  }
  GenerateEvent last() {
    std::lock_guard<std::mutex> lk(mu);
    return events.empty() ? GenerateEvent{} : events.back();
  }
};

EngineServiceOptions small_options() {
  EngineServiceOptions o;
  o.scheduler.block_size = 4;
  o.scheduler.num_blocks = 256;
  o.scheduler.max_num_seqs = 16;
  o.scheduler.max_num_batched_tokens = 64;
  o.scheduler.max_model_len = 512;
  o.scheduler.prefix_caching = false;  // see ScriptedExecutor
  return o;
}

Request request(std::vector<int32_t> prompt, int max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  return r;
}

// Polls until the loop has published stats with every KV block free again.
bool wait_blocks_free(const EngineService& svc, std::chrono::milliseconds timeout = 5s) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    EngineServiceStats s = svc.stats();
    if (s.kv_blocks_free == s.kv_blocks_total && s.num_running == 0 && s.num_waiting == 0) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

std::unique_ptr<Tokenizer> load_kjv_tokenizer() {
  auto t = Tokenizer::load(testing::fixtures_dir() + "/kjv-llama");
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  return t.is_ok() ? std::move(t).value() : nullptr;
}

#define REQUIRE_KJV()                                                                         \
  TESSERA_REQUIRE_FIXTURES();                                                                 \
  auto tokenizer = load_kjv_tokenizer();                                                      \
  if (!tokenizer) GTEST_SKIP() << "SKIPPED: kjv-llama tokenizer not loadable from fixtures"

TEST(EngineServiceTest, ManyConcurrentSubmittersEachGetTheirTokensAndOneFinish) {
  ScriptedExecutor exec(hashed_tokens(kScriptVocab));
  exec.set_step_delay(50us);
  EngineServiceOptions o = small_options();
  o.scheduler.num_blocks = 48;  // tight enough that some sequences get preempted
  EngineService svc(o, exec, nullptr);
  svc.start();
  constexpr int kThreads = 8, kPerThread = 50;
  std::vector<std::unique_ptr<Collector>> collectors(kThreads * kPerThread);
  for (auto& c : collectors) c = std::make_unique<Collector>();
  std::vector<int> max_tokens(collectors.size());
  std::vector<std::thread> threads;
  std::atomic<int> submit_errors{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < kPerThread; ++i) {
        const int k = t * kPerThread + i;
        max_tokens[k] = 1 + static_cast<int>(rng() % 24);
        std::vector<int32_t> prompt(1 + rng() % 20);
        for (auto& p : prompt) p = 3 + static_cast<int32_t>(rng() % 1000);
        auto id = svc.submit(request(prompt, max_tokens[k]), collectors[k]->callback());
        if (!id.is_ok()) ++submit_errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(submit_errors.load(), 0);
  for (size_t k = 0; k < collectors.size(); ++k) {
    ASSERT_TRUE(collectors[k]->wait()) << "request " << k << " never finished";
    const GenerateEvent last = collectors[k]->last();
    EXPECT_EQ(last.finish_reason, FinishReason::kLength) << k;
    EXPECT_EQ(static_cast<int>(collectors[k]->tokens().size()), max_tokens[k]) << k;
    EXPECT_EQ(last.completion_tokens, max_tokens[k]) << k;
  }
  ASSERT_TRUE(wait_blocks_free(svc));
  svc.stop();
  uint64_t total_tokens = 0;
  for (size_t k = 0; k < collectors.size(); ++k) {
    EXPECT_EQ(collectors[k]->finished, 1) << k;
    EXPECT_FALSE(collectors[k]->event_after_finish) << k;
    total_tokens += max_tokens[k];
  }
  const EngineServiceStats s = svc.stats();
  EXPECT_EQ(s.requests_finished_length, collectors.size());
  EXPECT_EQ(s.generation_tokens_total, total_tokens);
  EXPECT_EQ(s.ttft.count(), collectors.size());
  EXPECT_EQ(s.e2e.count(), collectors.size());
  EXPECT_EQ(s.itl.count(), total_tokens - collectors.size());
  EXPECT_TRUE(s.draining);
  EXPECT_GT(s.preemptions, 0u) << "the pool was meant to force preemption";
  std::cout << "[ REPORT   ] " << exec.steps() << " steps, " << s.preemptions << " preemptions" << std::endl;
}

TEST(EngineServiceTest, AbortWhileQueuedAndWhileRunningFreesBlocks) {
  ScriptedExecutor exec(hashed_tokens(kScriptVocab));
  exec.set_step_delay(200us);
  EngineServiceOptions o = small_options();
  o.scheduler.max_num_seqs = 1;  // the second request must wait behind the first
  EngineService svc(o, exec, nullptr);
  svc.start();
  Collector running, queued, after;
  auto r1 = svc.submit(request({5, 6, 7, 8, 9}, 400), running.callback());
  auto r2 = svc.submit(request({10, 11}, 400), queued.callback());
  ASSERT_TRUE(r1.is_ok() && r2.is_ok());
  EXPECT_NE(r1.value(), r2.value());
  // Wait until the first one streams, then abort the queued one, then the running one.
  for (int i = 0; i < 5000 && running.tokens().size() < 3; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_GE(running.tokens().size(), 3u);
  EXPECT_GT(svc.stats().kv_blocks_total - svc.stats().kv_blocks_free, 0);
  svc.abort(r2.value());
  ASSERT_TRUE(queued.wait());
  EXPECT_EQ(queued.last().finish_reason, FinishReason::kAborted);
  EXPECT_TRUE(queued.tokens().empty());
  svc.abort(r1.value());
  ASSERT_TRUE(running.wait());
  EXPECT_EQ(running.last().finish_reason, FinishReason::kAborted);
  EXPECT_LT(running.tokens().size(), 400u);
  EXPECT_TRUE(wait_blocks_free(svc)) << "blocks not returned after abort";
  // Aborting again, or an unknown id, is harmless.
  svc.abort(r1.value());
  svc.abort(987654);
  auto r3 = svc.submit(request({12}, 3), after.callback());
  ASSERT_TRUE(r3.is_ok());
  ASSERT_TRUE(after.wait());
  EXPECT_EQ(after.last().finish_reason, FinishReason::kLength);
  svc.stop();
  EXPECT_EQ(running.finished, 1);
  EXPECT_EQ(queued.finished, 1);
  EXPECT_EQ(svc.stats().requests_aborted, 2u);
}

TEST(EngineServiceTest, AbortBeforeTheLoopStarts) {
  ScriptedExecutor exec(hashed_tokens(kScriptVocab));
  EngineService svc(small_options(), exec, nullptr);
  Collector a, b;
  auto ra = svc.submit(request({5}, 4), a.callback());
  auto rb = svc.submit(request({6}, 4), b.callback());
  ASSERT_TRUE(ra.is_ok() && rb.is_ok());
  svc.abort(ra.value());
  svc.start();
  ASSERT_TRUE(a.wait());
  ASSERT_TRUE(b.wait());
  EXPECT_EQ(a.last().finish_reason, FinishReason::kAborted);
  EXPECT_EQ(b.last().finish_reason, FinishReason::kLength);
  EXPECT_TRUE(wait_blocks_free(svc));
}

// A server warming up before start() stops once a request is submitted: it asks
// has_untaken_submissions, true from the first submit until the loop takes them.
TEST(EngineServiceTest, SubmissionsBeforeTheLoopStartsAreUntakenUntilItTakesThem) {
  ScriptedExecutor exec(hashed_tokens(kScriptVocab));
  EngineService svc(small_options(), exec, nullptr);
  EXPECT_FALSE(svc.has_untaken_submissions());
  Collector a;
  ASSERT_TRUE(svc.submit(request({5}, 4), a.callback()).is_ok());
  EXPECT_TRUE(svc.has_untaken_submissions());
  svc.start();
  ASSERT_TRUE(a.wait());
  EXPECT_EQ(a.last().finish_reason, FinishReason::kLength);
  EXPECT_FALSE(svc.has_untaken_submissions());
}

TEST(EngineServiceTest, InvalidRequestsAreNamedErrors) {
  ScriptedExecutor exec(hashed_tokens(kScriptVocab));
  EngineServiceOptions o = small_options();
  o.scheduler.max_model_len = 100;
  o.vocab_size = 1024;
  EngineService svc(o, exec, nullptr);
  EXPECT_EQ(svc.max_model_len(), 100);
  auto empty = svc.submit(request({}, 4), nullptr);
  ASSERT_FALSE(empty.is_ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("prompt"), std::string::npos) << empty.status().message();

  auto zero = svc.submit(request({5}, 0), nullptr);
  ASSERT_FALSE(zero.is_ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find("max_tokens"), std::string::npos) << zero.status().message();

  auto too_long = svc.submit(request(std::vector<int32_t>(60, 5), 41), nullptr);
  ASSERT_FALSE(too_long.is_ok());
  const std::string m = too_long.status().message();
  EXPECT_EQ(too_long.status().code(), StatusCode::kInvalidArgument);
  for (const char* part : {"60", "41", "100", "max_tokens", "max_model_len"})
    EXPECT_NE(m.find(part), std::string::npos) << "missing '" << part << "' in: " << m;
  EXPECT_TRUE(svc.submit(request(std::vector<int32_t>(60, 5), 40), nullptr).is_ok());

  auto bad_id = svc.submit(request({5, 1024}, 4), nullptr);
  ASSERT_FALSE(bad_id.is_ok());
  EXPECT_NE(bad_id.status().message().find("prompt[1]"), std::string::npos) << bad_id.status().message();

  Request bad_sampling = request({5}, 4);
  bad_sampling.sampling.top_p = 0.0f;
  auto bs = svc.submit(bad_sampling, nullptr);
  ASSERT_FALSE(bs.is_ok());
  EXPECT_NE(bs.status().message().find("top_p"), std::string::npos) << bs.status().message();
}

TEST(EngineServiceTest, QueueFullThenUnavailableWhenDraining) {
  ScriptedExecutor exec(hashed_tokens(kScriptVocab));
  EngineServiceOptions o = small_options();
  o.max_queued_requests = 2;
  EngineService svc(o, exec, nullptr);  // not started: submits stay queued
  Collector a, b, c;
  ASSERT_TRUE(svc.submit(request({5}, 4), a.callback()).is_ok());
  ASSERT_TRUE(svc.submit(request({6}, 4), b.callback()).is_ok());
  auto full = svc.submit(request({7}, 4), c.callback());
  ASSERT_FALSE(full.is_ok());
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted) << full.status().to_string();
  EXPECT_EQ(svc.stats().num_waiting, 2);
  svc.stop();
  // Queued requests of a service that never ran still end, once, with "abort".
  EXPECT_EQ(a.finished, 1);
  EXPECT_EQ(b.finished, 1);
  EXPECT_EQ(a.last().finish_reason, FinishReason::kAborted);
  EXPECT_EQ(c.finished, 0);
  auto late = svc.submit(request({8}, 4), c.callback());
  ASSERT_FALSE(late.is_ok());
  EXPECT_EQ(late.status().code(), StatusCode::kUnavailable);
}

TEST(EngineServiceTest, DrainLetsShortRequestsFinishAndAbortsTheRestAtTheDeadline) {
  ScriptedExecutor exec(hashed_tokens(kScriptVocab));
  exec.set_step_delay(2ms);
  EngineService svc(small_options(), exec, nullptr);
  svc.start();
  Collector short_req, long_req;
  ASSERT_TRUE(svc.submit(request({5, 6}, 5), short_req.callback()).is_ok());
  ASSERT_TRUE(svc.submit(request({7, 8}, 450), long_req.callback()).is_ok());
  const auto t0 = std::chrono::steady_clock::now();
  svc.drain_and_stop(150ms);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 2.0) << "drain overran its deadline";
  EXPECT_EQ(short_req.finished, 1);
  EXPECT_EQ(short_req.last().finish_reason, FinishReason::kLength);
  EXPECT_EQ(long_req.finished, 1);
  EXPECT_EQ(long_req.last().finish_reason, FinishReason::kAborted);
  EXPECT_GT(long_req.tokens().size(), 0u);
  const EngineServiceStats s = svc.stats();
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
  EXPECT_TRUE(s.draining);
}

TEST(EngineServiceTest, DestructorAbortsRunningRequestsAndNeverCallsBackAfterwards) {
  ScriptedExecutor exec(hashed_tokens(kScriptVocab));
  exec.set_step_delay(1ms);
  auto c = std::make_shared<Collector>();
  std::atomic<bool> destroyed{false};
  std::atomic<bool> late_call{false};
  {
    EngineService svc(small_options(), exec, nullptr);
    svc.start();
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(svc.submit(request({static_cast<int32_t>(5 + i)}, 500),
                             [c, &destroyed, &late_call](const GenerateEvent& e) {
                               if (destroyed) late_call = true;
                               c->callback()(e);
                             })
                      .is_ok());
    }
    std::this_thread::sleep_for(10ms);
  }
  destroyed = true;
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(late_call.load());
  EXPECT_EQ(c->finished, 4);
  for (const auto& e : c->events) {
    if (e.finished) {
      EXPECT_EQ(e.finish_reason, FinishReason::kAborted);
    }
  }
}

TEST(EngineServiceTest, ExecutorErrorFinishesWithError) {
  ScriptedExecutor exec(hashed_tokens(kScriptVocab));
  exec.fail_on(99);
  EngineService svc(small_options(), exec, nullptr);
  svc.start();
  Collector bad;
  ASSERT_TRUE(svc.submit(request({99, 5}, 4), bad.callback()).is_ok());
  ASSERT_TRUE(bad.wait());
  EXPECT_EQ(bad.last().finish_reason, FinishReason::kError);
  EXPECT_NE(bad.last().error.find("scripted failure"), std::string::npos) << bad.last().error;
  EXPECT_TRUE(wait_blocks_free(svc));
  Collector good;
  ASSERT_TRUE(svc.submit(request({5}, 3), good.callback()).is_ok());
  ASSERT_TRUE(good.wait());
  EXPECT_EQ(good.last().finish_reason, FinishReason::kLength);
  EXPECT_EQ(svc.stats().requests_failed, 1u);
}

// A lost worker rank (executor_ready false): no step is attempted, requests wait for the
// executor and then run as if nothing happened.
TEST(EngineServiceTest, WhileTheExecutorIsNotReadyRequestsWaitAndRunOnceItIs) {
  ScriptedExecutor exec(hashed_tokens(kScriptVocab));
  std::atomic<bool> ready{false};
  EngineServiceOptions o = small_options();
  o.executor_ready = [&ready] { return ready.load(); };
  o.executor_wait = std::chrono::hours(1);
  EngineService svc(o, exec, nullptr);
  svc.start();
  Collector c;
  ASSERT_TRUE(svc.submit(request({5, 6}, 4), c.callback()).is_ok());
  EXPECT_FALSE(c.wait(200ms)) << "a request ran while the executor was not ready";
  EXPECT_EQ(exec.steps(), 0);
  EXPECT_EQ(svc.stats().num_waiting, 1);
  ready = true;
  ASSERT_TRUE(c.wait());
  EXPECT_EQ(c.last().finish_reason, FinishReason::kLength);
  EXPECT_FALSE(c.last().unavailable);
  EXPECT_EQ(c.tokens().size(), 4u);
}

// Past executor_wait a waiting request ends with kError marked `unavailable` (HTTP 503 +
// Retry-After), naming the key that bounds the wait; an ordinary executor error is not.
TEST(EngineServiceTest, PastTheExecutorWaitRequestsEndUnavailableAndOtherErrorsDoNot) {
  ScriptedExecutor exec(hashed_tokens(kScriptVocab));
  exec.fail_on(99);
  std::atomic<bool> ready{false};
  EngineServiceOptions o = small_options();
  o.executor_ready = [&ready] { return ready.load(); };
  o.executor_wait = std::chrono::milliseconds(0);
  EngineService svc(o, exec, nullptr);
  svc.start();
  Collector waited;
  ASSERT_TRUE(svc.submit(request({5}, 3), waited.callback()).is_ok());
  ASSERT_TRUE(waited.wait());
  EXPECT_EQ(waited.last().finish_reason, FinishReason::kError);
  EXPECT_TRUE(waited.last().unavailable);
  EXPECT_NE(waited.last().error.find("server.worker_restart_wait_s"), std::string::npos) << waited.last().error;
  EXPECT_EQ(exec.steps(), 0);
  EXPECT_TRUE(wait_blocks_free(svc));

  ready = true;
  Collector bad, good;
  ASSERT_TRUE(svc.submit(request({99, 5}, 4), bad.callback()).is_ok());
  ASSERT_TRUE(bad.wait());
  EXPECT_EQ(bad.last().finish_reason, FinishReason::kError);
  EXPECT_FALSE(bad.last().unavailable) << "the executor was ready: a real failure, not a retryable one";
  ASSERT_TRUE(svc.submit(request({5}, 3), good.callback()).is_ok());
  ASSERT_TRUE(good.wait());
  EXPECT_EQ(good.last().finish_reason, FinishReason::kLength);
}

TEST(EngineServiceTest, EosFinishesWithStop) {
  ScriptedExecutor exec(hashed_tokens(kScriptVocab));
  exec.script(5, {40, 41, 2, 42});
  EngineService svc(small_options(), exec, nullptr);
  svc.start();
  Collector c;
  Request r = request({5}, 10);
  r.stop.ignore_eos = false;
  r.stop.eos_token_id = 2;
  ASSERT_TRUE(svc.submit(r, c.callback()).is_ok());
  ASSERT_TRUE(c.wait());
  EXPECT_EQ(c.last().finish_reason, FinishReason::kStop);
  EXPECT_EQ(c.tokens(), (std::vector<int32_t>{40, 41, 2}));
  EXPECT_TRUE(c.text().empty());  // no tokenizer: tokens only
}

// --- with the real kjv-llama tokenizer ---

TEST(EngineServiceTest, StreamedTextEqualsDecodeWithoutStopStrings) {
  REQUIRE_KJV();
  ScriptedExecutor exec(hashed_tokens(static_cast<int32_t>(tokenizer->vocab_size())));
  EngineService svc(small_options(), exec, tokenizer.get());
  svc.start();
  // Unscripted outputs are pseudo-random ids, byte-fallback pieces included, so text is
  // held back across incomplete UTF-8 and must still add up to the full decode.
  std::vector<std::unique_ptr<Collector>> cs;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 20; ++i) {
    // Half BOS-only prompts (text == decode(output)), half real text prompts.
    std::vector<int32_t> p = {1};
    if (i % 2) p = tokenizer->encode("And God said, Let there be light" + std::string(i, '!'), true);
    p.push_back(300 + i);  // distinct scripts per request
    prompts.push_back(p);
    cs.push_back(std::make_unique<Collector>());
    Request r = request(p, 40);
    r.skip_special_tokens = i % 4 != 3;
    ASSERT_TRUE(svc.submit(r, cs.back()->callback()).is_ok());
  }
  for (size_t i = 0; i < cs.size(); ++i) {
    ASSERT_TRUE(cs[i]->wait());
    const bool skip = i % 4 != 3;
    const std::vector<int32_t> out = cs[i]->tokens();
    ASSERT_EQ(out.size(), 40u);
    std::vector<int32_t> all = prompts[i];
    all.insert(all.end(), out.begin(), out.end());
    const std::string prompt_text = tokenizer->decode(prompts[i], skip);
    const std::string full = tokenizer->decode(all, skip);
    ASSERT_EQ(full.compare(0, prompt_text.size(), prompt_text), 0);
    EXPECT_EQ(cs[i]->text(), full.substr(prompt_text.size())) << "request " << i;
  }
  // With a BOS-only prompt the stream is exactly decode(output), as tessera-generate prints it.
  ScriptedExecutor exec2(hashed_tokens(static_cast<int32_t>(tokenizer->vocab_size())));
  const std::vector<int32_t> words = tokenizer->encode("In the beginning God created the heaven and the earth.", false);
  exec2.script(1, words);
  EngineService svc2(small_options(), exec2, tokenizer.get());
  svc2.start();
  Collector c;
  ASSERT_TRUE(svc2.submit(request({1}, static_cast<int>(words.size())), c.callback()).is_ok());
  ASSERT_TRUE(c.wait());
  EXPECT_EQ(c.text(), tokenizer->decode(words, true));
  EXPECT_EQ(c.text(), "In the beginning God created the heaven and the earth.");
}

// Runs `text`'s tokens through the service with `stops`; returns the collector.
std::unique_ptr<Collector> run_stop(const Tokenizer& tok, const std::string& text, std::vector<std::string> stops,
                                    EngineServiceStats* stats = nullptr) {
  ScriptedExecutor exec(hashed_tokens(static_cast<int32_t>(tok.vocab_size())));
  const std::vector<int32_t> words = tok.encode(text, false);
  exec.script(1, words);
  EngineService svc(small_options(), exec, &tok);
  svc.start();
  auto c = std::make_unique<Collector>();
  Request r = request({1}, static_cast<int>(words.size()) + 20);  // more than the script
  r.stop_strings = std::move(stops);
  EXPECT_TRUE(svc.submit(r, c->callback()).is_ok());
  EXPECT_TRUE(c->wait());
  EXPECT_TRUE(wait_blocks_free(svc)) << "a stop string must free the sequence's blocks";
  if (stats) *stats = svc.stats();
  return c;
}

TEST(EngineServiceTest, StopStringsAcrossTokenBoundariesAreNotEmitted) {
  REQUIRE_KJV();
  const std::string text = "In the beginning God created the heaven and the earth.";
  // Show the stop strings really span tokens.
  const auto words = tokenizer->encode(text, false);
  ASSERT_GT(words.size(), 8u);

  {  // a stop string made of whole words spanning several tokens
    EngineServiceStats s;
    auto c = run_stop(*tokenizer, text, {"heaven and"}, &s);
    EXPECT_EQ(c->text(), "In the beginning God created the ");
    EXPECT_EQ(c->last().finish_reason, FinishReason::kStop);
    EXPECT_LT(c->tokens().size(), words.size());
    EXPECT_EQ(c->finished, 1);
    EXPECT_EQ(s.requests_finished_stop, 1u);
  }
  {  // starts and ends inside tokens
    auto c = run_stop(*tokenizer, text, {"ginning God cr"});
    EXPECT_EQ(c->text(), "In the be");
    EXPECT_EQ(c->last().finish_reason, FinishReason::kStop);
  }
  {  // partial matches ("the " twice) are held back and then released
    auto c = run_stop(*tokenizer, text, {"the earth"});
    EXPECT_EQ(c->text(), "In the beginning God created the heaven and ");
    EXPECT_EQ(c->last().finish_reason, FinishReason::kStop);
  }
  {  // the earliest of several stop strings wins
    auto c = run_stop(*tokenizer, text, {"earth", "God"});
    EXPECT_EQ(c->text(), "In the beginning ");
  }
  {  // a stop string that never completes: everything comes out, finish by length
    auto c = run_stop(*tokenizer, text, {"earth!"});
    EXPECT_EQ(c->text().substr(0, text.size()), text);
    EXPECT_EQ(c->last().finish_reason, FinishReason::kLength);
  }
  {  // no partial stop string is ever emitted early: every prefix of the stream is safe
    auto c = run_stop(*tokenizer, text, {"created the heaven"});
    std::string so_far;
    for (const auto& e : c->events) {
      so_far += e.text;
      EXPECT_EQ(so_far.find("created the heaven"), std::string::npos);
    }
    EXPECT_EQ(so_far, "In the beginning God ");
  }
}

TEST(EngineServiceTest, LengthFinishWithTokenizer) {
  REQUIRE_KJV();
  ScriptedExecutor exec(hashed_tokens(static_cast<int32_t>(tokenizer->vocab_size())));
  const std::vector<int32_t> words = tokenizer->encode("In the beginning God created the heaven", false);
  exec.script(1, words);
  EngineService svc(small_options(), exec, tokenizer.get());
  svc.start();
  Collector c;
  Request r = request({1}, 3);
  r.stop_strings = {"heaven"};
  ASSERT_TRUE(svc.submit(r, c.callback()).is_ok());
  ASSERT_TRUE(c.wait());
  EXPECT_EQ(c.last().finish_reason, FinishReason::kLength);
  EXPECT_EQ(c.tokens(), std::vector<int32_t>(words.begin(), words.begin() + 3));
  EXPECT_EQ(c.text(), tokenizer->decode(c.tokens(), true));
  EXPECT_EQ(c.last().completion_tokens, 3);
  EXPECT_EQ(c.last().prompt_tokens, 1);
}

// --- the real model through the service equals the reference (and tessera-generate) ---

TEST(EngineServiceTest, RealModelGreedyMatchesGoldens) {
  REQUIRE_KJV();
  const std::string dir = testing::fixtures_dir() + "/kjv-llama";
  auto index = nlohmann::json::parse(testing::read_file(dir + "/goldens/index.json"));
  auto b = make_backend("cpu");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  auto backend = std::move(b).value();
  auto m = Transformer::load(dir, ModelLoadOptions{}, *backend);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  auto model = std::move(m).value();
  EngineServiceOptions o;
  o.scheduler.block_size = 16;
  o.scheduler.num_blocks = 64;
  o.scheduler.max_model_len = 512;
  Executor executor(*model, *backend, o.scheduler.block_size, o.scheduler.num_blocks, model->dtype());
  EngineService svc(o, executor, tokenizer.get());
  svc.start();

  struct Case {
    std::string label, prompt_text, full_text;
    std::vector<int32_t> prompt, greedy;
    std::unique_ptr<Collector> out = std::make_unique<Collector>();
  };
  std::vector<Case> cases;
  for (const auto& c : index["cases"]) {
    Case k;
    k.label = c["label"].get<std::string>();
    k.prompt_text = c["prompt_text"].get<std::string>();
    k.full_text = c["full_text"].get<std::string>();
    k.prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    k.greedy = c["greedy_ids"].get<std::vector<int32_t>>();
    cases.push_back(std::move(k));
  }
  // The named case goes through the tokenizer, as the HTTP layer does.
  bool found = false;
  for (Case& k : cases) {
    if (k.label != "in_the_beginning") continue;
    found = true;
    const std::vector<int32_t> ids = tokenizer->encode("In the beginning", true);
    EXPECT_EQ(ids, k.prompt);
    k.prompt = ids;
  }
  ASSERT_TRUE(found) << "goldens/index.json has no in_the_beginning case";
  // All cases at once: the service batches them; each must still match its golden.
  for (Case& k : cases) {
    Request r = request(k.prompt, static_cast<int>(k.greedy.size()));
    ASSERT_TRUE(svc.submit(r, k.out->callback()).is_ok());
  }
  for (Case& k : cases) {
    ASSERT_TRUE(k.out->wait(120s)) << k.label;
    EXPECT_EQ(k.out->last().finish_reason, FinishReason::kLength) << k.label;
    EXPECT_EQ(k.out->tokens(), k.greedy) << k.label;
    if (k.label == "in_the_beginning") {
      // The stream is the continuation of the prompt's text.
      EXPECT_EQ(k.prompt_text + k.out->text(), k.full_text);
    }
  }
  EXPECT_TRUE(wait_blocks_free(svc));
}

}  // namespace
}  // namespace tessera
