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
