// Wire protocol: every message survives encode -> decode with random contents, and
// truncated, garbled, oversized or wrong-version input is rejected with a Status (never a
// crash, never a huge allocation).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/wire/messages.h"
#include "common/wire/wire_buffer.h"

namespace tessera::wire {
namespace {

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  int32_t i32() { return static_cast<int32_t>(rng_()); }
  uint64_t u64() { return (static_cast<uint64_t>(rng_()) << 32) ^ rng_(); }
  int n(int max) { return static_cast<int>(rng_() % static_cast<uint32_t>(max + 1)); }
  float f() { return std::uniform_real_distribution<float>(-100.f, 100.f)(rng_); }
  bool b() { return rng_() & 1; }
  std::string bytes(int max) {
    std::string s(n(max), '\0');
    for (char& c : s) c = static_cast<char>(rng_());
    return s;
  }
  std::vector<int32_t> ints(int max) {
    std::vector<int32_t> v(n(max));
    for (auto& x : v) x = i32();
    return v;
  }

 private:
  std::mt19937 rng_;
};

StepPlan random_plan(Gen& g, int max_seqs = 20) {
  StepPlan p;
  p.step_id = g.u64();
  p.dropped.resize(g.n(6));
  for (SeqId& id : p.dropped) id = g.u64();
  p.seqs.resize(g.n(max_seqs));
  for (SeqStep& s : p.seqs) {
    s.seq_id = g.u64();
    s.version = static_cast<uint32_t>(g.i32());
    s.tokens = g.ints(40);
    s.num_computed = g.i32();
    s.sample = g.b();
    s.num_draft = g.i32();
    s.propose = g.i32();
    s.table_from = g.i32();
    s.new_blocks = g.ints(30);
    s.num_released = g.i32();
    if (g.b()) {
      SeqStart& st = s.start.emplace();
      st.sampling.temperature = g.f();
      st.sampling.top_k = g.i32();
      st.sampling.top_p = g.f();
      st.sampling.min_p = g.f();
      st.sampling.repetition_penalty = g.f();
      st.sampling.presence_penalty = g.f();
      st.sampling.frequency_penalty = g.f();
      if (g.b()) st.sampling.seed = g.u64();
      st.sampling.logprobs = g.i32();
      st.sampling.logit_bias.resize(g.n(6));
      for (auto& [token, bias] : st.sampling.logit_bias) token = g.i32(), bias = g.f();
      st.sampling.min_tokens = g.i32();
      st.sampling.min_tokens_stop_ids = g.ints(4);
      st.sampling.prompt_logprobs = g.i32();
      st.prompt_len = g.i32();
      st.history = g.ints(10);
      st.prompt = g.ints(12);
      if (g.b()) st.sample_from = g.u64();
      st.pooling = static_cast<Pooling>(g.n(3));
      if (g.b()) st.lora = "adapter-" + std::to_string(g.n(100));
    }
  }
  p.block_copies.resize(g.n(5));
  for (auto& c : p.block_copies) c = {g.i32(), g.i32()};
  p.lora_loads.resize(g.n(3));
  for (auto& [name, path] : p.lora_loads) {
    name = g.bytes(12);
    path = g.bytes(40);
  }
  p.lora_unloads.resize(g.n(3));
  for (std::string& name : p.lora_unloads) name = g.bytes(12);
  return p;
}

StepResult random_result(Gen& g) {
  StepResult r;
  r.step_id = g.u64();
  r.error = g.bytes(30);
  r.leaving = g.n(2) == 1;
  r.target_seconds = g.f();
  r.draft_seconds = g.f();
  r.draft_forwards = g.i32();
  r.proposals.resize(g.n(5));
  for (Proposal& p : r.proposals) {
    p.seq_id = g.u64();
    p.tokens = g.ints(17);
  }
  r.pooled.resize(g.n(4));
  for (PooledHidden& p : r.pooled) {
    p.seq_id = g.u64();
    p.rows = g.i32();
    p.sum.resize(g.n(9));
    for (float& v : p.sum) v = g.f();
  }
  r.tokens.resize(g.n(20));
  for (SampledToken& t : r.tokens) {
    t.seq_id = g.u64();
    t.token = g.i32();
    t.logprob = g.f();
    t.top_logprobs.resize(g.n(5));
    for (auto& lp : t.top_logprobs) lp = {g.i32(), g.f()};
  }
  r.prompt_logprobs.resize(g.n(8));
  for (PromptLogprob& p : r.prompt_logprobs) {
    p.seq_id = g.u64();
    p.position = g.i32();
    p.token = g.i32();
    p.logprob = g.f();
    p.top_logprobs.resize(g.n(4));
    for (auto& lp : p.top_logprobs) lp = {g.i32(), g.f()};
  }
  return r;
}

Register random_register(Gen& g) {
  return Register{static_cast<uint32_t>(g.i32()), g.i32(), g.i32(), g.bytes(20), g.bytes(8), g.u64(), g.u64(),
                  static_cast<int64_t>(g.u64())};
}
Assignment random_assignment(Gen& g) {
  return Assignment{g.bytes(50), g.bytes(10), g.b(),      g.i32(),    g.i32(),
                    g.i32(),     g.i32(),     g.bytes(9), g.bytes(128), g.bytes(300)};
}

void expect_eq(const SamplingParams& a, const SamplingParams& b) {
  EXPECT_EQ(a.temperature, b.temperature);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.top_p, b.top_p);
  EXPECT_EQ(a.min_p, b.min_p);
  EXPECT_EQ(a.repetition_penalty, b.repetition_penalty);
  EXPECT_EQ(a.presence_penalty, b.presence_penalty);
  EXPECT_EQ(a.frequency_penalty, b.frequency_penalty);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.logprobs, b.logprobs);
  EXPECT_EQ(a.logit_bias, b.logit_bias);
  EXPECT_EQ(a.min_tokens, b.min_tokens);
  EXPECT_EQ(a.min_tokens_stop_ids, b.min_tokens_stop_ids);
  EXPECT_EQ(a.prompt_logprobs, b.prompt_logprobs);
}

