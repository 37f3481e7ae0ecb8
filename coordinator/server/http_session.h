#pragma once
// One HTTP connection of the OpenAI-compatible front end (internal to it; see
// coordinator/server/http_server.h for the routes and limits). Its member functions live in three
// files, one job each:
//   http_session.cc             reading requests (deadlines, framing checks, 100-continue)
//                               and writing answers (the ordered write queue, closing);
//   http_session_routes.cc      routing a request: probes, models, tokenize, OPTIONS/CORS,
//                               authentication, then a generation;
//   http_session_generation.cc  a generation: submitting it, engine events to a response or
//                               an event stream, disconnect and abort.
// Every member is touched only on the connection's strand.

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "coordinator/api/api_submission.h"
#include "coordinator/server/http_server_impl.h"

namespace tessera {

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  // Extra response headers: (name, value), set through Beast's fields.
  using Headers = std::vector<std::pair<boost::beast::string_view, std::string>>;

  // `probe_only`: a connection past max_connections, served one probe request at most
  // (HttpLimits::probe_reserve).
  HttpSession(HttpServer::Impl& server, boost::asio::ip::tcp::socket socket, bool probe_only)
      : server_(server), stream_(std::move(socket)), probe_only_(probe_only) {}
  ~HttpSession() { server_.remove_session(probe_only_); }

  void start();
  // From HttpServer::stop (posted to the strand): abort everything and close.
  void shutdown() { disconnect(); }
  // From HttpServer::stop_gracefully (posted to the strand, so after every engine event
  // already posted here): finish what was started, flush every queued write (the last
  // chunk, `data: [DONE]`, the chunked terminator) and close; close at once when idle.
  void finish_and_close();
  // The connection's strand.
  boost::beast::tcp_stream::executor_type shutdown_executor() { return stream_.get_executor(); }

 private:
  using Request = boost::beast::http::request<boost::beast::http::string_body>;
  using Response = boost::beast::http::response<boost::beast::http::string_body>;

  struct Generation {
    uint64_t serial = 0;
    ApiRequest request;
    std::string id;
    int64_t created = 0;
    std::vector<RequestId> request_ids;  // one per prompt
    // Each choice as gathered; `cut`: aborted by the server (a client's own abort, when it
    // disconnects, never reaches a generation: it is gone by then), so 503.
    ChoiceResults results;
    // A /v1/responses request (run as the chat completion it means), and its event stream.
    std::shared_ptr<const ResponsesRequest> responses;
    std::unique_ptr<ResponsesStream> responses_stream;
  };

  enum class AfterWrite { kNone, kRead, kClose };

  // One thing to write; the queue writes them in order, one at a time. Beast serializes all
  // of them: a whole response (http::async_write), the head of an event stream
  // (http::async_write_header), one event (http::make_chunk; its bare bytes on HTTP/1.0) and
  // the end of a stream (http::make_chunk_last).
  struct Outgoing {
    enum class Kind { kResponse, kStreamHead, kEvent, kStreamEnd };
    explicit Outgoing(Kind k) : kind(k) {}
    Kind kind;
    Response response;  // kResponse, kStreamHead
    std::optional<boost::beast::http::response_serializer<boost::beast::http::string_body>>
        head_serializer;  // kStreamHead, while written
    std::string event;    // kEvent: "data: ...\n\n"
  };

  // ---- reading (http_session.cc) -----------------------------------------------------------
  void do_read();
  void read_header();
  void on_header(boost::beast::error_code ec);
  void read_body();
  void on_read_error(boost::beast::error_code ec);
  void on_read(boost::beast::error_code ec);
  // A probe connection whose request is not a probe (or did not come in time): the 503 of a
  // full server, then close.
  void refuse_as_full();

  // ---- routing (http_session_routes.cc) ----------------------------------------------------
  void handle(const Request& req);
  void answer_options(const Request& req, const std::string& path, const char* allowed);
  // /v1/files and /v1/batches (coordinator/server/http_session_batches.cc).
  void handle_batch_api(const Request& req, const std::string& path, const char* allowed);
  bool authorized(const Request& req) const;

