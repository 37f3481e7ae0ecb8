#include "common/wire/messages.h"

#include <type_traits>

#include "common/wire/frame_codec.h"
#include "common/wire/wire_buffer.h"

namespace tessera::wire {
namespace {

// Smallest encodings, used to bound element counts before allocating.
// A SeqStep: seq_id, version, num_computed, sample, num_draft, propose, table_from, num_released,
// three array lengths, has_start.
constexpr size_t kMinSeqStepBytes = 8 + 4 + 4 + 1 + 4 + 4 + 4 + 4 + 3 * 4 + 1;
constexpr size_t kMinSampledTokenBytes = 8 + 4 + 4 + 4;

// What the shared codec (common/wire/frame_codec.h) needs to know about this protocol.
struct WorkerProtocol {
  using Type = MessageType;
  using Message = wire::Message;
  static constexpr uint32_t kMagic = wire::kMagic;
  static constexpr uint16_t kVersion = kProtocolVersion;
  static constexpr const char* kName = "wire";
  static constexpr Type kFirstType = MessageType::kRegister;
  static constexpr Type kLastType = MessageType::kCollectiveId;
  static constexpr Type kReject = MessageType::kReject;
  static const char* type_name(Type type) { return message_type_name(type); }
  static constexpr Type type_of(std::type_identity<Register>) { return MessageType::kRegister; }
  static constexpr Type type_of(std::type_identity<Assignment>) { return MessageType::kAssignment; }
  static constexpr Type type_of(std::type_identity<Ready>) { return MessageType::kReady; }
  static constexpr Type type_of(std::type_identity<Heartbeat>) { return MessageType::kHeartbeat; }
  static constexpr Type type_of(std::type_identity<Shutdown>) { return MessageType::kShutdown; }
  static constexpr Type type_of(std::type_identity<Reject>) { return MessageType::kReject; }
  static constexpr Type type_of(std::type_identity<StepPlan>) { return MessageType::kStepPlan; }
  static constexpr Type type_of(std::type_identity<StepResult>) { return MessageType::kStepResult; }
  static constexpr Type type_of(std::type_identity<CollectiveId>) { return MessageType::kCollectiveId; }
  template <typename M>
  static Status decode(std::string_view frame, M* m) {
    return ::tessera::wire::decode(frame, m);
  }
};
using Codec = FrameCodec<WorkerProtocol>;

template <typename BodyFn>
void encode_frame(MessageType type, std::string* out, BodyFn&& body) {
  Codec::encode(type, out, body);
}

// Refuses another version, except for the frozen Reject.
template <typename BodyFn>
Status decode_frame(std::string_view frame, MessageType type, BodyFn&& body) {
  return Codec::decode(frame, type, body);
}

void write_sampling(WireWriter& w, const SamplingParams& s) {
  w.f32(s.temperature);
  w.i32(s.top_k);
  w.f32(s.top_p);
  w.f32(s.min_p);
  w.f32(s.repetition_penalty);
  w.f32(s.presence_penalty);
  w.f32(s.frequency_penalty);
  w.u8(s.seed.has_value() ? 1 : 0);
  w.u64(s.seed.value_or(0));
  w.i32(s.logprobs);
  w.u32(static_cast<uint32_t>(s.logit_bias.size()));
  for (const auto& [token, bias] : s.logit_bias) {
    w.i32(token);
    w.f32(bias);
  }
  w.i32(s.min_tokens);
  w.i32_array(s.min_tokens_stop_ids);
  w.i32(s.prompt_logprobs);
}

void read_sampling(WireReader& r, SamplingParams* s) {
  s->temperature = r.f32("sampling.temperature");
  s->top_k = r.i32("sampling.top_k");
  s->top_p = r.f32("sampling.top_p");
  s->min_p = r.f32("sampling.min_p");
  s->repetition_penalty = r.f32("sampling.repetition_penalty");
  s->presence_penalty = r.f32("sampling.presence_penalty");
  s->frequency_penalty = r.f32("sampling.frequency_penalty");
  const bool has_seed = r.boolean("sampling.has_seed");
  const uint64_t seed = r.u64("sampling.seed");
  if (has_seed) {
    s->seed = seed;
  } else {
    s->seed.reset();
  }
  s->logprobs = r.i32("sampling.logprobs");
  const uint32_t nb = r.count(8, "sampling.logit_bias.count");
  s->logit_bias.resize(nb);
  for (uint32_t i = 0; i < nb && r.ok(); ++i) {
    s->logit_bias[i].first = r.i32("sampling.logit_bias.token");
    s->logit_bias[i].second = r.f32("sampling.logit_bias.bias");
  }
  s->min_tokens = r.i32("sampling.min_tokens");
  r.i32_array(&s->min_tokens_stop_ids, "sampling.min_tokens_stop_ids");
  s->prompt_logprobs = r.i32("sampling.prompt_logprobs");
}

void write_top_logprobs(WireWriter& w, const std::vector<TokenLogprob>& top) {
  w.u32(static_cast<uint32_t>(top.size()));
  for (const TokenLogprob& lp : top) {
    w.i32(lp.token);
    w.f32(lp.logprob);
  }
}

void read_top_logprobs(WireReader& r, std::vector<TokenLogprob>* top) {
  const uint32_t k = r.count(8, "top_logprobs.count");
  top->resize(k);
  for (uint32_t j = 0; j < k && r.ok(); ++j) {
    (*top)[j].token = r.i32("top_logprob.token");
    (*top)[j].logprob = r.f32("top_logprob.logprob");
  }
}

}  // namespace

const char* message_type_name(MessageType type) {
  switch (type) {
    case MessageType::kRegister: return "Register";
    case MessageType::kAssignment: return "Assignment";
    case MessageType::kReady: return "Ready";
    case MessageType::kHeartbeat: return "Heartbeat";
    case MessageType::kShutdown: return "Shutdown";
    case MessageType::kStepPlan: return "StepPlan";
    case MessageType::kStepResult: return "StepResult";
    case MessageType::kReject: return "Reject";
    case MessageType::kCollectiveId: return "CollectiveId";
  }
  return "unknown";
}

StatusOr<Header> decode_header(std::string_view frame) { return Codec::decode_header(frame); }

// ---- Register
void encode(const Register& m, std::string* out) {
  encode_frame(MessageType::kRegister, out, [&](WireWriter& w) {
    w.u32(m.protocol_version);
    w.i32(m.rank);
    w.i32(m.world_size);
    w.bytes(m.host);
    w.bytes(m.backend);
    w.u64(m.free_memory_bytes);
    w.u64(m.total_memory_bytes);
    w.i64(m.pid);
  });
}
Status decode(std::string_view frame, Register* m) {
  return decode_frame(frame, MessageType::kRegister, [&](WireReader& r) {
    m->protocol_version = r.u32("protocol_version");
    m->rank = r.i32("rank");
    m->world_size = r.i32("world_size");
    r.bytes(&m->host, "host");
    r.bytes(&m->backend, "backend");
    m->free_memory_bytes = r.u64("free_memory_bytes");
    m->total_memory_bytes = r.u64("total_memory_bytes");
    m->pid = r.i64("pid");
  });
}

// ---- Assignment
void encode(const Assignment& m, std::string* out) {
  encode_frame(MessageType::kAssignment, out, [&](WireWriter& w) {
    w.bytes(m.model_path);
    w.bytes(m.dtype);
    w.u8(m.kernel_inject ? 1 : 0);
    w.i32(m.world_size);
    w.i32(m.rank);
    w.i32(m.kv_block_size);
    w.i32(m.kv_num_blocks);
    w.bytes(m.kv_dtype);
    w.bytes(m.collective_bootstrap);
    w.bytes(m.worker_config_yaml);
  });
}
Status decode(std::string_view frame, Assignment* m) {
  return decode_frame(frame, MessageType::kAssignment, [&](WireReader& r) {
    r.bytes(&m->model_path, "model_path");
    r.bytes(&m->dtype, "dtype");
    m->kernel_inject = r.boolean("kernel_inject");
    m->world_size = r.i32("world_size");
    m->rank = r.i32("rank");
    m->kv_block_size = r.i32("kv_block_size");
    m->kv_num_blocks = r.i32("kv_num_blocks");
    r.bytes(&m->kv_dtype, "kv_dtype");
    r.bytes(&m->collective_bootstrap, "collective_bootstrap");
    r.bytes(&m->worker_config_yaml, "worker_config_yaml");
  });
}

// ---- Ready
void encode(const Ready& m, std::string* out) {
  encode_frame(MessageType::kReady, out, [&](WireWriter& w) {
    w.i32(m.rank);
    w.u8(m.ok ? 1 : 0);
    w.bytes(m.error);
  });
}
Status decode(std::string_view frame, Ready* m) {
  return decode_frame(frame, MessageType::kReady, [&](WireReader& r) {
    m->rank = r.i32("rank");
    m->ok = r.boolean("ok");
    r.bytes(&m->error, "error");
  });
}

// ---- Heartbeat
void encode(const Heartbeat& m, std::string* out) {
  encode_frame(MessageType::kHeartbeat, out, [&](WireWriter& w) {
    w.i32(m.sender);
    w.u64(m.seq);
    w.i64(m.time_ns);
  });
}
Status decode(std::string_view frame, Heartbeat* m) {
  return decode_frame(frame, MessageType::kHeartbeat, [&](WireReader& r) {
    m->sender = r.i32("sender");
    m->seq = r.u64("seq");
    m->time_ns = r.i64("time_ns");
  });
}

// ---- Shutdown / Reject
void encode(const Shutdown& m, std::string* out) {
  encode_frame(MessageType::kShutdown, out, [&](WireWriter& w) { w.bytes(m.reason); });
}
Status decode(std::string_view frame, Shutdown* m) {
  return decode_frame(frame, MessageType::kShutdown, [&](WireReader& r) { r.bytes(&m->reason, "reason"); });
}
void encode(const Reject& m, std::string* out) {
  encode_frame(MessageType::kReject, out, [&](WireWriter& w) { w.bytes(m.reason); });
}
Status decode(std::string_view frame, Reject* m) {
  return decode_frame(frame, MessageType::kReject, [&](WireReader& r) { r.bytes(&m->reason, "reason"); });
}

// ---- CollectiveId
void encode(const CollectiveId& m, std::string* out) {
  encode_frame(MessageType::kCollectiveId, out, [&](WireWriter& w) {
    w.i32(m.origin_rank);
    w.bytes(m.blob);
  });
}
Status decode(std::string_view frame, CollectiveId* m) {
  return decode_frame(frame, MessageType::kCollectiveId, [&](WireReader& r) {
    m->origin_rank = r.i32("origin_rank");
    r.bytes(&m->blob, "blob");
  });
}

// ---- StepPlan
void encode(const StepPlan& m, std::string* out) {
  size_t estimate = kHeaderBytes + 21 + 8 * m.dropped.size() + m.block_copies.size() * 8;
  for (const SeqStep& s : m.seqs) {
    estimate += kMinSeqStepBytes + 4 * (s.tokens.size() + s.new_blocks.size() + s.allowed_tokens.size());
    if (s.start) {
      estimate += 77 + 4 * (s.start->history.size() + s.start->prompt.size()) +
                  8 * s.start->sampling.logit_bias.size() + 4 * s.start->sampling.min_tokens_stop_ids.size();
    }
  }
  if (out->capacity() < estimate) out->reserve(estimate);
  encode_frame(MessageType::kStepPlan, out, [&](WireWriter& w) {
    w.u64(m.step_id);
    w.u32(static_cast<uint32_t>(m.dropped.size()));
    for (SeqId id : m.dropped) w.u64(id);
    w.u32(static_cast<uint32_t>(m.seqs.size()));
    for (const SeqStep& s : m.seqs) {
      w.u64(s.seq_id);
      w.u32(s.version);
      w.i32(s.num_computed);
      w.u8(s.sample ? 1 : 0);
      w.i32(s.num_draft);
      w.i32(s.propose);
      w.i32(s.table_from);
      w.i32(s.num_released);
      w.i32_array(s.tokens);
      w.i32_array(s.new_blocks);
      w.u32_array(s.allowed_tokens);
      w.u8(s.start ? 1 : 0);
      if (s.start) {
        write_sampling(w, s.start->sampling);
        w.i32(s.start->prompt_len);
        w.i32_array(s.start->history);
        w.i32_array(s.start->prompt);
        w.u64(s.start->sample_from);
        w.u8(static_cast<uint8_t>(s.start->pooling));
        w.bytes(s.start->lora);
      }
    }
    w.u32(static_cast<uint32_t>(m.block_copies.size()));
    for (const auto& [src, dst] : m.block_copies) {
      w.i32(src);
      w.i32(dst);
    }
    w.u8(m.return_logits ? 1 : 0);
    w.u32(static_cast<uint32_t>(m.lora_loads.size()));
    for (const auto& [name, path] : m.lora_loads) {
      w.bytes(name);
      w.bytes(path);
    }
    w.u32(static_cast<uint32_t>(m.lora_unloads.size()));
    for (const std::string& name : m.lora_unloads) w.bytes(name);
  });
}
Status decode(std::string_view frame, StepPlan* m) {
  return decode_frame(frame, MessageType::kStepPlan, [&](WireReader& r) {
    m->step_id = r.u64("step_id");
    const uint32_t d = r.count(8, "dropped.count");
    m->dropped.resize(d);
    for (uint32_t i = 0; i < d && r.ok(); ++i) m->dropped[i] = r.u64("dropped.seq_id");
    const uint32_t n = r.count(kMinSeqStepBytes, "seqs.count");
    m->seqs.resize(n);
    for (uint32_t i = 0; i < n && r.ok(); ++i) {
      SeqStep& s = m->seqs[i];
      s.seq_id = r.u64("seq.seq_id");
      s.version = r.u32("seq.version");
      s.num_computed = r.i32("seq.num_computed");
      s.sample = r.boolean("seq.sample");
      s.num_draft = r.i32("seq.num_draft");
      s.propose = r.i32("seq.propose");
      s.table_from = r.i32("seq.table_from");
      s.num_released = r.i32("seq.num_released");
      r.i32_array(&s.tokens, "seq.tokens");
      r.i32_array(&s.new_blocks, "seq.new_blocks");
      r.u32_array(&s.allowed_tokens, "seq.allowed_tokens");
      if (r.boolean("seq.has_start")) {
        SeqStart& start = s.start ? *s.start : s.start.emplace();
        read_sampling(r, &start.sampling);
        start.prompt_len = r.i32("seq.start.prompt_len");
        r.i32_array(&start.history, "seq.start.history");
        r.i32_array(&start.prompt, "seq.start.prompt");
        start.sample_from = r.u64("seq.start.sample_from");
        const uint8_t pooling = r.u8("seq.start.pooling");
        if (pooling > static_cast<uint8_t>(Pooling::kCls)) r.fail("seq.start.pooling");
        start.pooling = static_cast<Pooling>(pooling);
        r.bytes(&start.lora, "seq.start.lora");
      } else {
        s.start.reset();
      }
    }
    const uint32_t c = r.count(8, "block_copies.count");
    m->block_copies.resize(c);
    for (uint32_t i = 0; i < c && r.ok(); ++i) {
      m->block_copies[i].first = r.i32("block_copies.src");
      m->block_copies[i].second = r.i32("block_copies.dst");
    }
    m->return_logits = r.boolean("return_logits");
    const uint32_t loads = r.count(8, "lora_loads.count");
    m->lora_loads.resize(loads);
    for (uint32_t i = 0; i < loads && r.ok(); ++i) {
      r.bytes(&m->lora_loads[i].first, "lora_loads.name");
      r.bytes(&m->lora_loads[i].second, "lora_loads.path");
    }
    const uint32_t unloads = r.count(4, "lora_unloads.count");
    m->lora_unloads.resize(unloads);
    for (uint32_t i = 0; i < unloads && r.ok(); ++i) r.bytes(&m->lora_unloads[i], "lora_unloads.name");
  });
}

// ---- StepResult
void encode(const StepResult& m, std::string* out) {
  out->reserve(kHeaderBytes + 24 + m.error.size() + m.tokens.size() * kMinSampledTokenBytes + 4 * m.logits.size() +
               m.prompt_logprobs.size() * 24);
  encode_frame(MessageType::kStepResult, out, [&](WireWriter& w) {
    w.u64(m.step_id);
    w.bytes(m.error);
    w.u32(static_cast<uint32_t>(m.tokens.size()));
    for (const SampledToken& t : m.tokens) {
      w.u64(t.seq_id);
      w.i32(t.token);
      w.f32(t.logprob);
      write_top_logprobs(w, t.top_logprobs);
    }
    w.f32_array(m.logits);
    w.u32(static_cast<uint32_t>(m.prompt_logprobs.size()));
    for (const PromptLogprob& p : m.prompt_logprobs) {
      w.u64(p.seq_id);
      w.i32(p.position);
      w.i32(p.token);
      w.f32(p.logprob);
      write_top_logprobs(w, p.top_logprobs);
    }
    w.u8(m.leaving ? 1 : 0);
    w.u32(static_cast<uint32_t>(m.proposals.size()));
    for (const Proposal& p : m.proposals) {
      w.u64(p.seq_id);
      w.i32_array(p.tokens);
    }
    w.f32(m.target_seconds);
    w.f32(m.draft_seconds);
    w.i32(m.draft_forwards);
    w.u32(static_cast<uint32_t>(m.pooled.size()));
    for (const PooledHidden& p : m.pooled) {
      w.u64(p.seq_id);
      w.i32(p.rows);
      w.f32_array(p.sum);
    }
  });
}
Status decode(std::string_view frame, StepResult* m) {
  return decode_frame(frame, MessageType::kStepResult, [&](WireReader& r) {
    m->step_id = r.u64("step_id");
    r.bytes(&m->error, "error");
    const uint32_t n = r.count(kMinSampledTokenBytes, "tokens.count");
    m->tokens.resize(n);
    for (uint32_t i = 0; i < n && r.ok(); ++i) {
      SampledToken& t = m->tokens[i];
      t.seq_id = r.u64("token.seq_id");
      t.token = r.i32("token.token");
      t.logprob = r.f32("token.logprob");
      read_top_logprobs(r, &t.top_logprobs);
    }
    r.f32_array(&m->logits, "logits");
    const uint32_t np = r.count(8 + 4 + 4 + 4 + 4, "prompt_logprobs.count");
    m->prompt_logprobs.resize(np);
    for (uint32_t i = 0; i < np && r.ok(); ++i) {
      PromptLogprob& p = m->prompt_logprobs[i];
      p.seq_id = r.u64("prompt_logprob.seq_id");
      p.position = r.i32("prompt_logprob.position");
      p.token = r.i32("prompt_logprob.token");
      p.logprob = r.f32("prompt_logprob.logprob");
      read_top_logprobs(r, &p.top_logprobs);
    }
    m->leaving = r.boolean("leaving");
    const uint32_t nprop = r.count(8 + 4, "proposals.count");
    m->proposals.resize(nprop);
    for (uint32_t i = 0; i < nprop && r.ok(); ++i) {
      m->proposals[i].seq_id = r.u64("proposal.seq_id");
      r.i32_array(&m->proposals[i].tokens, "proposal.tokens");
    }
    m->target_seconds = r.f32("target_seconds");
    m->draft_seconds = r.f32("draft_seconds");
    m->draft_forwards = r.i32("draft_forwards");
    const uint32_t npool = r.count(8 + 4 + 4, "pooled.count");
    m->pooled.resize(npool);
    for (uint32_t i = 0; i < npool && r.ok(); ++i) {
      m->pooled[i].seq_id = r.u64("pooled.seq_id");
      m->pooled[i].rows = r.i32("pooled.rows");
      r.f32_array(&m->pooled[i].sum, "pooled.sum");
    }
  });
}

StatusOr<Message> decode_message(std::string_view frame) { return Codec::decode_message(frame); }

}  // namespace tessera::wire
