// dequantize_ggml: (1) blocks built here from the formats' definitions (and a few written out
// byte by byte), so that a mistake in element order or bit packing shows as a wrong element;
// (2) every tensor of llama.cpp's own quantized files against the float32 file they were all
// made from, each block's error held to that block's own step; (3) the errors.
#include "common/gguf/ggml_dequant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/gguf/ggml_dequant_blocks.h"
#include "common/gguf/gguf_file.h"
#include "tests/test_support.h"

// A named namespace (not an anonymous one): tests/common is a unity build, and these helper
// names would clash with other test files' anonymous helpers in the same compiler run.
namespace tessera::ggml_dequant_test {

uint32_t id(GgmlType type) { return static_cast<uint32_t>(type); }

void put_half(std::vector<uint8_t>& bytes, size_t at, float value) {
  const uint16_t h = f32_to_f16(value);
  bytes[at] = static_cast<uint8_t>(h & 0xff);
  bytes[at + 1] = static_cast<uint8_t>(h >> 8);
}

float read_half(const uint8_t* p) { return f16_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8))); }

// Decodes `bytes` from an odd address (no decoder may rely on alignment) and expects `want`
// exactly: every value below is a small integer times a power-of-two-ish half, exact in f32.
void expect_decodes(GgmlType type, const std::vector<uint8_t>& bytes, const std::vector<float>& want) {
  std::vector<uint8_t> shifted(bytes.size() + 1);
  std::memcpy(shifted.data() + 1, bytes.data(), bytes.size());
  std::vector<float> got(want.size(), std::nanf(""));
  const Status st = dequantize_ggml(id(type), shifted.data() + 1, static_cast<int64_t>(want.size()), got.data());
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  int wrong = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (wrong++ < 8) {
      ADD_FAILURE() << ggml_type_name(id(type)) << " element " << i << ": got " << got[i] << ", want " << want[i];
    }
  }
  EXPECT_EQ(wrong, 0) << ggml_type_name(id(type)) << ": elements decoded wrong";
}

// ---- Encoders written from the formats' definitions (byte offsets spelled out, not taken
// from the structs the decoder uses).

// q4_0 / q4_1 / q5_*: byte j of the 16 holds element j (low nibble) and j + 16 (high).
void put_nibbles(std::vector<uint8_t>& out, size_t at, const std::array<int, 32>& q) {
  for (int j = 0; j < 16; ++j) out[at + j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
}
// q5_*: bit 4 of element i is bit i of a little-endian uint32.
void put_fifth_bits(std::vector<uint8_t>& out, size_t at, const std::array<int, 32>& q) {
  uint32_t qh = 0;
  for (int i = 0; i < 32; ++i) qh |= static_cast<uint32_t>((q[i] >> 4) & 1) << i;
  for (int b = 0; b < 4; ++b) out[at + b] = static_cast<uint8_t>(qh >> (8 * b));
}

std::vector<uint8_t> encode_q4_0(float d, const std::array<int, 32>& q) {
  std::vector<uint8_t> out(18);
  put_half(out, 0, d);
  put_nibbles(out, 2, q);
  return out;
}
std::vector<uint8_t> encode_q4_1(float d, float m, const std::array<int, 32>& q) {
  std::vector<uint8_t> out(20);
  put_half(out, 0, d);
  put_half(out, 2, m);
  put_nibbles(out, 4, q);
  return out;
}
std::vector<uint8_t> encode_q5_0(float d, const std::array<int, 32>& q) {
  std::vector<uint8_t> out(22);
  put_half(out, 0, d);
  put_fifth_bits(out, 2, q);
  put_nibbles(out, 6, q);
  return out;
}
std::vector<uint8_t> encode_q5_1(float d, float m, const std::array<int, 32>& q) {
  std::vector<uint8_t> out(24);
  put_half(out, 0, d);
  put_half(out, 2, m);
  put_fifth_bits(out, 4, q);
  put_nibbles(out, 8, q);
  return out;
}
std::vector<uint8_t> encode_q8_0(float d, const std::array<int, 32>& q) {
  std::vector<uint8_t> out(34);
  put_half(out, 0, d);
  for (int i = 0; i < 32; ++i) out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q[i]));
  return out;
}

