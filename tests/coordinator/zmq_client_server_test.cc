// ZmqClientServer end to end: the real EngineService with the scripted executor
// (tests/scripted_executor.h) for deterministic tokens, real ZeroMQ (ipc in a temp dir or tcp
// loopback), and ZmqClient (tools/client) as the client — plus a raw DEALER for frames
// ZmqClient never sends (duplicate ids, garbage).
#include "coordinator/server/zmq_client_server.h"

#include <gtest/gtest.h>
#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "common/wire/client_messages.h"
#include "coordinator/server/metrics.h"
#include "tests/scripted_executor.h"
#include "tests/test_support.h"
#include "tools/client/zmq_client.h"

namespace tessera {
namespace {

namespace wc = wire::client;
using namespace std::chrono_literals;

// The model (tests/scripted_executor.h): token i of every sequence is ordinary_token(i), its
// logprob fake_logprob(i).
using testing::ordinary_token;
float fake_logprob(int index) { return -0.5f - 0.25f * static_cast<float>(index % 4); }

// Everything one request produced, gathered from its events.
struct Outcome {
  std::map<int, std::string> text;              // by choice
  std::map<int, std::string> reasoning;         // by choice (Delta.reasoning joined)
  std::map<int, std::vector<int32_t>> tokens;   // by choice
  std::map<int, std::vector<float>> logprobs;   // by choice
  bool final_seen = false, error_seen = false;
  ZmqClientEvent last;  // the Final or Error
  int deltas = 0;
};

// Reads events until request `id` ends (Final or Error) or `timeout` passes; events of other
// requests go to `others` when given (else they fail the test).
Outcome collect(ZmqClient& client, uint64_t id, std::chrono::milliseconds timeout = 10s,
                std::map<uint64_t, Outcome>* others = nullptr) {
  Outcome out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    StatusOr<ZmqClientEvent> ev = client.next_event(50ms);
    if (!ev.is_ok()) {
      EXPECT_EQ(ev.status().code(), StatusCode::kUnavailable) << ev.status().to_string();
      continue;
    }
    Outcome* o = &out;
    if (ev->request_id != id) {
      if (others == nullptr) {
        ADD_FAILURE() << "event of unexpected request " << ev->request_id;
        continue;
      }
      o = &(*others)[ev->request_id];
    }
    if (ev->kind == ZmqClientEvent::Kind::kDelta) {
      ++o->deltas;
      o->text[ev->index] += ev->text;
      if (!ev->reasoning.empty()) o->reasoning[ev->index] += ev->reasoning;
      o->tokens[ev->index].insert(o->tokens[ev->index].end(), ev->token_ids.begin(), ev->token_ids.end());
      o->logprobs[ev->index].insert(o->logprobs[ev->index].end(), ev->logprobs.begin(), ev->logprobs.end());
    } else {
      (ev->kind == ZmqClientEvent::Kind::kFinal ? o->final_seen : o->error_seen) = true;
      o->last = ev.value();
      if (o == &out) return out;
    }
  }
  ADD_FAILURE() << "request " << id << " did not end within " << timeout.count() << " ms";
  return out;
}

// A raw DEALER, for frames ZmqClient would never send.
class RawDealer {
 public:
  explicit RawDealer(const std::string& endpoint) : socket_(ctx_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(endpoint);
  }
  void send(const std::string& frame) { socket_.send(zmq::buffer(frame), zmq::send_flags::none); }
  void send_multipart(const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i)
      socket_.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  // The next frame, or "" after 5 s.
  std::string recv() {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, 5000ms);
    zmq::message_t m;
    if (!(item.revents & ZMQ_POLLIN) || !socket_.recv(m, zmq::recv_flags::dontwait)) return "";
    return m.to_string();
  }
  wc::Error recv_error() {
    const std::string f = recv();
    wc::Error e;
    Status st = wc::decode(f, &e);
    EXPECT_TRUE(st.is_ok()) << st.to_string() << " (frame of " << f.size() << " bytes)";
    return e;
  }

 private:
  zmq::context_t ctx_{1};
  zmq::socket_t socket_;
};

