#pragma once
// The frame both ZeroMQ protocols share (coordinator <-> workers: messages.h; clients <->
// coordinator: client_messages.h): a 12-byte header (u32 magic, u16 version, u16 type, u32
// body length) and a body of little-endian fields. Each protocol checks its own magic,
// versions and types; these helpers write a header around a body and read a body whose
// header the protocol has accepted, so the framing rules live in one place.
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/wire/wire_buffer.h"

namespace tessera::wire {

inline constexpr size_t kFrameHeaderBytes = 12;

// Replaces *out with header + the fields `body(WireWriter&)` writes (reusing out's capacity).
template <typename BodyFn>
void encode_frame(uint32_t magic, uint16_t version, uint16_t type, std::string* out, BodyFn&& body) {
  WireWriter w(out, 0);
  w.u32(magic);
  w.u16(version);
  w.u16(type);
  w.u32(0);  // body length, patched below
  body(w);
  w.finish();
  w.patch_u32(8, static_cast<uint32_t>(out->size() - kFrameHeaderBytes));
}

// The header's fields, as read: each protocol decides which versions and types it knows.
struct FrameHeader {
  uint16_t version = 0;
  uint16_t type = 0;
  uint32_t body_bytes = 0;
};

// Reads the header: DataLoss when the frame is shorter than it or the magic is not
// `magic`; `protocol` ("wire", "client") names the protocol in the message.
inline StatusOr<FrameHeader> read_frame_header(std::string_view frame, uint32_t magic, const char* protocol) {
  if (frame.size() < kFrameHeaderBytes)
    return data_loss(std::string(protocol) + " message of " + std::to_string(frame.size()) +
                     " bytes is shorter than its " + std::to_string(kFrameHeaderBytes) + "-byte header");
  WireReader r(frame);
  if (r.u32("magic") != magic) return data_loss(std::string("not a Tessera ") + protocol + " message (bad magic)");
  FrameHeader h;
  h.version = r.u16("version");
  h.type = r.u16("type");
  h.body_bytes = r.u32("body_bytes");
  return h;
}

// Checks the header's body length against the frame's; `what` names the message type.
inline Status check_frame_body_length(std::string_view frame, uint32_t body_bytes, const char* what) {
  if (body_bytes == frame.size() - kFrameHeaderBytes) return Status::ok();
  return data_loss(std::string(what) + " message says its body has " + std::to_string(body_bytes) +
                   " bytes but the frame carries " + std::to_string(frame.size() - kFrameHeaderBytes));
}

// Reads the body after the header with `body(WireReader&)`: DataLoss naming the message
// (`what`) and the field when a field is truncated or invalid, or when bytes are left over.
template <typename BodyFn>
Status decode_frame_body(std::string_view frame, const char* what, BodyFn&& body) {
  WireReader r(frame.substr(kFrameHeaderBytes));
  body(r);
  if (!r.ok())
    return data_loss(std::string("malformed ") + what + " message: field '" + r.failed_field() +
                     "' is truncated or invalid");
  if (r.remaining() != 0)
    return data_loss(std::string("malformed ") + what + " message: " + std::to_string(r.remaining()) +
                     " trailing bytes");
  return Status::ok();
}

}  // namespace tessera::wire