// The 12 bytes of 6-bit scales and mins of q4_K / q5_K: sub-blocks 0..3 whole in bytes s
// (scale) and s + 4 (min); 4..7 split into a low nibble pair in byte s + 4 (scale low, min
// high) and their top 2 bits in the top bits of bytes s - 4 (scale) and s (min).
std::array<uint8_t, 12> pack_k_scales(const std::array<int, 8>& sc, const std::array<int, 8>& mn) {
  std::array<uint8_t, 12> p{};
  for (int s = 0; s < 4; ++s) {
    p[s] = static_cast<uint8_t>(sc[s] | ((sc[s + 4] >> 4) << 6));
    p[s + 4] = static_cast<uint8_t>(mn[s] | ((mn[s + 4] >> 4) << 6));
    p[s + 8] = static_cast<uint8_t>((sc[s + 4] & 15) | ((mn[s + 4] & 15) << 4));
  }
  return p;
}
// The inverse, for the fixture test's per-sub-block steps.
void unpack_k_scales(const uint8_t* p, std::array<int, 8>& sc, std::array<int, 8>& mn) {
  for (int s = 0; s < 4; ++s) {
    sc[s] = p[s] & 63;
    mn[s] = p[s + 4] & 63;
    sc[s + 4] = (p[s + 8] & 15) | ((p[s] >> 6) << 4);
    mn[s + 4] = (p[s + 8] >> 4) | ((p[s + 4] >> 6) << 4);
  }
}

// q4_K (q5_K with `fifth_bits`): element 32s + l of sub-block s sits in byte 32(s/2) + l of
// qs, in its low nibble for even s and its high nibble for odd s; q5_K's bit 4 of it is bit
// s of qh[l].
std::vector<uint8_t> encode_k(bool fifth_bits, float d, float dmin, const std::array<int, 8>& sc,
                              const std::array<int, 8>& mn, const std::vector<int>& q) {
  const size_t qs_at = fifth_bits ? 48 : 16;
  std::vector<uint8_t> out(fifth_bits ? 176 : 144);
  put_half(out, 0, d);
  put_half(out, 2, dmin);
  const auto packed = pack_k_scales(sc, mn);
  std::copy(packed.begin(), packed.end(), out.begin() + 4);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32, l = e % 32;
    out[qs_at + 32 * (s / 2) + l] |= static_cast<uint8_t>((q[e] & 15) << (4 * (s % 2)));
    if (fifth_bits) out[16 + l] |= static_cast<uint8_t>(((q[e] >> 4) & 1) << s);
  }
  return out;
}

// q6_K: ql at 0, qh at 128, int8 scales at 192, d at 208. Each half h of 128 elements: element
// 32k + l takes its low 4 bits from ql[64h + l + 32(k % 2)] (low nibble for k < 2, high for
// k >= 2) and its top 2 bits from bits 2k, 2k + 1 of qh[32h + l].
std::vector<uint8_t> encode_q6_k(float d, const std::array<int, 16>& sc, const std::vector<int>& q) {
  std::vector<uint8_t> out(210);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    out[64 * h + l + 32 * (k % 2)] |= static_cast<uint8_t>((q[e] & 15) << (4 * (k / 2)));
    out[128 + 32 * h + l] |= static_cast<uint8_t>((q[e] >> 4) << (2 * k));
  }
  for (int g = 0; g < 16; ++g) out[192 + g] = static_cast<uint8_t>(static_cast<int8_t>(sc[g]));
  put_half(out, 208, d);
  return out;
}

void append(std::vector<uint8_t>& a, const std::vector<uint8_t>& b) { a.insert(a.end(), b.begin(), b.end()); }

std::array<int, 32> pattern32(int mul, int add, int mod) {
  std::array<int, 32> q{};
  for (int i = 0; i < 32; ++i) q[i] = (i * mul + add) % mod;
  return q;
}
std::vector<int> pattern256(int mul, int add, int mod) {
  std::vector<int> q(256);
  for (int i = 0; i < 256; ++i) q[i] = (i * mul + add + i / 32) % mod;
  return q;
}