class ZmqClientServerTest : public ::testing::Test {
 protected:
  ZmqClientServerTest() {
    executor_.set_logprob([](const testing::SampleRow& r) { return fake_logprob(r.index); });
  }
  void SetUp() override {
    TESSERA_REQUIRE_FIXTURES();
    auto t = Tokenizer::load(::tessera::testing::fixtures_dir() + "/kjv-llama");
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    tokenizer_ = std::move(t).value();
    dir_ = ::tessera::testing::make_temp_dir("tessera-zmq-client");
  }
  void TearDown() override {
    executor_.resume_steps();
    if (server_) server_->stop();
    server_.reset();
    if (service_) service_->stop();
    service_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // `endpoint` empty: ipc in the test's temp dir.
  void start(ZmqClientServerOptions options = {}, int max_queued_requests = 1024, std::string endpoint = "") {
    EngineServiceOptions eo;
    eo.scheduler.block_size = 16;
    eo.scheduler.num_blocks = 256;
    eo.scheduler.max_model_len = 512;
    eo.max_queued_requests = max_queued_requests;
    service_ = std::make_unique<EngineService>(eo, executor_, tokenizer_.get());
    service_->start();
    options.endpoint = endpoint.empty() ? "ipc://" + dir_ + "/client.ipc" : endpoint;
    options.model_name = "kjv";
    options.heartbeat_interval = 200ms;
    server_ = std::make_unique<ZmqClientServer>(options, *service_, tokenizer_.get());
    Status st = server_->start();
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }

  std::unique_ptr<ZmqClient> client(ZmqClientOptions options = {}) {
    auto c = ZmqClient::connect(server_->endpoint(), options);
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    return c.is_ok() ? std::move(c).value() : nullptr;
  }

  std::string expected_text(int n) const {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(ordinary_token(i));
    return tokenizer_->decode(ids, true);
  }
  static std::vector<int32_t> expected_tokens(int n) {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(ordinary_token(i));
    return ids;
  }

  // Polls (bounded) until every KV block is free and nothing runs.
  EngineServiceStats wait_until_idle(std::chrono::milliseconds limit) {
    const auto t0 = std::chrono::steady_clock::now();
    EngineServiceStats s;
    do {
      std::this_thread::sleep_for(5ms);
      s = service_->stats();
    } while ((s.kv_blocks_free != s.kv_blocks_total || s.num_running != 0 || s.num_waiting != 0) &&
             std::chrono::steady_clock::now() - t0 < limit);
    return s;
  }

  // Submits and waits for the single error a request gets.
  ZmqClientEvent expect_error(ZmqClient& c, ZmqRequestKind kind, const std::string& body) {
    auto id = c.submit(kind, body);
    EXPECT_TRUE(id.is_ok());
    Outcome o = collect(c, id.value());
    EXPECT_TRUE(o.error_seen) << body;
    EXPECT_EQ(o.deltas, 0);
    return o.last;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::string dir_;
  testing::ScriptedExecutor executor_;
  std::unique_ptr<EngineService> service_;
  std::unique_ptr<ZmqClientServer> server_;
};

TEST_F(ZmqClientServerTest, CompletionStreamsDeltasThenFinalOverTcp) {
  start({}, 1024, "tcp://127.0.0.1:*");
  EXPECT_EQ(server_->endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << server_->endpoint();
  EXPECT_EQ(server_->endpoint().find('*'), std::string::npos) << server_->endpoint();
  auto c = client();
  ASSERT_TRUE(c);
  auto id = c->submit(ZmqRequestKind::kCompletion, R"({"model": "kjv", "prompt": "In the beginning", "max_tokens": 5})");
  ASSERT_TRUE(id.is_ok());
  EXPECT_EQ(id.value(), 1u);
  Outcome o = collect(*c, id.value());
  ASSERT_TRUE(o.final_seen) << o.last.error_message;
  EXPECT_EQ(o.text[0], expected_text(5));
  EXPECT_EQ(o.tokens[0], expected_tokens(5));
  ASSERT_EQ(o.logprobs[0].size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(o.logprobs[0][i], fake_logprob(i));
  EXPECT_GE(o.deltas, 1);
  EXPECT_EQ(o.last.prompt_tokens, static_cast<int>(tokenizer_->encode("In the beginning", true).size()));
  ASSERT_EQ(o.last.finish_reasons.size(), 1u);
  EXPECT_EQ(o.last.finish_reasons[0], "length");
  EXPECT_EQ(o.last.completion_tokens, std::vector<int>{5});
  EXPECT_EQ(server_->live_requests(), 0u);

  // A second request on the same connection gets the next id.
  auto id2 = c->submit(ZmqRequestKind::kCompletion, R"({"prompt": [1, 5, 6], "max_tokens": 3})");
  ASSERT_TRUE(id2.is_ok());
  EXPECT_EQ(id2.value(), 2u);
  Outcome o2 = collect(*c, id2.value());
  ASSERT_TRUE(o2.final_seen);
  EXPECT_EQ(o2.tokens[0], expected_tokens(3));
  EXPECT_EQ(o2.last.prompt_tokens, 3);
}

TEST_F(ZmqClientServerTest, TwoChoicesEchoAndChat) {
  start();
  auto c = client();
  ASSERT_TRUE(c);
  auto id = c->submit(ZmqRequestKind::kCompletion, R"({"prompt": "And God said", "max_tokens": 4, "n": 2})");
  ASSERT_TRUE(id.is_ok());
  Outcome o = collect(*c, id.value());
  ASSERT_TRUE(o.final_seen) << o.last.error_message;
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(o.text[i], expected_text(4)) << "choice " << i;
    EXPECT_EQ(o.tokens[i], expected_tokens(4)) << "choice " << i;
  }
  EXPECT_EQ(o.last.finish_reasons, (std::vector<std::string>{"length", "length"}));
  EXPECT_EQ(o.last.completion_tokens, (std::vector<int>{4, 4}));
  EXPECT_EQ(o.last.prompt_tokens, static_cast<int>(tokenizer_->encode("And God said", true).size()));

  // Batch of prompts with echo: the prompt text comes first, without tokens; prompt tokens
  // count each prompt once.
  id = c->submit(ZmqRequestKind::kCompletion, R"({"prompt": ["In", "And"], "max_tokens": 2, "echo": true})");
  ASSERT_TRUE(id.is_ok());
  o = collect(*c, id.value());
  ASSERT_TRUE(o.final_seen) << o.last.error_message;
  EXPECT_EQ(o.text[0], "In" + expected_text(2));
  EXPECT_EQ(o.text[1], "And" + expected_text(2));
  EXPECT_EQ(o.tokens[1], expected_tokens(2));
  EXPECT_EQ(o.last.prompt_tokens, static_cast<int>(tokenizer_->encode("In", true).size() +
                                                   tokenizer_->encode("And", true).size()));

  id = c->submit(ZmqRequestKind::kChat,
                 R"({"messages": [{"role": "user", "content": "Who made the heaven?"}], "max_tokens": 6})");
  ASSERT_TRUE(id.is_ok());
  o = collect(*c, id.value());
  ASSERT_TRUE(o.final_seen) << o.last.error_message;
  EXPECT_EQ(o.text[0], expected_text(6));
  EXPECT_EQ(o.last.finish_reasons, std::vector<std::string>{"length"});
  EXPECT_GT(o.last.prompt_tokens, 5);

  // A chat body sent as a completion is a REST-identical 400.
  ZmqClientEvent e = expect_error(*c, ZmqRequestKind::kCompletion, R"({"messages": [{"role": "user", "content": "x"}]})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.error_param, "prompt");
}

// A chat on a reasoning model (a template that leaves <think> open, think tags read): its
// Deltas carry the thoughts in `reasoning` and only the answer in `text`, as REST splits them;
// include_reasoning false leaves `reasoning` empty; a completion is never split.
TEST_F(ZmqClientServerTest, ReasoningModelsThoughtsComeApartFromTheAnswer) {
  ZmqClientServerOptions o;
  o.chat_renderer = [](const nlohmann::ordered_json& c) -> StatusOr<std::string> {
    return "<s>" + c["messages"].back()["content"].get<std::string>() + "\n<think>\n";
  };
  o.reasoning_format = ReasoningFormat::kThinkTags;
  start(o);
  const std::vector<int32_t> written = tokenizer_->encode("Who asks?</think>\n\nIn the beginning", false);
  executor_.set_tokens(testing::script_then(written, 2));
  auto c = client();
  ASSERT_TRUE(c);
  // A completion is never split: its text is what the model wrote.
  auto id = c->submit(ZmqRequestKind::kCompletion, R"({"prompt": "x", "max_tokens": 40})");
  ASSERT_TRUE(id.is_ok());
  Outcome out = collect(*c, id.value());
  ASSERT_TRUE(out.final_seen) << out.last.error_message;
  EXPECT_EQ(out.reasoning.count(0), 0u);
  const std::string full = out.text[0];
  const size_t close = full.find("</think>");
  ASSERT_NE(close, std::string::npos) << full;

  const std::string chat = R"({"messages": [{"role": "user", "content": "Who made the heaven?"}], "max_tokens": 40)";
  id = c->submit(ZmqRequestKind::kChat, chat + "}");
  ASSERT_TRUE(id.is_ok());
  out = collect(*c, id.value());
  ASSERT_TRUE(out.final_seen) << out.last.error_message;
  EXPECT_EQ(out.reasoning[0], full.substr(0, close));
  EXPECT_EQ(out.text[0], "In the beginning");
  EXPECT_EQ(out.tokens[0].size(), written.size() + 1);  // every token once, EOS too

  id = c->submit(ZmqRequestKind::kChat, chat + R"(, "include_reasoning": false})");
  ASSERT_TRUE(id.is_ok());
  out = collect(*c, id.value());
  ASSERT_TRUE(out.final_seen) << out.last.error_message;
  EXPECT_EQ(out.reasoning.count(0), 0u);
  EXPECT_EQ(out.text[0], "In the beginning");
}

// Deltas stream each choice as it comes: best_of > n (ranked at the end) and echo + logprobs
// (prompt logprobs) are 400s naming the field here, not silently dropped.
TEST_F(ZmqClientServerTest, BestOfAndPromptLogprobsAreRefusedByName) {
  start();
  auto c = client();
  ASSERT_TRUE(c);
  ZmqClientEvent e = expect_error(*c, ZmqRequestKind::kCompletion, R"({"prompt": "In", "n": 1, "best_of": 2})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.error_param, "best_of");
  e = expect_error(*c, ZmqRequestKind::kCompletion, R"({"prompt": "In", "echo": true, "logprobs": 1})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.error_param, "echo");
  e = expect_error(*c, ZmqRequestKind::kCompletion, R"({"prompt": "In", "response_format": {"type": "bogus"}})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.error_param, "response_format");
}

TEST_F(ZmqClientServerTest, ErrorsMatchRest) {
  ZmqClientServerOptions o;
  o.max_body_bytes = 4096;
  start(o);
  auto c = client();
  ASSERT_TRUE(c);
  ZmqClientEvent e = expect_error(*c, ZmqRequestKind::kCompletion, R"({"prompt": "x", "temperature": "hot"})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.error_type, "invalid_request_error");
  EXPECT_EQ(e.error_param, "temperature");

  e = expect_error(*c, ZmqRequestKind::kChat, R"({"messages": [{"role": "user", "content": 5}]})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.error_param, "messages[0].content");

  e = expect_error(*c, ZmqRequestKind::kCompletion, "{oops");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.error_type, "invalid_request_error");

  e = expect_error(*c, ZmqRequestKind::kCompletion, R"({"prompt": "x", "max_tokens": 1000})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.error_code, "context_length_exceeded");
  EXPECT_NE(e.error_message.find("512"), std::string::npos) << e.error_message;
  EXPECT_NE(e.error_message.find("1000"), std::string::npos) << e.error_message;

  e = expect_error(*c, ZmqRequestKind::kCompletion, R"({"model": "gpt-9", "prompt": "x"})");
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.error_code, "model_not_found");

  e = expect_error(*c, ZmqRequestKind::kCompletion, R"({"prompt": ")" + std::string(10000, 'a') + R"("})");
  EXPECT_EQ(e.status, 413);
  EXPECT_EQ(e.error_code, "request_too_large");

  // After all that the server still serves.
  auto id = c->submit(ZmqRequestKind::kCompletion, R"({"prompt": [1, 2], "max_tokens": 2})");
  ASSERT_TRUE(id.is_ok());
  EXPECT_TRUE(collect(*c, id.value()).final_seen);
  EXPECT_EQ(service_->stats().requests_finished_length, 1u);

  // Every reply is counted for /metrics by its status: 4 × 400, 404, 413, one Final (200).
  const std::map<int, uint64_t> want{{200, 1}, {400, 4}, {404, 1}, {413, 1}};
  EXPECT_EQ(server_->reply_counts(), want);
  const std::string page = render_metrics(service_->stats(), "kjv", {}, server_->reply_counts());
  EXPECT_NE(page.find("tessera:zmq_replies_total{model_name=\"kjv\",code=\"400\"} 4"), std::string::npos) << page;
}

// This API returns text only: a request whose tool calls would be read is refused by name;
// with tool_choice "none" the tools are only rendered, and it is served.
TEST_F(ZmqClientServerTest, ToolCallsAreRefusedUnlessToolChoiceIsNone) {
  start();
  auto c = client();
  ASSERT_TRUE(c);
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f"}}])";
  ZmqClientEvent e = expect_error(*c, ZmqRequestKind::kChat,
                                  R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, )" + tools + "}");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.error_param, "tools");
  auto id = c->submit(ZmqRequestKind::kChat, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, )" +
                                                 tools + R"(, "tool_choice": "none"})");
  ASSERT_TRUE(id.is_ok());
  EXPECT_TRUE(collect(*c, id.value()).final_seen);
}

TEST_F(ZmqClientServerTest, ApiKeys) {
  ZmqClientServerOptions o;
  o.api_keys = {"secret", "other"};
  start(o);
  const std::string body = R"({"prompt": [1, 2], "max_tokens": 2})";
  auto none = client();
  ASSERT_TRUE(none);
  ZmqClientEvent e = expect_error(*none, ZmqRequestKind::kCompletion, body);
  EXPECT_EQ(e.status, 401);
  EXPECT_EQ(e.error_code, "invalid_api_key");
  EXPECT_EQ(e.error_type, "invalid_request_error");
  ZmqClientOptions wrong;
  wrong.api_key = "wrong";
  auto w = client(wrong);
  ASSERT_TRUE(w);
  EXPECT_EQ(expect_error(*w, ZmqRequestKind::kCompletion, body).status, 401);
  ZmqClientOptions right;
  right.api_key = "other";
  auto r = client(right);
  ASSERT_TRUE(r);
  auto id = r->submit(ZmqRequestKind::kCompletion, body);
  ASSERT_TRUE(id.is_ok());
  EXPECT_TRUE(collect(*r, id.value()).final_seen);
}

TEST_F(ZmqClientServerTest, DrainingAnswers503) {
  start();
  auto c = client();
  ASSERT_TRUE(c);
  server_->set_draining(true);
  EXPECT_TRUE(server_->draining());
  ZmqClientEvent e = expect_error(*c, ZmqRequestKind::kCompletion, R"({"prompt": [1], "max_tokens": 1})");
  EXPECT_EQ(e.status, 503);
  EXPECT_EQ(e.error_type, "service_unavailable");
  EXPECT_EQ(e.error_code, "draining");
  server_->set_draining(false);
  auto id = c->submit(ZmqRequestKind::kCompletion, R"({"prompt": [1], "max_tokens": 1})");
  ASSERT_TRUE(id.is_ok());
  EXPECT_TRUE(collect(*c, id.value()).final_seen);
}

TEST_F(ZmqClientServerTest, FullQueueAnswers429) {
  start({}, /*max_queued_requests=*/1);
  auto c = client();
  ASSERT_TRUE(c);
  executor_.pause_steps();  // the engine thread blocks inside its first step
  auto a = c->submit(ZmqRequestKind::kCompletion, R"({"prompt": [1, 7], "max_tokens": 2})");
  ASSERT_TRUE(a.is_ok());
  for (int i = 0; i < 400 && executor_.steps_entered() == 0; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_GT(executor_.steps_entered(), 0);
  auto b = c->submit(ZmqRequestKind::kCompletion, R"({"prompt": [1, 8], "max_tokens": 2})");  // queued
  auto full = c->submit(ZmqRequestKind::kCompletion, R"({"prompt": [1, 9], "max_tokens": 2})");
  ASSERT_TRUE(b.is_ok() && full.is_ok());
  std::map<uint64_t, Outcome> others;
  Outcome o = collect(*c, full.value(), 10s, &others);
  ASSERT_TRUE(o.error_seen);
  EXPECT_EQ(o.last.status, 429);
  EXPECT_EQ(o.last.error_type, "rate_limit_error");
  EXPECT_EQ(o.last.error_code, "queue_full");
  executor_.resume_steps();
  for (uint64_t id : {a.value(), b.value()}) {
    if (others[id].final_seen) continue;
    Outcome r = collect(*c, id, 10s, &others);
    EXPECT_TRUE(r.final_seen) << "request " << id;
  }
}

TEST_F(ZmqClientServerTest, EngineFailureIsError500) {
  start();
  auto c = client();
  ASSERT_TRUE(c);
  executor_.fail_every_step("injected executor failure");
  ZmqClientEvent e = expect_error(*c, ZmqRequestKind::kCompletion, R"({"prompt": [1, 2], "max_tokens": 3, "n": 2})");
  EXPECT_EQ(e.status, 500);
  EXPECT_EQ(e.error_type, "server_error");
  EXPECT_EQ(e.error_code, "internal_error");
  EXPECT_NE(e.error_message.find("injected executor failure"), std::string::npos) << e.error_message;
  executor_.stop_failing();
  EXPECT_EQ(wait_until_idle(1s).kv_blocks_free, service_->stats().kv_blocks_total);
  EXPECT_EQ(server_->live_requests(), 0u);
}

TEST_F(ZmqClientServerTest, RawFramesDuplicateIdsAndGarbage) {
  start();
  RawDealer raw(server_->endpoint());
  executor_.set_step_delay(2ms);
  wc::Submit s;
  s.id = 7;
  s.request_json = R"({"prompt": [1, 2, 3], "max_tokens": 50})";
  raw.send(wc::encode(s));
  raw.send(wc::encode(s));  // the same id while the first is live
  // Deltas of request 7 may come before the duplicate's error; find the error.
  wc::Error dup;
  bool got_dup = false;
  for (int i = 0; i < 200 && !got_dup; ++i) {
    const std::string f = raw.recv();
    ASSERT_FALSE(f.empty());
    got_dup = wc::decode(f, &dup).is_ok();
  }
  ASSERT_TRUE(got_dup);
  EXPECT_EQ(dup.id, 7u);
  EXPECT_EQ(dup.status, 400);
  EXPECT_EQ(dup.code, "duplicate_request_id");
  EXPECT_EQ(dup.param, "id");
  // Drain request 7 to its Final.
  for (int i = 0; i < 1000; ++i) {
    const std::string f = raw.recv();
    ASSERT_FALSE(f.empty());
    wc::Final fin;
    if (wc::decode(f, &fin).is_ok()) {
      EXPECT_EQ(fin.id, 7u);
      EXPECT_EQ(fin.choices.at(0).completion_tokens, 50);
      break;
    }
  }
  executor_.set_step_delay(0ms);

  raw.send("garbage that is no frame");
  wc::Error e = raw.recv_error();
  EXPECT_EQ(e.id, 0u);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "bad_frame");
  EXPECT_NE(e.message.find("bad magic"), std::string::npos) << e.message;

  std::string truncated = wc::encode(s);
  truncated.resize(truncated.size() - 3);
  const uint32_t body = static_cast<uint32_t>(truncated.size() - wc::kHeaderBytes);
  std::memcpy(truncated.data() + 8, &body, 4);
  raw.send(truncated);
  e = raw.recv_error();
  EXPECT_EQ(e.id, 7u);  // the id was readable
  EXPECT_EQ(e.code, "bad_frame");
  EXPECT_NE(e.message.find("request_json"), std::string::npos) << e.message;

  raw.send(wc::encode(wc::Final{}));  // a server-to-client message
  e = raw.recv_error();
  EXPECT_EQ(e.code, "bad_frame");
  EXPECT_NE(e.message.find("not Final"), std::string::npos) << e.message;

  raw.send_multipart({"", wc::encode(s)});  // REQ-style empty delimiter
  e = raw.recv_error();
  EXPECT_EQ(e.code, "bad_frame");

  wc::Submit zero = s;
  zero.id = 0;
  raw.send(wc::encode(zero));
  e = raw.recv_error();
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "id");

  std::string other = wc::encode(s);
  other[4] = static_cast<char>(wc::kProtocolVersion + 1);
  raw.send(other);
  wc::Reject reject;
  ASSERT_TRUE(wc::decode(raw.recv(), &reject).is_ok());
  EXPECT_NE(reject.reason.find("version " + std::to_string(wc::kProtocolVersion + 1) + " is not supported"),
            std::string::npos)
      << reject.reason;

  raw.send(wc::encode(wc::Abort{12345}));  // unknown id: ignored

  // Still serving, on the same connection and on a new one.
  s.id = 8;
  s.request_json = R"({"prompt": [1, 2, 3], "max_tokens": 2})";
  raw.send(wc::encode(s));
  for (;;) {
    const std::string f = raw.recv();
    ASSERT_FALSE(f.empty());
    wc::Final fin;
    if (wc::decode(f, &fin).is_ok()) {
      EXPECT_EQ(fin.id, 8u);
      break;
    }
  }
  auto c = client();
  ASSERT_TRUE(c);
  auto id = c->submit(ZmqRequestKind::kCompletion, R"({"prompt": [1], "max_tokens": 1})");
  ASSERT_TRUE(id.is_ok());
  EXPECT_TRUE(collect(*c, id.value()).final_seen);
}

TEST_F(ZmqClientServerTest, AbortEndsWithFinalAbortAndFreesBlocks) {
  start();
  executor_.set_step_delay(5ms);
  auto c = client();
  ASSERT_TRUE(c);
  std::string prompt = "[1";
  for (int i = 0; i < 100; ++i) prompt += "," + std::to_string(200 + i);
  prompt += "]";
  auto id = c->submit(ZmqRequestKind::kCompletion, R"({"prompt": )" + prompt + R"(, "max_tokens": 400, "n": 2})");
  ASSERT_TRUE(id.is_ok());
  int deltas = 0;
  while (deltas < 4) {
    auto ev = c->next_event(5s);
    ASSERT_TRUE(ev.is_ok()) << ev.status().to_string();
    ASSERT_EQ(ev->kind, ZmqClientEvent::Kind::kDelta);
    ++deltas;
  }
  EngineServiceStats busy = service_->stats();
  EXPECT_LT(busy.kv_blocks_free, busy.kv_blocks_total);
  ASSERT_TRUE(c->abort(id.value()).is_ok());
  Outcome o = collect(*c, id.value());
  ASSERT_TRUE(o.final_seen);
  EXPECT_EQ(o.last.finish_reasons, (std::vector<std::string>{"abort", "abort"}));
  ASSERT_EQ(o.last.completion_tokens.size(), 2u);
  EXPECT_LT(o.last.completion_tokens[0], 400);
  EXPECT_EQ(o.last.prompt_tokens, 101);
  EngineServiceStats s = wait_until_idle(1s);
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
  EXPECT_EQ(s.requests_aborted, 1u) << "one request, whatever its n, as vLLM counts it";
  EXPECT_EQ(s.requests_failed + s.requests_finished_stop + s.requests_finished_length, 0u);
  EXPECT_EQ(server_->live_requests(), 0u);
}

TEST_F(ZmqClientServerTest, ClientThatVanishesMidStreamHasItsBlocksFreed) {
  start({}, 1024, "tcp://127.0.0.1:*");
  executor_.set_step_delay(5ms);
  auto c = client();
  ASSERT_TRUE(c);
  std::string prompt = "[1";
  for (int i = 0; i < 100; ++i) prompt += "," + std::to_string(200 + i);
  prompt += "]";
  auto id = c->submit(ZmqRequestKind::kCompletion, R"({"prompt": )" + prompt + R"(, "max_tokens": 400})");
  ASSERT_TRUE(id.is_ok());
  for (int deltas = 0; deltas < 3;) {
    auto ev = c->next_event(5s);
    ASSERT_TRUE(ev.is_ok()) << ev.status().to_string();
    ASSERT_EQ(ev->kind, ZmqClientEvent::Kind::kDelta);
    ++deltas;
  }
  EngineServiceStats busy = service_->stats();
  EXPECT_LT(busy.kv_blocks_free, busy.kv_blocks_total);
  EXPECT_EQ(busy.num_running, 1);
  c.reset();  // closes the DEALER (linger 0)
  EngineServiceStats s = wait_until_idle(1s);
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total) << "blocks not freed within 1 s of the disconnect";
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.requests_aborted, 1u);
  EXPECT_EQ(server_->live_requests(), 0u);
}

TEST_F(ZmqClientServerTest, TwentyConcurrentClients) {
  start();
  constexpr int kClients = 20;
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  const std::string want = expected_text(20);
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i]() {
      auto c = ZmqClient::connect(server_->endpoint());
      if (!c.is_ok()) return;
      // Two requests in flight per client, events interleaved on one socket.
      auto a = c.value()->submit(ZmqRequestKind::kCompletion,
                                 R"({"prompt": [1, )" + std::to_string(300 + i) + R"(], "max_tokens": 20})");
      auto b = c.value()->submit(ZmqRequestKind::kCompletion,
                                 R"({"prompt": [1, )" + std::to_string(600 + i) + R"(], "max_tokens": 20})");
      if (!a.is_ok() || !b.is_ok()) return;
      std::map<uint64_t, Outcome> others;
      Outcome oa = collect(*c.value(), a.value(), 20s, &others);
      Outcome ob = others[b.value()].final_seen ? others[b.value()] : collect(*c.value(), b.value(), 20s);
      if (oa.final_seen && ob.final_seen && oa.text[0] == want && ob.text[0] == want &&
          oa.last.completion_tokens == std::vector<int>{20} && ob.last.completion_tokens == std::vector<int>{20})
        ++good;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), kClients);
  EXPECT_EQ(service_->stats().requests_finished_length, static_cast<uint64_t>(2 * kClients));
  EXPECT_EQ(server_->live_requests(), 0u);
}

TEST_F(ZmqClientServerTest, StopEndsLiveRequestsWith503AndFreesBlocks) {
  start();
  executor_.set_step_delay(5ms);
  auto c = client();
  ASSERT_TRUE(c);
  auto id = c->submit(ZmqRequestKind::kCompletion, R"({"prompt": [1, 2, 3], "max_tokens": 400})");
  ASSERT_TRUE(id.is_ok());
  auto ev = c->next_event(5s);
  ASSERT_TRUE(ev.is_ok());
  server_->stop();
  Outcome o = collect(*c, id.value(), 5s);
  ASSERT_TRUE(o.error_seen);
  EXPECT_EQ(o.last.status, 503);
  EngineServiceStats s = wait_until_idle(1s);
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
}

TEST(ZmqClientTest, ConnectRejectsBadEndpointsAndKeys) {
  EXPECT_EQ(ZmqClient::connect("http://127.0.0.1:5555").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ZmqClient::connect("tcp://").status().code(), StatusCode::kInvalidArgument);
  ZmqClientOptions o;
  o.curve_server_public_key = "short";
  EXPECT_EQ(ZmqClient::connect("tcp://127.0.0.1:5555", o).status().code(), StatusCode::kInvalidArgument);
  // Nobody listens: connecting succeeds (lazily); waiting for an event times out.
  auto c = ZmqClient::connect("ipc:///nonexistent-dir-for-tessera/x.ipc");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  ASSERT_TRUE(c.value()->submit(ZmqRequestKind::kCompletion, "{}").is_ok());
  auto ev = c.value()->next_event(20ms);
  ASSERT_FALSE(ev.is_ok());
  EXPECT_EQ(ev.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(ev.status().message().find("timed out"), std::string::npos);
}

// A client whose security does not match the server's (plain against CURVE, CURVE against
// plain) fails its handshake for good: every call then names the mismatch at once, whether
// the failure came before the request was sent or after.
TEST(ZmqClientTest, HandshakeMismatchIsNamed) {
  const std::string dir = ::tessera::testing::make_temp_dir("zmq-client-handshake");
  char pub[41] = {}, sec[41] = {};
  ASSERT_EQ(zmq_curve_keypair(pub, sec), 0);
  zmq::context_t ctx(1);
  zmq::socket_t curve_router(ctx, zmq::socket_type::router), plain_router(ctx, zmq::socket_type::router);
  curve_router.set(zmq::sockopt::linger, 0);
  plain_router.set(zmq::sockopt::linger, 0);
  curve_router.set(zmq::sockopt::curve_server, true);
  curve_router.set(zmq::sockopt::curve_secretkey, std::string(sec, 40));
  curve_router.bind("ipc://" + dir + "/curve.ipc");
  plain_router.bind("ipc://" + dir + "/plain.ipc");

  // No key, CURVE server: request first, then the wait ends with the error (not a timeout).
  auto c = ZmqClient::connect("ipc://" + dir + "/curve.ipc");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  auto sent = c.value()->submit(ZmqRequestKind::kCompletion, "{}");
  Status st = sent.is_ok() ? c.value()->next_event(60s).status() : sent.status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("handshake"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("server.curve.client_api"), std::string::npos) << st.to_string();
  // After the failure a request is refused with the same error (it used to be "would block").
  st = c.value()->submit(ZmqRequestKind::kCompletion, "{}").status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("handshake"), std::string::npos) << st.to_string();
  EXPECT_NE(c.value()->abort(1).message().find("handshake"), std::string::npos);

  // A key, plain server: the other way round, named as such.
  ZmqClientOptions o;
  o.curve_server_public_key = std::string(pub, 40);
  auto k = ZmqClient::connect("ipc://" + dir + "/plain.ipc", o);
  ASSERT_TRUE(k.is_ok()) << k.status().to_string();
  st = k.value()->next_event(60s).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("the server does not"), std::string::npos) << st.to_string();