void expect_eq(const StepPlan& a, const StepPlan& b) {
  EXPECT_EQ(a.step_id, b.step_id);
  EXPECT_EQ(a.dropped, b.dropped);
  ASSERT_EQ(a.seqs.size(), b.seqs.size());
  for (size_t i = 0; i < a.seqs.size(); ++i) {
    const SeqStep &x = a.seqs[i], &y = b.seqs[i];
    EXPECT_EQ(x.seq_id, y.seq_id);
    EXPECT_EQ(x.version, y.version);
    EXPECT_EQ(x.tokens, y.tokens);
    EXPECT_EQ(x.num_computed, y.num_computed);
    EXPECT_EQ(x.sample, y.sample);
    EXPECT_EQ(x.num_draft, y.num_draft);
    EXPECT_EQ(x.propose, y.propose);
    EXPECT_EQ(x.table_from, y.table_from);
    EXPECT_EQ(x.new_blocks, y.new_blocks);
    EXPECT_EQ(x.num_released, y.num_released);
    ASSERT_EQ(x.start.has_value(), y.start.has_value());
    if (x.start) {
      expect_eq(x.start->sampling, y.start->sampling);
      EXPECT_EQ(x.start->prompt_len, y.start->prompt_len);
      EXPECT_EQ(x.start->history, y.start->history);
      EXPECT_EQ(x.start->prompt, y.start->prompt);
      EXPECT_EQ(x.start->sample_from, y.start->sample_from);
      EXPECT_EQ(x.start->pooling, y.start->pooling);
      EXPECT_EQ(x.start->lora, y.start->lora);
    }
  }
  EXPECT_EQ(a.block_copies, b.block_copies);
  EXPECT_EQ(a.lora_loads, b.lora_loads);
  EXPECT_EQ(a.lora_unloads, b.lora_unloads);
}