// ---- (1) hand-built blocks

TEST(GgmlDequantBlocks, FloatTypes) {
  const std::vector<float> want = {1.5f, -2.25f, 0.f, 65504.f, -6.103515625e-05f, 3.0f};
  std::vector<uint8_t> f32(want.size() * 4), f16(want.size() * 2), bf16(want.size() * 2);
  std::memcpy(f32.data(), want.data(), f32.size());
  for (size_t i = 0; i < want.size(); ++i) {
    put_half(f16, 2 * i, want[i]);
    const uint16_t b = f32_to_bf16(want[i]);
    bf16[2 * i] = static_cast<uint8_t>(b & 0xff);
    bf16[2 * i + 1] = static_cast<uint8_t>(b >> 8);
  }
  expect_decodes(GgmlType::kF32, f32, want);
  expect_decodes(GgmlType::kF16, f16, want);
  std::vector<float> want_bf16(want.size());
  for (size_t i = 0; i < want.size(); ++i) want_bf16[i] = bf16_to_f32(f32_to_bf16(want[i]));
  expect_decodes(GgmlType::kBF16, bf16, want_bf16);
}

TEST(GgmlDequantBlocks, Q4_0LowNibblesFirstThenHigh) {
  // Two blocks (the second 18 bytes in, unaligned): q = 0..15 in the low nibbles and
  // 15..0 in the high ones, then another pattern with a negative scale.
  std::array<int, 32> q1{};
  for (int j = 0; j < 16; ++j) q1[j] = j, q1[j + 16] = 15 - j;
  const auto q2 = pattern32(7, 3, 16);
  std::vector<uint8_t> bytes = encode_q4_0(0.5f, q1);
  append(bytes, encode_q4_0(-0.375f, q2));
  std::vector<float> want;
  for (int i = 0; i < 32; ++i) want.push_back(static_cast<float>(q1[i] - 8) * 0.5f);
  for (int i = 0; i < 32; ++i) want.push_back(static_cast<float>(q2[i] - 8) * -0.375f);
  expect_decodes(GgmlType::kQ4_0, bytes, want);

  // Written out: d = 1 (0x3c00); byte 0 = 0xf0 puts 0 in element 0 and 15 in element 16; the
  // other bytes 0x88 are zeros.
  std::vector<uint8_t> literal(18, 0x88);
  literal[0] = 0x00, literal[1] = 0x3c, literal[2] = 0xf0;
  std::vector<float> want_literal(32, 0.f);
  want_literal[0] = -8.f, want_literal[16] = 7.f;
  expect_decodes(GgmlType::kQ4_0, literal, want_literal);
}

TEST(GgmlDequantBlocks, Q4_1AddsTheMin) {
  const auto q1 = pattern32(5, 1, 16), q2 = pattern32(11, 7, 16);
  std::vector<uint8_t> bytes = encode_q4_1(0.25f, -1.5f, q1);
  append(bytes, encode_q4_1(0.125f, 2.0f, q2));
  std::vector<float> want;
  for (int i = 0; i < 32; ++i) want.push_back(static_cast<float>(q1[i]) * 0.25f - 1.5f);
  for (int i = 0; i < 32; ++i) want.push_back(static_cast<float>(q2[i]) * 0.125f + 2.0f);
  expect_decodes(GgmlType::kQ4_1, bytes, want);
}