  // Another server's key: the server drops the connection without a word, so the client can
  // only time out (docs/api.md says so).
  char other_pub[41] = {}, other_sec[41] = {};
  ASSERT_EQ(zmq_curve_keypair(other_pub, other_sec), 0);
  o.curve_server_public_key = std::string(other_pub, 40);
  auto w = ZmqClient::connect("ipc://" + dir + "/curve.ipc", o);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  ASSERT_TRUE(w.value()->submit(ZmqRequestKind::kCompletion, "{}").is_ok());
  st = w.value()->next_event(300ms).status();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find("timed out"), std::string::npos) << st.to_string();
  std::filesystem::remove_all(dir);
}

TEST(ZmqClientServerStartTest, BadOrBusyEndpointIsAnError) {
  testing::ScriptedExecutor executor;
  EngineServiceOptions eo;
  eo.scheduler.num_blocks = 16;
  EngineService service(eo, executor, nullptr);
  auto start_at = [&](const std::string& endpoint) {
    ZmqClientServerOptions o;
    o.endpoint = endpoint;
    ZmqClientServer server(o, service, nullptr);
    return server.start();
  };
  EXPECT_EQ(start_at("http://127.0.0.1:5555").code(), StatusCode::kInvalidArgument);
  Status st = start_at("tcp://not-an-address:*");
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("server.zmq_client"), std::string::npos) << st.message();
  ZmqClientServerOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  ZmqClientServer first(o, service, nullptr);
  ASSERT_TRUE(first.start().is_ok());
  EXPECT_FALSE(first.endpoint().empty());
  st = start_at(first.endpoint());
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  first.stop();
  first.stop();  // idempotent
}

}  // namespace
}  // namespace tessera