void expect_eq(const StepResult& a, const StepResult& b) {
  EXPECT_EQ(a.step_id, b.step_id);
  EXPECT_EQ(a.error, b.error);
  EXPECT_EQ(a.leaving, b.leaving);
  EXPECT_EQ(a.target_seconds, b.target_seconds);
  EXPECT_EQ(a.draft_seconds, b.draft_seconds);
  EXPECT_EQ(a.draft_forwards, b.draft_forwards);
  ASSERT_EQ(a.proposals.size(), b.proposals.size());
  for (size_t i = 0; i < a.proposals.size(); ++i) {
    EXPECT_EQ(a.proposals[i].seq_id, b.proposals[i].seq_id);
    EXPECT_EQ(a.proposals[i].tokens, b.proposals[i].tokens);
  }
  ASSERT_EQ(a.pooled.size(), b.pooled.size());
  for (size_t i = 0; i < a.pooled.size(); ++i) {
    EXPECT_EQ(a.pooled[i].seq_id, b.pooled[i].seq_id);
    EXPECT_EQ(a.pooled[i].rows, b.pooled[i].rows);
    EXPECT_EQ(a.pooled[i].sum, b.pooled[i].sum);
  }
  ASSERT_EQ(a.tokens.size(), b.tokens.size());
  for (size_t i = 0; i < a.tokens.size(); ++i) {
    EXPECT_EQ(a.tokens[i].seq_id, b.tokens[i].seq_id);
    EXPECT_EQ(a.tokens[i].token, b.tokens[i].token);
    EXPECT_EQ(a.tokens[i].logprob, b.tokens[i].logprob);
    ASSERT_EQ(a.tokens[i].top_logprobs.size(), b.tokens[i].top_logprobs.size());
    for (size_t j = 0; j < a.tokens[i].top_logprobs.size(); ++j) {
      EXPECT_EQ(a.tokens[i].top_logprobs[j].token, b.tokens[i].top_logprobs[j].token);
      EXPECT_EQ(a.tokens[i].top_logprobs[j].logprob, b.tokens[i].top_logprobs[j].logprob);
    }
  }
  ASSERT_EQ(a.prompt_logprobs.size(), b.prompt_logprobs.size());
  for (size_t i = 0; i < a.prompt_logprobs.size(); ++i) {
    const PromptLogprob &x = a.prompt_logprobs[i], &y = b.prompt_logprobs[i];
    EXPECT_EQ(x.seq_id, y.seq_id);
    EXPECT_EQ(x.position, y.position);
    EXPECT_EQ(x.token, y.token);
    EXPECT_EQ(x.logprob, y.logprob);
    ASSERT_EQ(x.top_logprobs.size(), y.top_logprobs.size());
    for (size_t j = 0; j < x.top_logprobs.size(); ++j) {
      EXPECT_EQ(x.top_logprobs[j].token, y.top_logprobs[j].token);
      EXPECT_EQ(x.top_logprobs[j].logprob, y.top_logprobs[j].logprob);
    }
  }
}

// One encoded frame of every message type, from one seed.
std::vector<std::string> every_message(uint64_t seed) {
  Gen g(seed);
  return {encode(random_register(g)),
          encode(random_assignment(g)),
          encode(Ready{g.i32(), g.b(), g.bytes(40)}),
          encode(Heartbeat{g.i32(), g.u64(), static_cast<int64_t>(g.u64())}),
          encode(Shutdown{g.bytes(40)}),
          encode(Reject{g.bytes(40)}),
          encode(random_plan(g)),
          encode(random_result(g)),
          encode(CollectiveId{g.i32(), g.bytes(128)})};
}

TEST(WireTest, StepPlanRoundTripsManySeeds) {
  StepPlan recycled;  // decoding into a used plan must fully overwrite it
  for (uint64_t seed = 0; seed < 300; ++seed) {
    Gen g(seed);
    const StepPlan plan = random_plan(g);
    ASSERT_TRUE(decode(encode(plan), &recycled).is_ok()) << "seed " << seed;
    expect_eq(plan, recycled);
  }
}

TEST(WireTest, StepResultRoundTripsManySeeds) {
  StepResult recycled;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    Gen g(seed);
    const StepResult r = random_result(g);
    ASSERT_TRUE(decode(encode(r), &recycled).is_ok()) << "seed " << seed;
    expect_eq(r, recycled);
  }
}