TEST(GgmlDequantBlocks, Q5FifthBitsInChosenPositions) {
  // 5-bit patterns whose bit 4 is set in both halves of the block at irregular positions.
  const auto q1 = pattern32(7, 3, 32), q2 = pattern32(13, 30, 32);
  std::vector<uint8_t> b0 = encode_q5_0(0.5f, q1);
  append(b0, encode_q5_0(-0.25f, q2));
  std::vector<float> w0;
  for (int i = 0; i < 32; ++i) w0.push_back(static_cast<float>(q1[i] - 16) * 0.5f);
  for (int i = 0; i < 32; ++i) w0.push_back(static_cast<float>(q2[i] - 16) * -0.25f);
  expect_decodes(GgmlType::kQ5_0, b0, w0);

  std::vector<uint8_t> b1 = encode_q5_1(0.25f, -3.0f, q1);
  append(b1, encode_q5_1(0.0625f, 1.0f, q2));
  std::vector<float> w1;
  for (int i = 0; i < 32; ++i) w1.push_back(static_cast<float>(q1[i]) * 0.25f - 3.0f);
  for (int i = 0; i < 32; ++i) w1.push_back(static_cast<float>(q2[i]) * 0.0625f + 1.0f);
  expect_decodes(GgmlType::kQ5_1, b1, w1);

  // Written out: d = 1, qh bytes 01 00 01 80 (bits 0, 16 and 31), nibbles all zero: elements
  // 0, 16 and 31 are 16 - 16 = 0, the rest -16.
  std::vector<uint8_t> literal(22, 0);
  literal[1] = 0x3c, literal[2] = 0x01, literal[4] = 0x01, literal[5] = 0x80;
  std::vector<float> want_literal(32, -16.f);
  want_literal[0] = want_literal[16] = want_literal[31] = 0.f;
  expect_decodes(GgmlType::kQ5_0, literal, want_literal);
}

TEST(GgmlDequantBlocks, Q8_0SignedBytes) {
  std::array<int, 32> q1{}, q2{};
  for (int i = 0; i < 32; ++i) q1[i] = (i * 37) % 256 - 128, q2[i] = 127 - 8 * i;
  std::vector<uint8_t> bytes = encode_q8_0(0.125f, q1);
  append(bytes, encode_q8_0(-0.5f, q2));
  std::vector<float> want;
  for (int i = 0; i < 32; ++i) want.push_back(static_cast<float>(q1[i]) * 0.125f);
  for (int i = 0; i < 32; ++i) want.push_back(static_cast<float>(q2[i]) * -0.5f);
  expect_decodes(GgmlType::kQ8_0, bytes, want);
}

// Scales and mins distinct in all 8 sub-blocks, the top 2 bits of sub-blocks 4..7 taking
// every value 0..3 for both, so each byte and bit field of the packing is exercised.
const std::array<int, 8> kKScales = {1, 17, 33, 63, 5, 22, 47, 60};
const std::array<int, 8> kKMins = {63, 2, 40, 19, 58, 9, 30, 44};
const std::array<int, 8> kKScales2 = {62, 3, 28, 50, 36, 12, 63, 19};
const std::array<int, 8> kKMins2 = {7, 55, 16, 33, 21, 49, 0, 63};

std::vector<float> k_expected(float d, float dmin, const std::array<int, 8>& sc, const std::array<int, 8>& mn,
                              const std::vector<int>& q) {
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32;
    want[e] = d * static_cast<float>(sc[s]) * static_cast<float>(q[e]) - dmin * static_cast<float>(mn[s]);
  }
  return want;
}

TEST(GgmlDequantBlocks, Q4_KEverySubBlockScaleAndMin) {
  const auto q1 = pattern256(5, 0, 16), q2 = pattern256(3, 7, 16);
  std::vector<uint8_t> bytes = encode_k(false, 0.5f, 0.25f, kKScales, kKMins, q1);
  append(bytes, encode_k(false, 0.375f, 0.125f, kKScales2, kKMins2, q2));
  std::vector<float> want = k_expected(0.5f, 0.25f, kKScales, kKMins, q1);
  const auto want2 = k_expected(0.375f, 0.125f, kKScales2, kKMins2, q2);
  want.insert(want.end(), want2.begin(), want2.end());
  expect_decodes(GgmlType::kQ4_K, bytes, want);

  // Written out: d = dmin = 1, every q = 1 (bytes 0x11). Scale bytes all zero but byte 0 =
  // 0xc0 (top bits of sub-block 4's scale: 3) and byte 8 = 0x21 (its low nibble 1, its min's
  // 2): sub-block 4 is 49 * 1 - 2 = 47, sub-block 0 keeps scale 0 (0xc0 & 63), the rest 0.
  std::vector<uint8_t> literal(144, 0x11);
  literal[0] = 0x00, literal[1] = 0x3c, literal[2] = 0x00, literal[3] = 0x3c;
  std::fill(literal.begin() + 4, literal.begin() + 16, 0);
  literal[4] = 0xc0, literal[12] = 0x21;
  std::vector<float> want_literal(256, 0.f);
  std::fill(want_literal.begin() + 128, want_literal.begin() + 160, 47.f);
  expect_decodes(GgmlType::kQ4_K, literal, want_literal);
}

