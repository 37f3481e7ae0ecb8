#pragma once
// The ZeroMQ client API (clients <-> coordinator): message structs and their versioned
// binary encoding (docs/api.md, "ZeroMQ client API", has the byte layout). One message is one
// ZeroMQ frame; the coordinator's ROUTER adds/strips the routing-id frame.
//
//   header (12 bytes): magic u32 "TSCP" | version u16 | type u16 | body length u32
//   body:              the message's fields, little-endian, in declaration order
//
// Like common/wire/messages.h (the worker protocol), the header layout and the Reject body
// (type 6) never change between versions, so either side can always say "wrong version".
// This is input from the network: decoders check every length and return a Status on
// truncated, oversized, garbled or unknown-version input; they never crash and never
// allocate more than the input could describe.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/status.h"
#include "common/wire/frame_header.h"

namespace tessera::wire::client {

inline constexpr uint32_t kMagic = 0x50435354;  // "TSCP" as little-endian bytes
// 2: Delta.reasoning (a reasoning model's thoughts apart from the answer); 3: RequestKind
// kEmbeddings and FinalChoice.embedding.
inline constexpr uint16_t kProtocolVersion = 3;
inline constexpr size_t kHeaderBytes = kFrameHeaderBytes;

enum class MessageType : uint16_t {
  kSubmit = 1,  // client -> server: one OpenAI request body
  kAbort = 2,   // client -> server: stop a request (its Final still comes)
  kDelta = 3,   // server -> client: new text and tokens of one choice
  kFinal = 4,   // server -> client: the request is complete (one per request)
  kError = 5,   // server -> client: the request failed and is over (or a frame was refused)
  kReject = 6,  // server -> client: frame of an unsupported version; frozen across versions
};
const char* message_type_name(MessageType type);

enum class RequestKind : uint8_t { kCompletion = 1, kChat = 2, kEmbeddings = 3 };

struct Submit {
  uint64_t id = 0;  // chosen by the client, unique among its live requests; 0 is reserved
  RequestKind kind = RequestKind::kCompletion;
  std::string api_key;       // checked when the server has api_keys; may be empty otherwise
  std::string request_json;  // the body of POST /v1/completions, /v1/chat/completions or /v1/embeddings
};

struct Abort {
  uint64_t id = 0;
};

struct Delta {
  uint64_t id = 0;
  uint32_t index = 0;  // choice index (prompt_index * n + i, as in REST)
  std::string text;    // new text (may be empty while a character's bytes are incomplete)
  // Chat on a reasoning model (docs/api.md, "Reasoning models"): new thought text; `text` then
  // carries only the answer. Empty otherwise.
  std::string reasoning;
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;  // one per token id (the sampled token's logprob)
};

struct FinalChoice {
  std::string finish_reason;  // "stop" | "length" | "abort"
  int32_t completion_tokens = 0;
  // kEmbeddings: the input's vector (cut to `dimensions` and normalised as REST returns it).
  std::vector<float> embedding;
};

struct Final {
  uint64_t id = 0;
  int32_t prompt_tokens = 0;  // each prompt counted once
  std::vector<FinalChoice> choices;
};

struct Error {
  uint64_t id = 0;      // 0 when the request id is unknown (e.g. a garbled frame)
  uint16_t status = 0;  // the HTTP status REST would have answered
  std::string type, code, param, message;  // OpenAI's error object ("" = null)
};

struct Reject {
  std::string reason;
};

using Header = FrameHeader<MessageType>;

// Checks magic, type and length, not the version (so a frame of another version can be
// answered with a Reject naming both versions); the type only when the version is this one's
// (common/wire/frame_codec.h has the framing rules both protocols share).
StatusOr<Header> decode_header(std::string_view frame);

// The request id of a Submit or Abort frame whose body starts with it (even if the rest is
// garbled), so an error can name the request; nullopt when it cannot be told.
std::optional<uint64_t> peek_request_id(std::string_view frame);

// encode() replaces *out with the full frame (header + body); it reuses out's capacity.
// Delta: token_ids and logprobs must have the same length (a missing logprob is sent as 0).
void encode(const Submit& m, std::string* out);
void encode(const Abort& m, std::string* out);
void encode(const Delta& m, std::string* out);
void encode(const Final& m, std::string* out);
void encode(const Error& m, std::string* out);
void encode(const Reject& m, std::string* out);

template <typename T>
std::string encode(const T& m) {
  std::string out;
  encode(m, &out);
  return out;
}

// decode() checks header (magic, version, type, length) and body; on error *out is
// unspecified. DataLoss for malformed frames, Unimplemented for another version,
// InvalidArgument for a different message type than asked.
Status decode(std::string_view frame, Submit* out);
Status decode(std::string_view frame, Abort* out);
Status decode(std::string_view frame, Delta* out);
Status decode(std::string_view frame, Final* out);
Status decode(std::string_view frame, Error* out);
Status decode(std::string_view frame, Reject* out);  // accepts any version

using Message = std::variant<Submit, Abort, Delta, Final, Error, Reject>;
// Decodes whatever the frame holds.
StatusOr<Message> decode_message(std::string_view frame);

}  // namespace tessera::wire::client
