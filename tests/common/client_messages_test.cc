// ZeroMQ client API messages: every message survives encode -> decode with random contents,
// and truncated, garbled, oversized or wrong-version frames are rejected with a Status (this
// is input from the network: never a crash, never a huge allocation).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/wire/client_messages.h"

namespace tessera::wire::client {
namespace {

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  uint64_t u64() { return (static_cast<uint64_t>(rng_()) << 32) ^ rng_(); }
  int32_t i32() { return static_cast<int32_t>(rng_()); }
  int n(int max) { return static_cast<int>(rng_() % static_cast<uint32_t>(max + 1)); }
  float f() { return std::uniform_real_distribution<float>(-100.f, 0.f)(rng_); }
  std::string bytes(int max) {
    std::string s(n(max), '\0');
    for (char& c : s) c = static_cast<char>(rng_());
    return s;
  }

 private:
  std::mt19937 rng_;
};

Submit random_submit(Gen& g) {
  Submit m;
  m.id = g.u64();
  m.kind = static_cast<RequestKind>(1 + g.n(2));  // completion, chat or embeddings
  m.api_key = g.bytes(40);
  m.request_json = g.bytes(300);
  return m;
}

Delta random_delta(Gen& g) {
  Delta m;
  m.id = g.u64();
  m.index = static_cast<uint32_t>(g.i32());
  m.text = g.bytes(50);
  m.reasoning = g.bytes(30);
  const int n = g.n(10);
  for (int i = 0; i < n; ++i) {
    m.token_ids.push_back(g.i32());
    m.logprobs.push_back(g.f());
  }
  return m;
}

Final random_final(Gen& g) {
  Final m;
  m.id = g.u64();
  m.prompt_tokens = g.i32();
  const int n = g.n(6);
  for (int i = 0; i < n; ++i) {
    std::vector<float> embedding(static_cast<size_t>(g.n(5)));
    for (float& v : embedding) v = g.f();
    m.choices.push_back({g.bytes(8), g.i32(), std::move(embedding)});
  }
  return m;
}

Error random_error(Gen& g) {
  Error m;
  m.id = g.u64();
  m.status = static_cast<uint16_t>(g.i32());
  m.type = g.bytes(20);
  m.code = g.bytes(20);
  m.param = g.bytes(20);
  m.message = g.bytes(100);
  return m;
}

// One of every message type, for the rejection tests.
std::vector<std::string> sample_frames() {
  Gen g(7);
  std::vector<std::string> out;
  Submit s = random_submit(g);
  s.api_key = "key";
  s.request_json = R"({"prompt": "x"})";
  out.push_back(encode(s));
  out.push_back(encode(Abort{42}));
  Delta d = random_delta(g);
  d.token_ids = {1, 2, 3};
  d.logprobs = {-0.1f, -0.2f, -0.3f};
  out.push_back(encode(d));
  Final f = random_final(g);
  f.choices = {{"stop", 3, {}}, {"length", 4, {}}};
  out.push_back(encode(f));
  out.push_back(encode(random_error(g)));
  out.push_back(encode(Reject{"no"}));
  return out;
}

TEST(ClientMessagesTest, EveryMessageRoundTripsManySeeds) {
  for (uint64_t seed = 0; seed < 200; ++seed) {
    Gen g(seed);
    {
      const Submit m = random_submit(g);
      Submit got;
      ASSERT_TRUE(decode(encode(m), &got).is_ok()) << seed;
      EXPECT_EQ(got.id, m.id);
      EXPECT_EQ(got.kind, m.kind);
      EXPECT_EQ(got.api_key, m.api_key);
      EXPECT_EQ(got.request_json, m.request_json);
    }
    {
      const Abort m{g.u64()};
      Abort got;
      ASSERT_TRUE(decode(encode(m), &got).is_ok()) << seed;
      EXPECT_EQ(got.id, m.id);
    }
    {
      const Delta m = random_delta(g);
      Delta got;
      ASSERT_TRUE(decode(encode(m), &got).is_ok()) << seed;
      EXPECT_EQ(got.id, m.id);
      EXPECT_EQ(got.index, m.index);
      EXPECT_EQ(got.text, m.text);
      EXPECT_EQ(got.reasoning, m.reasoning);
      EXPECT_EQ(got.token_ids, m.token_ids);
      EXPECT_EQ(got.logprobs, m.logprobs);  // bit-exact floats
    }
    {
      const Final m = random_final(g);
      Final got;
      ASSERT_TRUE(decode(encode(m), &got).is_ok()) << seed;
      EXPECT_EQ(got.id, m.id);
      EXPECT_EQ(got.prompt_tokens, m.prompt_tokens);
      ASSERT_EQ(got.choices.size(), m.choices.size());
      for (size_t i = 0; i < m.choices.size(); ++i) {
        EXPECT_EQ(got.choices[i].finish_reason, m.choices[i].finish_reason);
        EXPECT_EQ(got.choices[i].completion_tokens, m.choices[i].completion_tokens);
        EXPECT_EQ(got.choices[i].embedding, m.choices[i].embedding);
      }
    }
    {
      const Error m = random_error(g);
      Error got;
      ASSERT_TRUE(decode(encode(m), &got).is_ok()) << seed;
      EXPECT_EQ(got.id, m.id);
      EXPECT_EQ(got.status, m.status);
      EXPECT_EQ(got.type, m.type);
      EXPECT_EQ(got.code, m.code);
      EXPECT_EQ(got.param, m.param);
      EXPECT_EQ(got.message, m.message);
    }
    {
      const Reject m{g.bytes(60)};
      Reject got;
      ASSERT_TRUE(decode(encode(m), &got).is_ok()) << seed;
      EXPECT_EQ(got.reason, m.reason);
    }
  }
}

TEST(ClientMessagesTest, DecodeMessageDispatchesOnType) {
  const std::vector<std::string> frames = sample_frames();
  for (size_t i = 0; i < frames.size(); ++i) {
    StatusOr<Message> m = decode_message(frames[i]);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    EXPECT_EQ(m->index(), i);  // the variant's order is the type numbering
  }
  Delta d;
  Status st = decode(frames[0], &d);  // a Submit is not a Delta
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("expected a Delta message, got Submit"), std::string::npos) << st.message();
}