TEST(GgmlDequantBlocks, Q5_KFifthBitPerSubBlock) {
  const auto q1 = pattern256(7, 3, 32), q2 = pattern256(11, 20, 32);
  std::vector<uint8_t> bytes = encode_k(true, 0.5f, 0.25f, kKScales, kKMins, q1);
  append(bytes, encode_k(true, 0.375f, 0.125f, kKScales2, kKMins2, q2));
  std::vector<float> want = k_expected(0.5f, 0.25f, kKScales, kKMins, q1);
  const auto want2 = k_expected(0.375f, 0.125f, kKScales2, kKMins2, q2);
  want.insert(want.end(), want2.begin(), want2.end());
  expect_decodes(GgmlType::kQ5_K, bytes, want);
}

TEST(GgmlDequantBlocks, Q6_KSixteenGroupScales) {
  const std::array<int, 16> sc1 = {-20, 7, 13, -3, 31, -64, 5, 127, -128, 9, -1, 22, 45, -17, 3, 60};
  const std::array<int, 16> sc2 = {1, 2, 3, 4, 5, 6, 7, 8, -8, -7, -6, -5, -4, -3, -2, -1};
  const auto q1 = pattern256(11, 3, 64), q2 = pattern256(29, 50, 64);
  std::vector<uint8_t> bytes = encode_q6_k(0.25f, sc1, q1);
  append(bytes, encode_q6_k(-0.375f, sc2, q2));
  std::vector<float> want;
  for (int e = 0; e < 256; ++e) want.push_back(0.25f * static_cast<float>(sc1[e / 16] * (q1[e] - 32)));
  for (int e = 0; e < 256; ++e) want.push_back(-0.375f * static_cast<float>(sc2[e / 16] * (q2[e] - 32)));
  expect_decodes(GgmlType::kQ6_K, bytes, want);

  // Written out: d = 1 at byte 208, scales 1 but group 6 (elements 96..111) 2, all 6-bit q
  // zero (-32) except element 96: high nibble of ql[32] = 15 and bits 6-7 of qh[0] = 3, so
  // q = 63 - 32 = 31.
  std::vector<uint8_t> literal(210, 0);
  std::fill(literal.begin() + 192, literal.begin() + 208, 1);
  literal[192 + 6] = 2;
  literal[209] = 0x3c;
  literal[32] = 0xf0;
  literal[128] = 0xc0;
  std::vector<float> want_literal(256, -32.f);
  std::fill(want_literal.begin() + 96, want_literal.begin() + 112, -64.f);
  want_literal[96] = 62.f;
  expect_decodes(GgmlType::kQ6_K, literal, want_literal);
}

TEST(GgmlDequantBlocks, LayoutsAgreeWithTheTypeTable) {
  const std::vector<std::pair<GgmlType, size_t>> sizes = {
      {GgmlType::kQ4_0, sizeof(BlockQ4_0)}, {GgmlType::kQ4_1, sizeof(BlockQ4_1)}, {GgmlType::kQ5_0, sizeof(BlockQ5_0)},
      {GgmlType::kQ5_1, sizeof(BlockQ5_1)}, {GgmlType::kQ8_0, sizeof(BlockQ8_0)}, {GgmlType::kQ4_K, sizeof(BlockQ4_K)},
      {GgmlType::kQ5_K, sizeof(BlockQ5_K)}, {GgmlType::kQ6_K, sizeof(BlockQ6_K)}};
  for (const auto& [type, size] : sizes) {
    const GgmlTypeTraits* traits = ggml_type_traits(id(type));
    ASSERT_NE(traits, nullptr);
    EXPECT_EQ(traits->block_bytes, static_cast<int64_t>(size)) << traits->name;
    EXPECT_TRUE(ggml_type_dequantizable(id(type))) << traits->name;
  }
  int decodable = 0;
  for (uint32_t t = 0; t < 64; ++t) decodable += ggml_type_dequantizable(t) ? 1 : 0;
  EXPECT_EQ(decodable, 11);  // the 8 block types and f32, f16, bf16
}

