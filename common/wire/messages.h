#pragma once
// The coordinator <-> worker wire protocol: message structs and their versioned binary
// encoding (docs/wire.md has the byte layout). One message is one ZeroMQ frame:
//
//   header (12 bytes): magic u32 "TSWP" | version u16 | type u16 | body length u32
//   body:              the message's fields, little-endian, in declaration order
//
// The header layout and the Reject body never change between versions, so a peer can always
// say "wrong version" in a way the other side understands. Decoders check every length and
// return a Status on truncated, oversized, garbled or unknown-version input; they never
// crash and never allocate more than the input could describe.
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "common/status.h"
#include "common/step_plan.h"
#include "common/wire/frame_header.h"

namespace tessera::wire {

inline constexpr uint32_t kMagic = 0x50575354;  // "TSWP" as little-endian bytes
// 2: CollectiveId; 3: StepPlan.return_logits, StepResult.logits; 4: step deltas (SeqStep
// version, table change, start state; StepPlan.dropped), Register.total_memory_bytes,
// Assignment.worker_config_yaml; 5: SamplingParams.logit_bias, min_tokens(_stop_ids),
// prompt_logprobs, SeqStart.prompt, SeqStart.sample_from (forked choices sample from their
// parent's logits row), StepResult.prompt_logprobs; 6: SeqStep.allowed_tokens (structured
// output's token mask); 7: StepResult.leaving (the rank leaves after a broken collective);
// 8: SeqStep.num_draft (speculative decoding's proposals); 9: SeqStep.propose and
// StepResult.proposals (proposals made by the executors' draft model); 10: SeqStep.allowed_tokens
// may hold a mask per checked row (proposals under a grammar); 11: SeqStart.pooling and
// StepResult.pooled (embedding sequences); 12: SeqStart.lora (the sequence's LoRA adapter),
// StepPlan.lora_loads and lora_unloads (adapters changed at run time); 13: CollectiveId from
// any rank (Gloo's addresses, /dev/shm identities), relayed to all the others.
inline constexpr uint16_t kProtocolVersion = 13;
inline constexpr size_t kHeaderBytes = kFrameHeaderBytes;

enum class MessageType : uint16_t {
  kRegister = 1,    // worker -> coordinator: who I am
  kAssignment = 2,  // coordinator -> worker: what to load, which rank to be
  kReady = 3,       // worker -> coordinator: setup finished (or failed, with the error)
  kHeartbeat = 4,   // both ways, every heartbeat interval
  kShutdown = 5,    // coordinator -> worker: exit cleanly
  kStepPlan = 6,    // coordinator -> worker: run this step
  kStepResult = 7,  // worker -> coordinator: tokens (rank 0) or status only (other ranks)
  kReject = 8,      // coordinator -> worker: registration or message refused, with the reason
  kCollectiveId = 9,  // rank 0 -> coordinator -> the other ranks: the collective group's id
};
const char* message_type_name(MessageType type);

struct Register {
  uint32_t protocol_version = kProtocolVersion;
  int32_t rank = 0;
  int32_t world_size = 1;
  std::string host;
  std::string backend;  // "cpu" | "cuda": the backend this worker made (auto resolved)
  // Its device's memory before the model is loaded (Backend::memory_info, capped by
  // worker.memory_limit_bytes): what cache.num_blocks "auto" sizes the KV pool from.
  uint64_t free_memory_bytes = 0;
  uint64_t total_memory_bytes = 0;
  int64_t pid = 0;
};

struct Assignment {
  std::string model_path;
  std::string dtype;  // "float32" | "float16" | "bfloat16"
  bool kernel_inject = true;
  int32_t world_size = 1;
  int32_t rank = 0;
  int32_t kv_block_size = 16;
  int32_t kv_num_blocks = 0;
  std::string kv_dtype;
  std::string collective_bootstrap;  // opaque bytes: NCCL unique id, shm group name, ...
  // The coordinator's configuration as YAML (common/config.h), without secrets
  // (server.http.api_keys emptied): every rank plans its shard from the same one.
  std::string worker_config_yaml;
};

struct Ready {
  int32_t rank = 0;
  bool ok = true;
  std::string error;  // why setup failed, when !ok
};

struct Heartbeat {
  int32_t sender = -1;  // the worker's rank; -1 for the coordinator
  uint64_t seq = 0;
  int64_t time_ns = 0;  // sender's system clock, ns since the Unix epoch (informational)
};

struct Shutdown {
  std::string reason;
};

struct Reject {
  std::string reason;
};

// A bootstrap blob of a collective group, published by a rank as it is set up (rank 0's
// NCCL unique id; each rank's Gloo addresses and /dev/shm identity): the rank sends it to the
// coordinator, which relays it to every other rank of the group (and to a rank that
// registers later), so the coordinator never needs to link the collective library.
// `origin_rank` is the publishing rank's (the coordinator ignores a blob naming another).
struct CollectiveId {
  int32_t origin_rank = 0;
  std::string blob;  // opaque bytes
};

using Header = FrameHeader<MessageType>;

// Checks magic, type and length, not the version (so a Register from another version can be
// answered with a Reject naming both versions); the type only when the version is this one's
// (common/wire/frame_codec.h has the framing rules both protocols share).
StatusOr<Header> decode_header(std::string_view frame);

// encode() replaces *out with the full frame (header + body); it reuses out's capacity.
void encode(const Register& m, std::string* out);
void encode(const Assignment& m, std::string* out);
void encode(const Ready& m, std::string* out);
void encode(const Heartbeat& m, std::string* out);
void encode(const Shutdown& m, std::string* out);
void encode(const Reject& m, std::string* out);
void encode(const CollectiveId& m, std::string* out);
void encode(const StepPlan& m, std::string* out);
void encode(const StepResult& m, std::string* out);

template <typename T>
std::string encode(const T& m) {
  std::string out;
  encode(m, &out);
  return out;
}

// decode() checks header (magic, version, type, length) and body; on error *out is
// unspecified. Decoding into a recycled StepPlan/StepResult reuses its vectors.
Status decode(std::string_view frame, Register* out);
Status decode(std::string_view frame, Assignment* out);
Status decode(std::string_view frame, Ready* out);
Status decode(std::string_view frame, Heartbeat* out);
Status decode(std::string_view frame, Shutdown* out);
Status decode(std::string_view frame, Reject* out);  // accepts any version
Status decode(std::string_view frame, CollectiveId* out);
Status decode(std::string_view frame, StepPlan* out);
Status decode(std::string_view frame, StepResult* out);

using Message =
    std::variant<Register, Assignment, Ready, Heartbeat, Shutdown, Reject, StepPlan, StepResult, CollectiveId>;
// Decodes whatever the frame holds.
StatusOr<Message> decode_message(std::string_view frame);

}  // namespace tessera::wire