TEST(ClientMessagesTest, LayoutIsLittleEndianAndDocumented) {
  // docs/api.md: header magic "TSCP", version 3, type, body length; Abort = u64 id.
  const std::string f = encode(Abort{0x0102030405060708ULL});
  ASSERT_EQ(f.size(), kHeaderBytes + 8);
  EXPECT_EQ(f.substr(0, 4), "TSCP");
  EXPECT_EQ(f[4], 3);
  EXPECT_EQ(f[5], 0);
  EXPECT_EQ(f[6], 2);  // Abort
  EXPECT_EQ(f[8], 8);  // body length
  EXPECT_EQ(static_cast<unsigned char>(f[12]), 0x08);
  EXPECT_EQ(static_cast<unsigned char>(f[19]), 0x01);

  Submit s;
  s.id = 5;
  s.kind = RequestKind::kChat;
  s.api_key = "k";
  s.request_json = "{}";
  const std::string sf = encode(s);
  // id (8) + kind (1) + api_key (4 + 1) + request_json (4 + 2)
  ASSERT_EQ(sf.size(), kHeaderBytes + 20);
  EXPECT_EQ(sf[kHeaderBytes + 8], 2);
  EXPECT_EQ(sf.substr(kHeaderBytes + 13, 1), "k");
  EXPECT_EQ(sf.substr(kHeaderBytes + 18), "{}");
}

TEST(ClientMessagesTest, EveryTruncationIsRejected) {
  for (const std::string& frame : sample_frames()) {
    for (size_t len = 0; len < frame.size(); ++len) {
      std::string cut = frame.substr(0, len);
      StatusOr<Message> m = decode_message(cut);
      EXPECT_FALSE(m.is_ok()) << "prefix of " << len << " bytes decoded";
      // Also with a header that claims the shorter body (a truncated field, not a length lie).
      if (len >= kHeaderBytes) {
        const uint32_t body = static_cast<uint32_t>(len - kHeaderBytes);
        std::memcpy(cut.data() + 8, &body, 4);
        StatusOr<Message> m2 = decode_message(cut);
        if (len < frame.size()) {
          EXPECT_FALSE(m2.is_ok()) << "truncated body of " << body << " bytes decoded";
          if (!m2.is_ok()) { EXPECT_EQ(m2.status().code(), StatusCode::kDataLoss) << m2.status().message(); }
        }
      }
    }
  }
}

TEST(ClientMessagesTest, TrailingBytesAreRejected) {
  for (std::string frame : sample_frames()) {
    frame += "xy";
    const uint32_t body = static_cast<uint32_t>(frame.size() - kHeaderBytes);
    std::memcpy(frame.data() + 8, &body, 4);
    StatusOr<Message> m = decode_message(frame);
    ASSERT_FALSE(m.is_ok());
    EXPECT_NE(m.status().message().find("trailing"), std::string::npos) << m.status().message();
  }
}