// ---- (2) llama.cpp's own files: every tensor of gguf-llama-<T>.gguf against the same
// tensor of gguf-llama-F32.gguf, from which llama-quantize made them all (fixtures README
// section 11). The converter permutes attn_q / attn_k rows the same way in every file, so
// this compares like with like.

// Elements that share one quantization step: a legacy block, a K-quant sub-block, or (for
// the float types) one element, whose "step" is its unit in the last place.
struct DequantStepRun {
  int64_t first;
  int64_t count;
  double step;
};

// Appends the step runs of the block of `type` at `block`, whose elements start at `first`.
void append_step_runs(uint32_t type, const uint8_t* block, int64_t first, std::vector<DequantStepRun>& runs) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
      runs.push_back({first, 32, std::fabs(read_half(block))});
      return;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      std::array<int, 8> sc{}, mn{};
      unpack_k_scales(block + 4, sc, mn);
      const double d = read_half(block);
      for (int s = 0; s < 8; ++s) runs.push_back({first + 32 * s, 32, std::fabs(d * sc[s])});
      return;
    }
    case GgmlType::kQ6_K:
      for (int g = 0; g < 16; ++g) {
        const int8_t sc = static_cast<int8_t>(block[192 + g]);
        runs.push_back({first + 16 * g, 16, std::fabs(read_half(block + 208) * static_cast<double>(sc))});
      }
      return;
    default:
      ADD_FAILURE() << "no step rule for " << ggml_type_name(type);
  }
}

struct DequantErrorStats {
  int tensors = 0;
  int64_t elements = 0;
  double err2 = 0, ref2 = 0;
  double worst_ratio = 0;      // max over step runs of max |error| / step
  int64_t zero_step_runs = 0;  // runs with step 0 whose error is not 0 (never bounded by a step)

  double rel_rms() const { return ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0; }
  void merge(const DequantErrorStats& o) {
    tensors += o.tensors, elements += o.elements, err2 += o.err2, ref2 += o.ref2;
    worst_ratio = std::max(worst_ratio, o.worst_ratio), zero_step_runs += o.zero_step_runs;
  }
};

void accumulate_errors(const GgufTensor& t, const std::vector<float>& want, const std::vector<float>& got,
                       DequantErrorStats& stats) {
  const int64_t n = static_cast<int64_t>(want.size());
  stats.tensors += 1;
  stats.elements += n;
  for (int64_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(got[i]) - want[i];
    stats.err2 += e * e;
    stats.ref2 += static_cast<double>(want[i]) * want[i];
  }
  std::vector<DequantStepRun> runs;
  const GgmlTypeTraits* traits = ggml_type_traits(t.type);
  if (traits->block_elems == 1) {
    // Round to nearest: |error| <= half an ulp, and an ulp is at most |x| * 2^-mantissa_bits
    // (2^-24 below f16's normal range). f32 has step 0: its copy must be exact.
    const double rel = t.type == id(GgmlType::kF16) ? 0x1p-10 : t.type == id(GgmlType::kBF16) ? 0x1p-7 : 0.0;
    const double floor = t.type == id(GgmlType::kF16) ? 0x1p-24 : 0.0;
    for (int64_t i = 0; i < n; ++i) {
      runs.push_back({i, 1, rel == 0 ? 0.0 : std::max(std::fabs(want[i]) * rel, floor)});
    }
  } else {
    for (int64_t b = 0; b < n / traits->block_elems; ++b) {
      append_step_runs(t.type, t.data + b * traits->block_bytes, b * traits->block_elems, runs);
    }
  }
  for (const DequantStepRun& run : runs) {
    double worst = 0;
    for (int64_t i = run.first; i < run.first + run.count; ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
    }
    if (run.step > 0) {
      stats.worst_ratio = std::max(stats.worst_ratio, worst / run.step);
    } else if (worst > 0) {
      stats.zero_step_runs += 1;
    }
  }
}

