#pragma once
// The codec both ZeroMQ protocols share (coordinator <-> workers: messages.h, docs/wire.md;
// clients <-> coordinator: client_messages.h, docs/api.md). A frame is a 12-byte header
//
//   magic u32 | version u16 | type u16 | body length u32      (frozen across versions)
//
// and a body of little-endian fields. FrameCodec<Protocol> owns every rule about the header
// and the versions: it writes the header around a body, checks magic, type and body length,
// refuses a body of another version except the frozen Reject, and decodes "whatever the frame
// holds". A protocol file only writes and reads its message bodies, and describes itself with
// a small traits struct (FrameProtocol below).
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "common/status.h"
#include "common/wire/frame_header.h"
#include "common/wire/wire_buffer.h"

namespace tessera::wire {

// What FrameCodec needs to know about a protocol:
//   Type                 its message-type enum (uint16_t underneath)
//   Message              std::variant of every message of this version
//   kMagic, kVersion     the header's magic and the version this build speaks
//   kName                "wire", "client": names the protocol in error messages
//   kFirstType/kLastType this version's types are the values in [first, last]
//   kReject              the type whose body is frozen: decodable whatever the version
//   type_name(Type)      "StepPlan", ...; "unknown" for a value of no known type
//   type_of(type_identity<M>) and decode(frame, M*) for every alternative M of Message
template <typename P>
concept FrameProtocol = requires(typename P::Type t) {
  requires std::is_enum_v<typename P::Type>;
  requires std::same_as<std::underlying_type_t<typename P::Type>, uint16_t>;
  requires std::variant_size_v<typename P::Message> > 0;
  { P::kMagic } -> std::convertible_to<uint32_t>;
  { P::kVersion } -> std::convertible_to<uint16_t>;
  { P::kName } -> std::convertible_to<const char*>;
  { P::kFirstType } -> std::convertible_to<typename P::Type>;
  { P::kLastType } -> std::convertible_to<typename P::Type>;
  { P::kReject } -> std::convertible_to<typename P::Type>;
  { P::type_name(t) } -> std::convertible_to<const char*>;
};

template <FrameProtocol P>
class FrameCodec {
 public:
  using Type = typename P::Type;
  using Header = FrameHeader<Type>;
  using Message = typename P::Message;

  // Replaces *out with header + the fields `body(WireWriter&)` writes (reusing out's capacity).
  template <typename BodyFn>
  static void encode(Type type, std::string* out, BodyFn&& body) {
    WireWriter w(out, 0);
    w.u32(P::kMagic);
    w.u16(P::kVersion);
    w.u16(static_cast<uint16_t>(type));
    w.u32(0);  // body length, patched below
    body(w);
    w.finish();
    w.patch_u32(8, static_cast<uint32_t>(out->size() - kFrameHeaderBytes));
  }

  // Checks magic, type and body length, not the version, so a frame of another version can be
  // answered with a Reject naming both. Another version may have types this one lacks, so the
  // type is checked only when the version is this build's. DataLoss on any failure.
  static StatusOr<Header> decode_header(std::string_view frame) {
    if (frame.size() < kFrameHeaderBytes)
      return data_loss(std::string(P::kName) + " message of " + std::to_string(frame.size()) +
                       " bytes is shorter than its " + std::to_string(kFrameHeaderBytes) + "-byte header");
    WireReader r(frame);
    if (r.u32("magic") != P::kMagic) return data_loss(std::string("not a Tessera ") + P::kName + " message (bad magic)");
    Header h;
    h.version = r.u16("version");
    const uint16_t type = r.u16("type");
    h.body_bytes = r.u32("body_bytes");
    if (h.version == P::kVersion && !known_type(type))
      return data_loss(std::string("unknown ") + P::kName + " message type " + std::to_string(type));
    h.type = static_cast<Type>(type);
    if (h.body_bytes != frame.size() - kFrameHeaderBytes)
      return data_loss(std::string(P::type_name(h.type)) + " message says its body has " +
                       std::to_string(h.body_bytes) + " bytes but the frame carries " +
                       std::to_string(frame.size() - kFrameHeaderBytes));
    return h;
  }

  // Decodes a frame that must be a `type` message with `body(WireReader&)`. Unimplemented for
  // another version (except a Reject, whose body is frozen); InvalidArgument for another type;
  // DataLoss naming the field when a field is truncated or invalid, or when bytes are left over.
  template <typename BodyFn>
  static Status decode(std::string_view frame, Type type, BodyFn&& body) {
    TESSERA_ASSIGN_OR_RETURN(Header h, decode_header(frame));
    if (h.version != P::kVersion && type != P::kReject)
      return unimplemented(std::string(P::kName) + " protocol version " + std::to_string(h.version) +
                           " is not supported (this build speaks version " + std::to_string(P::kVersion) + ")");
    if (h.type != type)
      return invalid_argument(std::string("expected a ") + P::type_name(type) + " message, got " + P::type_name(h.type));
    WireReader r(frame.substr(kFrameHeaderBytes));
    body(r);
    const char* what = P::type_name(type);
    if (!r.ok())
      return data_loss(std::string("malformed ") + what + " message: field '" + r.failed_field() +
                       "' is truncated or invalid");
    if (r.remaining() != 0)
      return data_loss(std::string("malformed ") + what + " message: " + std::to_string(r.remaining()) +
                       " trailing bytes");
    return Status::ok();
  }

  // Decodes whatever the frame holds: the Message alternative whose type the header names.
  static StatusOr<Message> decode_message(std::string_view frame) {
    TESSERA_ASSIGN_OR_RETURN(Header h, decode_header(frame));
    return decode_alternative<0>(frame, h);
  }

 private:
  static bool known_type(uint16_t type) {
    return type >= static_cast<uint16_t>(P::kFirstType) && type <= static_cast<uint16_t>(P::kLastType);
  }

  template <size_t I>
  static StatusOr<Message> decode_alternative(std::string_view frame, const Header& h) {
    if constexpr (I == std::variant_size_v<Message>) {
      // Only a frame of another version gets here: decode_header checked this version's types.
      return unimplemented(std::string(P::kName) + " protocol version " + std::to_string(h.version) +
                           " message type " + std::to_string(static_cast<uint16_t>(h.type)) +
                           " is not supported (this build speaks version " + std::to_string(P::kVersion) + ")");
    } else {
      using M = std::variant_alternative_t<I, Message>;
      if (P::type_of(std::type_identity<M>{}) != h.type) return decode_alternative<I + 1>(frame, h);
      M m;
      TESSERA_RETURN_IF_ERROR(P::decode(frame, &m));
      return Message(std::move(m));
    }
  }
};

}  // namespace tessera::wire