TEST(WireTest, ControlMessagesRoundTripManySeeds) {
  for (uint64_t seed = 0; seed < 300; ++seed) {
    Gen g(seed);
    const Register reg = random_register(g);
    Register reg2;
    ASSERT_TRUE(decode(encode(reg), &reg2).is_ok());
    EXPECT_EQ(reg.protocol_version, reg2.protocol_version);
    EXPECT_EQ(reg.rank, reg2.rank);
    EXPECT_EQ(reg.world_size, reg2.world_size);
    EXPECT_EQ(reg.host, reg2.host);
    EXPECT_EQ(reg.backend, reg2.backend);
    EXPECT_EQ(reg.free_memory_bytes, reg2.free_memory_bytes);
    EXPECT_EQ(reg.total_memory_bytes, reg2.total_memory_bytes);
    EXPECT_EQ(reg.pid, reg2.pid);

    const Assignment a = random_assignment(g);
    Assignment a2;
    ASSERT_TRUE(decode(encode(a), &a2).is_ok());
    EXPECT_EQ(a.model_path, a2.model_path);
    EXPECT_EQ(a.dtype, a2.dtype);
    EXPECT_EQ(a.kernel_inject, a2.kernel_inject);
    EXPECT_EQ(a.world_size, a2.world_size);
    EXPECT_EQ(a.rank, a2.rank);
    EXPECT_EQ(a.kv_block_size, a2.kv_block_size);
    EXPECT_EQ(a.kv_num_blocks, a2.kv_num_blocks);
    EXPECT_EQ(a.kv_dtype, a2.kv_dtype);
    EXPECT_EQ(a.collective_bootstrap, a2.collective_bootstrap);
    EXPECT_EQ(a.worker_config_yaml, a2.worker_config_yaml);

    const Ready ready{g.i32(), g.b(), g.bytes(40)};
    Ready ready2;
    ASSERT_TRUE(decode(encode(ready), &ready2).is_ok());
    EXPECT_EQ(ready.rank, ready2.rank);
    EXPECT_EQ(ready.ok, ready2.ok);
    EXPECT_EQ(ready.error, ready2.error);

    const Heartbeat hb{g.i32(), g.u64(), static_cast<int64_t>(g.u64())};
    Heartbeat hb2;
    ASSERT_TRUE(decode(encode(hb), &hb2).is_ok());
    EXPECT_EQ(hb.sender, hb2.sender);
    EXPECT_EQ(hb.seq, hb2.seq);
    EXPECT_EQ(hb.time_ns, hb2.time_ns);

    Shutdown s2;
    const Shutdown s{g.bytes(30)};
    ASSERT_TRUE(decode(encode(s), &s2).is_ok());
    EXPECT_EQ(s.reason, s2.reason);
    Reject r2;
    const Reject r{g.bytes(30)};
    ASSERT_TRUE(decode(encode(r), &r2).is_ok());
    EXPECT_EQ(r.reason, r2.reason);
    CollectiveId c2;
    const CollectiveId c{g.i32(), g.bytes(128)};
    ASSERT_TRUE(decode(encode(c), &c2).is_ok());
    EXPECT_EQ(c.origin_rank, c2.origin_rank);
    EXPECT_EQ(c.blob, c2.blob);
  }
}

TEST(WireTest, DecodeMessageDispatchesOnType) {
  const std::vector<std::string> frames = every_message(7);
  for (size_t i = 0; i < frames.size(); ++i) {
    StatusOr<Message> m = decode_message(frames[i]);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    EXPECT_EQ(m->index(), i);
  }
}

TEST(WireTest, LayoutIsLittleEndianAndDocumented) {
  const std::string f = encode(Heartbeat{-1, 0x0102030405060708ULL, 5});
  ASSERT_EQ(f.size(), kHeaderBytes + 4 + 8 + 8);
  EXPECT_EQ(f.substr(0, 4), "TSWP");
  EXPECT_EQ(f[4], 13);  // version, little-endian u16 (docs/wire.md: version 13)
  EXPECT_EQ(f[5], 0);
  EXPECT_EQ(f[6], static_cast<char>(MessageType::kHeartbeat));
  EXPECT_EQ(f[8], 20);  // body length
  EXPECT_EQ(static_cast<uint8_t>(f[12]), 0xff);  // sender -1
  EXPECT_EQ(f[16], 0x08);                        // seq, least significant byte first
  EXPECT_EQ(f[23], 0x01);
}

TEST(WireTest, EveryTruncationIsRejected) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    for (const std::string& frame : every_message(seed)) {
      for (size_t len = 0; len < frame.size(); ++len) {
        StatusOr<Message> m = decode_message(std::string_view(frame.data(), len));
        ASSERT_FALSE(m.is_ok()) << "a " << len << "-byte prefix of a " << frame.size() << "-byte frame decoded";
      }
      // A header that agrees with the shorter length is still caught by the body parser.
      for (size_t len = kHeaderBytes; len < frame.size(); ++len) {
        std::string cut = frame.substr(0, len);
        WireWriter(&cut).patch_u32(8, static_cast<uint32_t>(len - kHeaderBytes));
        StatusOr<Message> m = decode_message(cut);
        if (m.is_ok()) continue;  // possible only if the cut lands on a valid shorter message
        EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << m.status().to_string();
      }
    }
  }
}

TEST(WireTest, TrailingBytesAreRejected) {
  for (std::string frame : every_message(3)) {
    frame += "xyz";
    WireWriter(&frame).patch_u32(8, static_cast<uint32_t>(frame.size() - kHeaderBytes));
    StatusOr<Message> m = decode_message(frame);
    ASSERT_FALSE(m.is_ok());
    EXPECT_NE(m.status().message().find("trailing"), std::string::npos) << m.status().to_string();
  }
}

