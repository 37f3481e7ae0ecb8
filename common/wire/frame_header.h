#pragma once
// The 12-byte header that starts every frame of both ZeroMQ protocols (magic u32, version u16,
// type u16, body length u32; frozen across versions). Its fields as read, for the protocols'
// public headers; the codec that writes and checks it is common/wire/frame_codec.h.
#include <cstddef>
#include <cstdint>

namespace tessera::wire {

inline constexpr size_t kFrameHeaderBytes = 12;

// `Type` is the protocol's message-type enum. A frame of another version may name a type this
// build does not know (frame_codec.h checks the type only for this build's version).
template <typename Type>
struct FrameHeader {
  uint16_t version = 0;
  Type type{};
  uint32_t body_bytes = 0;
};

}  // namespace tessera::wire
