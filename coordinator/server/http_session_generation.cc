#include "coordinator/server/http_session.h"

#include <string>

#include "common/logging.h"

namespace tessera {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

namespace {

struct ParsedRequest {
  bool ok = false;
  ApiRequest request;
  ApiError error;
};

}  // namespace

void HttpSession::start_generation(ApiEndpoint endpoint, std::string body) {
  const size_t bytes = body.size();
  off_io(
      bytes, [this, endpoint, body = std::move(body)]() {
        ParsedRequest p;
        p.ok = parse_api_request(endpoint, body, server_.api, &p.request, &p.error);
        return p;
      },
      [this](ParsedRequest p) {
        if (!p.ok) return send_error(p.error);
        submit_generation(std::move(p.request));
      });
}

namespace {

struct ParsedResponses {
  bool ok = false;
  std::shared_ptr<ResponsesRequest> responses;
  ApiRequest request;
  ApiError error;
};

}  // namespace

void HttpSession::start_responses(std::string body) {
  const size_t bytes = body.size();
  off_io(
      bytes, [this, body = std::move(body)]() {
        ParsedResponses p;
        p.responses = std::make_shared<ResponsesRequest>();
        p.ok = parse_responses_request(body, server_.api.served(), server_.response_store, p.responses.get(), &p.error) &&
               parse_api_request(ApiEndpoint::kChatCompletions, p.responses->chat_body.dump(), server_.api, &p.request,
                                 &p.error);
        return p;
      },
      [this](ParsedResponses p) {
        if (!p.ok) return send_error(p.error);
        submit_generation(std::move(p.request), std::move(p.responses));
      });
}

void HttpSession::submit_generation(ApiRequest request, std::shared_ptr<const ResponsesRequest> responses) {
  auto g = std::make_unique<Generation>();
  g->request = std::move(request);
  g->responses = std::move(responses);
  g->id = g->responses ? make_responses_id() : make_response_id(g->request.endpoint);
  g->serial = ++serial_;
  g->created = unix_now();
  const size_t n = g->request.num_choices();
  g->results = ChoiceResults(n);
  gen_ = std::move(g);

  StatusOr<std::vector<RequestId>> ids = submit_api_request(server_.service, gen_->request, make_callback(gen_->serial));
  if (!ids.is_ok()) {
    gen_.reset();  // the prompts submitted so far were aborted; their late events find no generation
    const ApiError e = api_error_of(ids.status());
    if (e.http_status == 429 || e.http_status == 503) return send_error(e, {{"Retry-After", kRetryAfterSeconds}});
    return send_error(e);
  }
  gen_->request_ids = std::move(ids).value();
  keep_ = shared_from_this();  // alive until the generation ends, even with nothing pending
  if (gen_->request.stream) begin_stream();
  watch_disconnect(gen_->serial);
}

ChoiceCallback HttpSession::make_callback(uint64_t serial) {
  std::weak_ptr<HttpSession> weak = weak_from_this();
  std::shared_ptr<HttpLiveness> live = server_.liveness;
  return [weak, live, serial](size_t index, const GenerateEvent& ev) {
    std::lock_guard<std::mutex> lock(live->mu);
    if (!live->alive) return;
    std::shared_ptr<HttpSession> self = weak.lock();
    if (!self) return;
    asio::post(self->stream_.get_executor(),
               [self, serial, index, ev]() { self->on_event(serial, index, ev); });
  };
}

void HttpSession::on_event(uint64_t serial, size_t index, const GenerateEvent& ev) {
  if (!gen_ || gen_->serial != serial || !gen_->results.add(index, ev)) return;
  Generation& g = *gen_;
  ChoiceOutput& out = g.results.outputs[index];
  if (g.request.stream && g.responses_stream) {
    ResponsesStream& rs = *g.responses_stream;
    if (ev.finished && ev.finish_reason == FinishReason::kError) {
      queue_chunk(responses_sse_event(rs.error(engine_error(g))));
    } else if (ev.finished && ev.finish_reason == FinishReason::kAborted) {
      queue_chunk(responses_sse_event(rs.error(cut_error())));
    } else {
      for (const std::string& chunk :
           stream_event_chunks(g.request, g.id, g.created, static_cast<int>(index), ev, server_.tokenizer, &out)) {
        for (const ResponsesStream::Event& e : rs.feed(nlohmann::json::parse(chunk, nullptr, false)))
          queue_chunk(responses_sse_event(e));
      }
    }
  } else if (g.request.stream) {
    if (ev.finished && ev.finish_reason == FinishReason::kError) {
      queue_chunk(sse_event(error_body(engine_error(g))));
    } else if (ev.finished && ev.finish_reason == FinishReason::kAborted) {
      // Never a bare cut: the client learns why this choice has no final chunk.
      queue_chunk(sse_event(error_body(cut_error())));
    } else {
      // echo + logprobs: the prompt's chunk waits for its logprobs, which come with the first event.
      if (echo_waits_for_logprobs(g.request) && !out.stream_echoed) {
        out.stream_echoed = true;
        queue_chunk(sse_event(stream_echo_body(g.request, g.id, g.created, static_cast<int>(index),
                                               ev.prompt_logprobs, server_.tokenizer, &out.stream_text_offset)));
      }
      for (const std::string& chunk :
           stream_event_chunks(g.request, g.id, g.created, static_cast<int>(index), ev, server_.tokenizer, &out))
        queue_chunk(sse_event(chunk));
    }
  }
  if (g.results.complete()) finish_generation();
}

bool HttpSession::echo_waits_for_logprobs(const ApiRequest& r) {
  return r.endpoint == ApiEndpoint::kCompletions && r.echo && r.logprobs >= 0;
}

void HttpSession::begin_stream() {
  Generation& g = *gen_;
  // HTTP/1.1 streams are chunked, one event a chunk; HTTP/1.0 has no chunks, so its stream
  // ends when the connection closes.
  auto head = std::make_unique<Outgoing>(Outgoing::Kind::kStreamHead);
  head->response = make_response(200, "text/event-stream", keep_alive_ && version_ != 10,
                                 {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
  if (version_ != 10) head->response.chunked(true);
  server_.responses.add(200);
  enqueue(std::move(head));
  if (g.responses) {  // the Responses event sequence instead of chat chunks
    g.responses_stream = std::make_unique<ResponsesStream>(g.id, g.created, *g.responses);
    for (const ResponsesStream::Event& e : g.responses_stream->start()) queue_chunk(responses_sse_event(e));
    return;
  }
  for (size_t i = 0; i < g.request.num_choices(); ++i) {
    if (g.request.endpoint == ApiEndpoint::kChatCompletions) {
      queue_chunk(sse_event(stream_chunk_body(g.request, g.id, g.created, static_cast<int>(i), "", {},
                                              FinishReason::kNone, true, server_.tokenizer)));
    } else if (g.request.echo && !echo_waits_for_logprobs(g.request)) {
      queue_chunk(sse_event(stream_echo_body(g.request, g.id, g.created, static_cast<int>(i), {}, server_.tokenizer,
                                             &g.results.outputs[i].stream_text_offset)));
    }
  }
}

// The error object of a generation that failed in the engine: 503 when the workers were
// unavailable (a lost rank; the client may retry), else 500.
ApiError HttpSession::engine_error(const Generation& g) {
  return generation_error(g.results.error, g.results.unavailable);
}
ApiError HttpSession::cut_error() {
  return api_error(503, "service_unavailable", "draining",
                   "the server is shutting down and stopped this request before it finished");
}

void HttpSession::finish_responses(Generation& g) {
  const bool failed = !g.results.error.empty() || g.results.cut;
  if (!failed) {
    const nlohmann::json chat =
        nlohmann::json::parse(response_body(g.request, g.id, g.created, g.results.outputs, server_.tokenizer));
    const nlohmann::ordered_json response = responses_object(chat, g.id, g.created, *g.responses);
    if (g.responses->store)
      server_.response_store.put(g.id, ResponseStore::Stored{response, conversation_after(*g.responses, chat)});
    if (!g.request.stream)
      return send(200, "application/json", response.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    for (const ResponsesStream::Event& e : g.responses_stream->finish(response)) queue_chunk(responses_sse_event(e));
  } else if (!g.request.stream) {
    const ApiError e = g.results.error.empty() ? cut_error() : engine_error(g);
    return e.http_status == 503 ? send_error(e, {{"Retry-After", kRetryAfterSeconds}}) : send_error(e);
  }
  // The stream ends after its last event (a failure's error event went out with it): no [DONE].
  end_stream();
}

void HttpSession::end_stream() {
  if (version_ == 10) {
    keep_alive_ = false;
  } else {
    enqueue(std::make_unique<Outgoing>(Outgoing::Kind::kStreamEnd));
  }
  after_write_ = keep_alive_ ? AfterWrite::kRead : AfterWrite::kClose;
  if (!writing_) after_writes();
}

void HttpSession::finish_generation() {
  std::unique_ptr<Generation> g = std::move(gen_);
  if (server_.draining) keep_alive_ = false;  // let the client reconnect elsewhere
  if (g->responses) {
    finish_responses(*g);
    keep_.reset();
    return;
  }
  if (g->request.stream) {
    if (g->request.include_usage)
      queue_chunk(sse_event(stream_usage_body(g->request, g->id, g->created, usage_of(g->request, g->results.outputs))));
    queue_chunk(std::string(kSseDone));
    end_stream();
  } else if (!g->results.error.empty()) {
    const ApiError e = engine_error(*g);
    if (e.http_status == 503) {
      send_error(e, {{"Retry-After", kRetryAfterSeconds}});
    } else {
      send_error(e);
    }
  } else if (g->results.cut) {
    send_error(cut_error(), {{"Retry-After", kRetryAfterSeconds}});
  } else {
    send(200, "application/json", response_body(g->request, g->id, g->created, g->results.outputs, server_.tokenizer));
  }
  keep_.reset();
}

// Aborts every unfinished choice of the current generation (disconnect).
void HttpSession::abort_generation() {
  if (!gen_) return;
  abort_api_request(server_.service, gen_->request_ids);
  gen_.reset();
  keep_.reset();
}

// Readable while a generation runs: either the client closed (EOF/reset: abort at once)
// or it pipelined its next request (leave it in the socket for the next read).
void HttpSession::watch_disconnect(uint64_t serial) {
  stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), serial](beast::error_code ec) {
    if (ec || !self->gen_ || self->gen_->serial != serial) return;
    char c;
    beast::error_code pec;
    const size_t got = self->stream_.socket().receive(asio::buffer(&c, 1), tcp::socket::message_peek, pec);
    if (pec == asio::error::would_block || pec == asio::error::try_again) return self->watch_disconnect(serial);
    if (pec || got == 0) {
      TESSERA_LOG_INFO("[coord] http client disconnected; aborting request {}", self->gen_->id);
      return self->disconnect();
    }
  });
}

}  // namespace tessera