TEST(WireTest, GarbledInputNeverCrashes) {
  std::mt19937 rng(42);
  int rejected = 0, total = 0;
  for (uint64_t seed = 0; seed < 60; ++seed) {
    for (const std::string& frame : every_message(seed)) {
      for (int trial = 0; trial < 60; ++trial) {
        std::string g = frame;
        const int flips = 1 + static_cast<int>(rng() % 6);
        for (int k = 0; k < flips; ++k) g[rng() % g.size()] = static_cast<char>(rng());
        if (rng() % 4 == 0) g.resize(rng() % (g.size() + 1));
        StatusOr<Message> m = decode_message(g);
        ++total;
        if (!m.is_ok()) {
          ++rejected;
          EXPECT_FALSE(m.status().message().empty());
        }
      }
      // Pure noise.
      std::string noise(rng() % 200, '\0');
      for (char& c : noise) c = static_cast<char>(rng());
      EXPECT_FALSE(decode_message(noise).is_ok());
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(total, 0);
}

TEST(WireTest, HugeCountsAreRejectedWithoutAllocating) {
  // A StepPlan header claiming 2^32-1 sequences in a tiny body.
  std::string f;
  WireWriter w(&f);
  w.u32(kMagic);
  w.u16(kProtocolVersion);
  w.u16(static_cast<uint16_t>(MessageType::kStepPlan));
  w.u32(16);
  w.u64(1);
  w.u32(0);  // no dropped sequences
  w.u32(0xffffffffu);
  w.finish();
  StepPlan plan;
  Status st = decode(f, &plan);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("seqs.count"), std::string::npos) << st.to_string();
}

TEST(WireTest, UnknownVersionTypeAndMagicAreRejected) {
  std::string f = encode(random_plan(*std::make_unique<Gen>(1)));
  std::string v2 = f;
  v2[4] = kProtocolVersion + 1;  // a version this build does not speak
  StepPlan plan;
  Status st = decode(v2, &plan);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("version " + std::to_string(kProtocolVersion + 1)), std::string::npos) << st.to_string();
  // The header still reads, so the other side can answer with a Reject.
  StatusOr<Header> h = decode_header(v2);
  ASSERT_TRUE(h.is_ok());
  EXPECT_EQ(h->version, kProtocolVersion + 1);

  std::string bad_type = f;
  bad_type[6] = 99;
  EXPECT_NE(decode(bad_type, &plan).message().find("unknown wire message type 99"), std::string::npos);

  std::string bad_magic = f;
  bad_magic[0] = 'X';
  EXPECT_NE(decode(bad_magic, &plan).message().find("magic"), std::string::npos);

  StepResult result;
  st = decode(f, &result);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("expected a StepResult message, got StepPlan"), std::string::npos);

  // A Reject decodes whatever the version (its layout is frozen).
  std::string rej = encode(Reject{"go away"});
  rej[4] = 9;
  Reject r;
  ASSERT_TRUE(decode(rej, &r).is_ok());
  EXPECT_EQ(r.reason, "go away");
}

// The shared codec (common/wire/frame_codec.h): another version may carry types this build
// lacks; its header still reads (so it can be answered with a Reject) and decoding it names
// both versions, as in the client protocol.
TEST(WireTest, AnotherVersionsUnknownTypeStillHasAReadableHeader) {
  std::string future = encode(Heartbeat{0, 1, 2});
  future[4] = static_cast<char>(kProtocolVersion + 1);
  future[6] = 42;
  StatusOr<Header> h = decode_header(future);
  ASSERT_TRUE(h.is_ok()) << h.status().to_string();
  EXPECT_EQ(h->version, kProtocolVersion + 1);
  EXPECT_EQ(static_cast<uint16_t>(h->type), 42);
  StatusOr<Message> m = decode_message(future);
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("wire protocol version " + std::to_string(kProtocolVersion + 1) +
                                      " message type 42 is not supported"),
            std::string::npos)
      << m.status().message();
  // This version's frames still reject an unknown type outright.
  future[4] = static_cast<char>(kProtocolVersion);
  EXPECT_EQ(decode_header(future).status().code(), StatusCode::kDataLoss);
}

TEST(WireTest, InvalidBoolIsRejected) {
  std::string f = encode(Ready{1, true, ""});
  f[kHeaderBytes + 4] = 7;
  Ready r;
  Status st = decode(f, &r);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("'ok'"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace tessera::wire