std::string describe(const DequantErrorStats& s) {
  std::ostringstream os;
  os << std::setw(3) << s.tensors << " tensors " << std::setw(8) << s.elements << " elements, rel RMS "
     << std::fixed << std::setprecision(3) << 100 * s.rel_rms() << "%, max |err| / step "
     << std::setprecision(4) << s.worst_ratio;
  if (s.zero_step_runs > 0) os << ", " << s.zero_step_runs << " zero-step runs with error";
  return os.str();
}

// Per stored type: the relative RMS error over all its tensors, and the worst element error
// of any run as a fraction of that run's own step. Measured on these files (rel RMS, worst
// ratio) in the comments; the bounds leave ~15-20% headroom on the RMS. The RMS follows
// from the step: uniform rounding error has RMS step / sqrt(12), and the step is amax / 127
// (q8_0), amax / 8 (q4_0), amax / 16 (q5_0) with amax ~ 2.4 sigma over 32 of these weights:
// 0.55%, 8.7%, 4.3% predicted against 0.536%, 8.60%, 4.27% measured.
struct DequantBound {
  double rel_rms;
  double step_ratio;
};
const std::map<std::string, DequantBound>& dequant_bounds() {
  static const std::map<std::string, DequantBound> bounds = {
      // Exact copies (the norms, stored f32 in every file): 0, 0.
      {"f32", {0.0, 0.0}},
      // Round to nearest: at most half an ulp (0.4995, 0.4980 measured). Relative RMS about
      // 2^-10 / sqrt(12) / 1.5 ~ 1.9e-4 for f16 (0.021% measured), 8x that for bf16 (0.166%).
      {"f16", {0.00025, 0.5}},
      {"bf16", {0.0020, 0.5}},
      // q8_0: d = amax / 127, but q was rounded with d in f32 and the block stores d rounded
      // to f16: |err| <= d/2 + 127 |d - f16(d)| <= (1/2 + 127 * 2^-11) d = 0.562 d.
      // Measured 0.536%, 0.5538.
      {"q8_0", {0.0065, 0.5 + 127 * 0x1p-11}},
      // q4_0 / q5_0: d = -max / 8 (/ 16); the element of the other sign at amax needs q = +8
      // (+16), one past the clamp at 7 (15): up to one whole step, plus 16 |d - f16(d)|.
      // Measured 8.60%, 1.0023 (q4_0) and 4.27%, 1.0047 (q5_0).
      {"q4_0", {0.10, 1.0 + 16 * 0x1p-11}},
      {"q5_0", {0.050, 1.0 + 16 * 0x1p-11}},
      // q4_1: d = (max - min) / 15, m = min, no clamping: half a step plus the f16 rounding of
      // d (15 steps of it, 0.007) and of m (|m| ~ 7.5 steps, 0.004). Measured 7.83%, 0.5079.
      {"q4_1", {0.090, 0.5 + 23 * 0x1p-11}},
      // K-quants: llama-quantize searches each sub-block's scale and min by weighted least
      // squares and rounds them to 6 bits (8 for q6_K), so extreme elements may clamp by more
      // than half a step; no closed-form bound, so measured: q4_K 7.14%, 1.064; q5_K 3.61%,
      // 1.396; q6_K 1.77%, 0.9992 (the output matrix of the q4/q5 files is q6_K too).
      {"q4_K", {0.085, 1.2}},
      {"q5_K", {0.043, 1.6}},
      {"q6_K", {0.021, 1.1}},
  };
  return bounds;
}