TEST(ClientMessagesTest, GarbledInputNeverCrashes) {
  std::mt19937 rng(1);
  const std::vector<std::string> frames = sample_frames();
  for (int iter = 0; iter < 20000; ++iter) {
    std::string f = frames[rng() % frames.size()];
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) f[rng() % f.size()] = static_cast<char>(rng());
    StatusOr<Message> m = decode_message(f);  // either decodes or errors; ASan checks the rest
    (void)m;
    (void)peek_request_id(f);
  }
  for (int iter = 0; iter < 2000; ++iter) {  // pure noise, any length
    std::string f(rng() % 64, '\0');
    for (char& c : f) c = static_cast<char>(rng());
    EXPECT_FALSE(decode_message(f).is_ok());
  }
}

TEST(ClientMessagesTest, HugeCountsAndLengthsAreRejectedWithoutAllocating) {
  // A Delta claiming 2^32-1 tokens, a Final claiming 2^32-1 choices, a Submit whose JSON
  // claims 4 GB: each carried in a tiny frame.
  Delta d;
  d.id = 1;
  std::string f = encode(d);
  const size_t count_at = kHeaderBytes + 8 + 4 + 4 + 4;  // id, index, empty text, empty reasoning
  const uint32_t huge = 0xffffffffu;
  std::memcpy(f.data() + count_at, &huge, 4);
  Status st = decode(f, &d);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("tokens.count"), std::string::npos) << st.message();

  Final fin;
  std::string ff = encode(fin);
  std::memcpy(ff.data() + kHeaderBytes + 12, &huge, 4);
  EXPECT_EQ(decode(ff, &fin).code(), StatusCode::kDataLoss);

  Submit s;
  s.id = 9;
  std::string sf = encode(s);
  std::memcpy(sf.data() + kHeaderBytes + 13, &huge, 4);  // request_json length
  st = decode(sf, &s);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("request_json"), std::string::npos) << st.message();
  EXPECT_EQ(peek_request_id(sf).value_or(0), 9u);  // the id is still known for the error
}

TEST(ClientMessagesTest, WrongVersionMagicTypeAndKindAreRejected) {
  std::string f = encode(Abort{3});
  f[4] = 4;  // version 4
  Abort a;
  Status st = decode(f, &a);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("version 4 is not supported (this build speaks version 3)"), std::string::npos)
      << st.message();
  StatusOr<Header> h = decode_header(f);
  ASSERT_TRUE(h.is_ok());  // so the server can answer with a Reject
  EXPECT_EQ(h->version, 4);
  EXPECT_FALSE(peek_request_id(f).has_value());
  EXPECT_FALSE(decode_message(f).is_ok());

  // A Reject decodes whatever its version, and a future version's unknown type still has a
  // readable header.
  std::string r = encode(Reject{"old client"});
  r[4] = 9;
  Reject rj;
  ASSERT_TRUE(decode(r, &rj).is_ok());
  EXPECT_EQ(rj.reason, "old client");
  ASSERT_TRUE(decode_message(r).is_ok());
  std::string future = encode(Abort{3});
  future[4] = 4;
  future[6] = 77;
  EXPECT_TRUE(decode_header(future).is_ok());
  EXPECT_EQ(decode_message(future).status().code(), StatusCode::kUnimplemented);

  std::string bad_magic = encode(Abort{3});
  bad_magic[0] = 'X';
  EXPECT_EQ(decode(bad_magic, &a).code(), StatusCode::kDataLoss);
  EXPECT_FALSE(peek_request_id(bad_magic).has_value());

  std::string bad_type = encode(Abort{3});
  bad_type[6] = 99;
  st = decode_header(bad_type).status();
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("unknown client message type 99"), std::string::npos);

  std::string length_lie = encode(Abort{3});
  length_lie[8] = 9;
  EXPECT_EQ(decode(length_lie, &a).code(), StatusCode::kDataLoss);

  Submit s;
  s.id = 4;
  std::string sf = encode(s);
  sf[kHeaderBytes + 8] = 4;  // kind must be 1, 2 or 3
  st = decode(sf, &s);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("'kind'"), std::string::npos) << st.message();
  EXPECT_EQ(peek_request_id(sf).value_or(0), 4u);
}

}  // namespace
}  // namespace tessera::wire::client
