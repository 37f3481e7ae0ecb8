#pragma once
// A small C++ client for Tessera's ZeroMQ client API (docs/api.md, "ZeroMQ client API"):
// one DEALER socket connected to the coordinator's ROUTER at `server.zmq_client`. A request
// is an OpenAI request body (the same JSON as POST /v1/completions or
// /v1/chat/completions, validated the same way); its results come back as events: text and
// token deltas per choice, then exactly one final event, or one error event that ends it.
// Not thread-safe: use one client per thread.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera {

enum class ZmqRequestKind : uint8_t { kCompletion = 1, kChat = 2, kEmbeddings = 3 };

struct ZmqClientOptions {
  // Z85 (40 characters) public key of a CURVE server; empty = no encryption.
  std::string curve_server_public_key;
  // Sent with every Submit; required when the server has `server.http.api_keys`.
  std::string api_key;
  // ZMTP heartbeats on the connection (a silent server is dropped and reconnected to).
  std::chrono::milliseconds heartbeat_interval{1000};
};

struct ZmqClientEvent {
  enum class Kind { kDelta, kFinal, kError };
  Kind kind = Kind::kDelta;
  uint64_t request_id = 0;

  // kDelta: new output of choice `index` (text may be empty while bytes of a character wait).
  int index = 0;
  std::string text;
  std::string reasoning;  // chat on a reasoning model: new thought text (text is the answer's)
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;  // one per token id

  // kFinal: the request is complete; one entry per choice.
  std::vector<std::string> finish_reasons;  // "stop" | "length" | "abort"
  std::vector<int> completion_tokens;
  int prompt_tokens = 0;  // each prompt counted once
  // Embeddings: one vector per input (as /v1/embeddings returns them); empty vectors otherwise.
  std::vector<std::vector<float>> embeddings;

  // kError: the request failed and is over. `status` is the HTTP status the REST API would
  // have answered (400 bad field, 404 unknown model, 429 queue full, 503 draining, 500 ...).
  int status = 0;
  std::string error_type, error_code, error_param, error_message;
};

class ZmqClient {
 public:
  // Connects (ZeroMQ connects lazily: an unreachable server shows as timeouts later).
  // InvalidArgument for a malformed endpoint or key. Once a handshake fails for good (CURVE
  // on one side only, a refused client key), every call below returns InvalidArgument saying so.
  static StatusOr<std::unique_ptr<ZmqClient>> connect(const std::string& endpoint, ZmqClientOptions options = {});
  ~ZmqClient();
  ZmqClient(const ZmqClient&) = delete;
  ZmqClient& operator=(const ZmqClient&) = delete;

  // Sends one request; returns its id (chosen by this client, unique per client).
  StatusOr<uint64_t> submit(ZmqRequestKind kind, const std::string& request_json);
  // Asks the server to abort a request; its final event (finish_reason "abort") still comes.
  Status abort(uint64_t request_id);
  // The next event of any request; Unavailable ("timed out ...") when none arrives in time.
  StatusOr<ZmqClientEvent> next_event(std::chrono::milliseconds timeout);

 private:
  struct Impl;
  explicit ZmqClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
