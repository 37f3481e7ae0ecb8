#include "common/wire/client_messages.h"

#include <type_traits>

#include "common/wire/frame_codec.h"
#include "common/wire/wire_buffer.h"

namespace tessera::wire::client {
namespace {

constexpr size_t kMinTokenBytes = 4 + 4;          // i32 token, f32 logprob
constexpr size_t kMinFinalChoiceBytes = 4 + 4 + 4;  // bytes finish_reason (empty), i32 count, f32[] (empty)

// What the shared codec (common/wire/frame_codec.h) needs to know about this protocol.
struct ClientProtocol {
  using Type = MessageType;
  using Message = client::Message;
  static constexpr uint32_t kMagic = client::kMagic;
  static constexpr uint16_t kVersion = kProtocolVersion;
  static constexpr const char* kName = "client";
  static constexpr Type kFirstType = MessageType::kSubmit;
  static constexpr Type kLastType = MessageType::kReject;
  static constexpr Type kReject = MessageType::kReject;
  static const char* type_name(Type type) { return message_type_name(type); }
  static constexpr Type type_of(std::type_identity<Submit>) { return MessageType::kSubmit; }
  static constexpr Type type_of(std::type_identity<Abort>) { return MessageType::kAbort; }
  static constexpr Type type_of(std::type_identity<Delta>) { return MessageType::kDelta; }
  static constexpr Type type_of(std::type_identity<Final>) { return MessageType::kFinal; }
  static constexpr Type type_of(std::type_identity<Error>) { return MessageType::kError; }
  static constexpr Type type_of(std::type_identity<Reject>) { return MessageType::kReject; }
  template <typename M>
  static Status decode(std::string_view frame, M* m) {
    return ::tessera::wire::client::decode(frame, m);
  }
};
using Codec = FrameCodec<ClientProtocol>;

template <typename BodyFn>
void encode_frame(MessageType type, std::string* out, BodyFn&& body) {
  Codec::encode(type, out, body);
}

// Refuses another version, except for the frozen Reject.
template <typename BodyFn>
Status decode_frame(std::string_view frame, MessageType type, BodyFn&& body) {
  return Codec::decode(frame, type, body);
}

}  // namespace

const char* message_type_name(MessageType type) {
  switch (type) {
    case MessageType::kSubmit: return "Submit";
    case MessageType::kAbort: return "Abort";
    case MessageType::kDelta: return "Delta";
    case MessageType::kFinal: return "Final";
    case MessageType::kError: return "Error";
    case MessageType::kReject: return "Reject";
  }
  return "unknown";
}

StatusOr<Header> decode_header(std::string_view frame) { return Codec::decode_header(frame); }

std::optional<uint64_t> peek_request_id(std::string_view frame) {
  if (frame.size() < kHeaderBytes + 8) return std::nullopt;
  WireReader r(frame);
  if (r.u32("magic") != kMagic) return std::nullopt;
  const uint16_t version = r.u16("version");
  const uint16_t type = r.u16("type");
  if (version != kProtocolVersion) return std::nullopt;
  if (type != static_cast<uint16_t>(MessageType::kSubmit) && type != static_cast<uint16_t>(MessageType::kAbort))
    return std::nullopt;
  r.u32("body_bytes");
  const uint64_t id = r.u64("id");
  if (!r.ok()) return std::nullopt;
  return id;
}

// ---- Submit
void encode(const Submit& m, std::string* out) {
  encode_frame(MessageType::kSubmit, out, [&](WireWriter& w) {
    w.u64(m.id);
    w.u8(static_cast<uint8_t>(m.kind));
    w.bytes(m.api_key);
    w.bytes(m.request_json);
  });
}
Status decode(std::string_view frame, Submit* m) {
  return decode_frame(frame, MessageType::kSubmit, [&](WireReader& r) {
    m->id = r.u64("id");
    const uint8_t kind = r.u8("kind");
    if (r.ok() && kind != static_cast<uint8_t>(RequestKind::kCompletion) &&
        kind != static_cast<uint8_t>(RequestKind::kChat) && kind != static_cast<uint8_t>(RequestKind::kEmbeddings))
      r.fail("kind");
    m->kind = static_cast<RequestKind>(kind);
    r.bytes(&m->api_key, "api_key");
    r.bytes(&m->request_json, "request_json");
  });
}

// ---- Abort
void encode(const Abort& m, std::string* out) {
  encode_frame(MessageType::kAbort, out, [&](WireWriter& w) { w.u64(m.id); });
}
Status decode(std::string_view frame, Abort* m) {
  return decode_frame(frame, MessageType::kAbort, [&](WireReader& r) { m->id = r.u64("id"); });
}

// ---- Delta
void encode(const Delta& m, std::string* out) {
  out->reserve(kHeaderBytes + 24 + m.text.size() + m.reasoning.size() + m.token_ids.size() * kMinTokenBytes);
  encode_frame(MessageType::kDelta, out, [&](WireWriter& w) {
    w.u64(m.id);
    w.u32(m.index);
    w.bytes(m.text);
    w.bytes(m.reasoning);
    w.u32(static_cast<uint32_t>(m.token_ids.size()));
    for (size_t i = 0; i < m.token_ids.size(); ++i) {
      w.i32(m.token_ids[i]);
      w.f32(i < m.logprobs.size() ? m.logprobs[i] : 0.0f);
    }
  });
}
Status decode(std::string_view frame, Delta* m) {
  return decode_frame(frame, MessageType::kDelta, [&](WireReader& r) {
    m->id = r.u64("id");
    m->index = r.u32("index");
    r.bytes(&m->text, "text");
    r.bytes(&m->reasoning, "reasoning");
    const uint32_t n = r.count(kMinTokenBytes, "tokens.count");
    m->token_ids.resize(n);
    m->logprobs.resize(n);
    for (uint32_t i = 0; i < n && r.ok(); ++i) {
      m->token_ids[i] = r.i32("token.id");
      m->logprobs[i] = r.f32("token.logprob");
    }
  });
}

// ---- Final
void encode(const Final& m, std::string* out) {
  encode_frame(MessageType::kFinal, out, [&](WireWriter& w) {
    w.u64(m.id);
    w.i32(m.prompt_tokens);
    w.u32(static_cast<uint32_t>(m.choices.size()));
    for (const FinalChoice& c : m.choices) {
      w.bytes(c.finish_reason);
      w.i32(c.completion_tokens);
      w.f32_array(c.embedding);
    }
  });
}
Status decode(std::string_view frame, Final* m) {
  return decode_frame(frame, MessageType::kFinal, [&](WireReader& r) {
    m->id = r.u64("id");
    m->prompt_tokens = r.i32("prompt_tokens");
    const uint32_t n = r.count(kMinFinalChoiceBytes, "choices.count");
    m->choices.resize(n);
    for (uint32_t i = 0; i < n && r.ok(); ++i) {
      r.bytes(&m->choices[i].finish_reason, "choice.finish_reason");
      m->choices[i].completion_tokens = r.i32("choice.completion_tokens");
      r.f32_array(&m->choices[i].embedding, "choice.embedding");
    }
  });
}

// ---- Error
void encode(const Error& m, std::string* out) {
  encode_frame(MessageType::kError, out, [&](WireWriter& w) {
    w.u64(m.id);
    w.u16(m.status);
    w.bytes(m.type);
    w.bytes(m.code);
    w.bytes(m.param);
    w.bytes(m.message);
  });
}
Status decode(std::string_view frame, Error* m) {
  return decode_frame(frame, MessageType::kError, [&](WireReader& r) {
    m->id = r.u64("id");
    m->status = r.u16("status");
    r.bytes(&m->type, "type");
    r.bytes(&m->code, "code");
    r.bytes(&m->param, "param");
    r.bytes(&m->message, "message");
  });
}

// ---- Reject (frozen)
void encode(const Reject& m, std::string* out) {
  encode_frame(MessageType::kReject, out, [&](WireWriter& w) { w.bytes(m.reason); });
}
Status decode(std::string_view frame, Reject* m) {
  return decode_frame(frame, MessageType::kReject, [&](WireReader& r) { r.bytes(&m->reason, "reason"); });
}

StatusOr<Message> decode_message(std::string_view frame) { return Codec::decode_message(frame); }

}  // namespace tessera::wire::client