  // Runs `work` on the server's preparation threads (those for large bodies when
  // `body_bytes` is one), then `then(result)` on this connection's strand (dropped when the
  // connection closed meanwhile): tokenizing a 10 MB body or compiling a grammar never holds
  // an I/O thread.
  template <class Work, class Then>
  void off_io(size_t body_bytes, Work work, Then then) {
    preparing_ = true;
    boost::asio::post(server_.prep_for(body_bytes), [self = shared_from_this(), work = std::move(work), then = std::move(then)]() mutable {
      auto result = work();
      boost::asio::post(self->stream_.get_executor(),
                        [self, then = std::move(then), result = std::move(result)]() mutable {
                          self->preparing_ = false;
                          if (self->closed_) return;
                          then(std::move(result));
                        });
    });
  }

  // ---- generation (http_session_generation.cc) ---------------------------------------------
  // Parses the body off the I/O threads, then submits it (submit_generation).
  void start_generation(ApiEndpoint endpoint, std::string body);
  // POST /v1/responses: translated to its chat completion off the I/O threads, then submitted.
  void start_responses(std::string body);
  // POST /v1/load_lora_adapter (`load`) or /v1/unload_lora_adapter (http_session_lora.cc).
  void update_lora(bool load, std::string body);
  void submit_generation(ApiRequest request, std::shared_ptr<const ResponsesRequest> responses = nullptr);
  // The end of a /v1/responses generation: the response object (stored when asked), sent
  // whole or as the stream's last events.
  void finish_responses(Generation& g);
  // After a stream's last event: the chunked terminator (HTTP/1.0: the close), then read the
  // next request or close.
  void end_stream();
  ChoiceCallback make_callback(uint64_t serial);
  void on_event(uint64_t serial, size_t index, const GenerateEvent& ev);
  static bool echo_waits_for_logprobs(const ApiRequest& r);
  void begin_stream();
  static ApiError engine_error(const Generation& g);
  static ApiError cut_error();
  void finish_generation();
  void abort_generation();
  void watch_disconnect(uint64_t serial);

  // ---- writing (http_session.cc) -----------------------------------------------------------
  Response make_response(int status, std::string_view content_type, bool keep_alive, const Headers& extra) const;
  void send(int status, std::string_view content_type, std::string body, const Headers& extra = {});
  void send_error(const ApiError& e, const Headers& extra = {});
  void queue_chunk(std::string event);
  void enqueue(std::unique_ptr<Outgoing> out);
  void write_next();
  void on_written(boost::beast::error_code ec);
  void after_writes();
  void linger();
  void disconnect();

  HttpServer::Impl& server_;
  boost::beast::tcp_stream stream_;
  const bool probe_only_;
  // A probe connection: its wait for a request head (HttpLimits::probe_head_wait).
  std::optional<boost::asio::steady_timer> probe_timer_;
  bool probe_head_in_ = false;    // the head came in time
  bool probe_wait_over_ = false;  // it did not: the read was cancelled
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool first_request_ = true;  // nothing read yet: header_timeout runs from the accept
  bool head_ = false;          // the current request is a HEAD
  std::string origin_;         // its Origin header ("" = none)
  // Headers every answer to the current request carries (CORS, Accept-Encoding of a 415).
  std::vector<std::pair<std::string, std::string>> extra_headers_;
  std::unique_ptr<Generation> gen_;
  uint64_t serial_ = 0;
  std::shared_ptr<HttpSession> keep_;
  std::deque<std::unique_ptr<Outgoing>> queue_;
  char scratch_[4096];
  bool writing_ = false;
  bool closed_ = false;
  bool preparing_ = false;  // off_io work in flight: its answer is still to come
  AfterWrite after_write_ = AfterWrite::kNone;
};

}  // namespace tessera