TEST(GgmlDequantFixtures, LlamaCppQuantizedFilesMatchTheirFloat32Source) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::fixtures_dir() + "/gguf/";
  auto source = GgufFile::open(dir + "gguf-llama-F32.gguf");
  ASSERT_TRUE(source.is_ok()) << source.status().to_string();
  std::map<std::string, DequantErrorStats> by_type;
  for (const std::string variant : {"F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K_M", "Q5_K_M", "Q6_K"}) {
    auto file = GgufFile::open(dir + "gguf-llama-" + variant + ".gguf");
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    ASSERT_EQ((*file)->tensors().size(), (*source)->tensors().size()) << variant;
    std::map<std::string, DequantErrorStats> in_file;
    for (const GgufTensor& t : (*file)->tensors()) {
      const GgufTensor* ref = (*source)->find_tensor(t.name);
      ASSERT_NE(ref, nullptr) << variant << ": " << t.name << " is not in the F32 file";
      ASSERT_EQ(ref->dims, t.dims) << variant << ": " << t.name;
      ASSERT_EQ(ref->type, id(GgmlType::kF32)) << t.name;
      const int64_t n = t.numel();
      std::vector<float> want(n), got(n);
      ASSERT_TRUE(dequantize_ggml(ref->type, ref->data, n, want.data()).is_ok());
      const Status st = dequantize_ggml(t.type, t.data, n, got.data());
      ASSERT_TRUE(st.is_ok()) << variant << ": " << t.name << ": " << st.to_string();
      accumulate_errors(t, want, got, in_file[ggml_type_name(t.type)]);
    }
    for (const auto& [type, stats] : in_file) {
      std::cout << "[ REPORT   ] gguf-llama-" << std::left << std::setw(7) << variant << std::right << std::setw(5)
                << type << ": " << describe(stats) << "\n";
      by_type[type].merge(stats);
    }
  }
  for (const auto& [type, stats] : by_type) {
    std::cout << "[ REPORT   ] all files " << std::setw(5) << type << ": " << describe(stats) << "\n";
    const auto bound = dequant_bounds().find(type);
    if (bound == dequant_bounds().end()) {
      ADD_FAILURE() << type << " has no error bound";
      continue;
    }
    EXPECT_LE(stats.rel_rms(), bound->second.rel_rms) << type;
    EXPECT_LE(stats.worst_ratio, bound->second.step_ratio) << type;
    EXPECT_EQ(stats.zero_step_runs, 0) << type;
  }
}

// ---- (3) errors

TEST(GgmlDequantErrors, UnsupportedTypesAreUnimplementedByName) {
  std::vector<uint8_t> bytes(1024, 0);
  std::vector<float> out(256);
  for (const auto& [type, name] : std::vector<std::pair<uint32_t, std::string>>{
           {id(GgmlType::kQ2_K), "q2_K"}, {id(GgmlType::kIQ2_XXS), "iq2_xxs"}, {id(GgmlType::kQ8_1), "q8_1"},
           {id(GgmlType::kI32), "i32"}, {77, "type 77"}}) {
    const Status st = dequantize_ggml(type, bytes.data(), 256, out.data());
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << name << ": " << st.to_string();
    EXPECT_NE(st.message().find(name), std::string::npos) << st.message();
    EXPECT_FALSE(ggml_type_dequantizable(type)) << name;
  }
}

TEST(GgmlDequantErrors, PartialBlocksAreInvalidArgument) {
  std::vector<uint8_t> bytes(1024, 0);
  std::vector<float> out(512);
  for (const auto& [type, n] : std::vector<std::pair<GgmlType, int64_t>>{
           {GgmlType::kQ4_0, 33}, {GgmlType::kQ8_0, 16}, {GgmlType::kQ4_K, 128}, {GgmlType::kQ6_K, 288},
           {GgmlType::kQ5_0, -32}}) {
    const Status st = dequantize_ggml(id(type), bytes.data(), n, out.data());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << ggml_type_name(id(type)) << " n=" << n;
    EXPECT_NE(st.message().find(ggml_type_name(id(type))), std::string::npos) << st.message();
  }
  EXPECT_TRUE(dequantize_ggml(id(GgmlType::kQ4_K), bytes.data(), 0, out.data()).is_ok());
  EXPECT_TRUE(dequantize_ggml(id(GgmlType::kF16), bytes.data(), 7, out.data()).is_ok());
}

}  // namespace tessera::ggml_dequant_test
