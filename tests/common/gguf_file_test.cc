// GgufFile: the fixtures llama.cpp wrote (metadata, shapes and types as section 11 of the
// fixtures README describes them), files written here byte by byte with every value type and
// read back, every kind of corrupt file refused with one line naming the file (every prefix of
// a valid file too, each read from an allocation of exactly its size so an over-read is an
// AddressSanitizer report), the typed reads, and split models.
#include "common/gguf/gguf_file.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>

#include "tests/common/gguf_test_writer.h"
#include "tests/test_support.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::gguf_array;
using testing::gguf_le;
using testing::gguf_str;
using testing::GgufTestWriter;

// A small valid file: a few keys and two tensors.
GgufTestWriter gguf_small_writer() {
  GgufTestWriter w;
  w.kv_string("general.architecture", "llama");
  w.kv_u32("llama.block_count", 2);
  w.kv("tokenizer.ggml.tokens", GgufValueType::kArray,
       gguf_array(GgufValueType::kString, 2, gguf_str("<s>") + gguf_str("hi")));
  w.tensor("a.weight", {4, 3}, GgmlType::kF32);
  w.tensor("b.weight", {64, 2}, GgmlType::kQ8_0);
  return w;
}

// Parses `bytes` from an allocation of exactly their size (so AddressSanitizer sees any read
// past them); OK when they were accepted.
Status gguf_parse_exact(const std::string& bytes) {
  auto copy = std::make_unique<uint8_t[]>(std::max<size_t>(bytes.size(), 1));
  std::memcpy(copy.get(), bytes.data(), bytes.size());
  auto file = GgufFile::parse(copy.get(), bytes.size(), "m.gguf");
  return file.is_ok() ? Status::ok() : file.status();
}

// Refused with one line that starts with the file name and contains `part`.
void gguf_expect_error(const std::string& bytes, const std::string& part, StatusCode code = StatusCode::kDataLoss) {
  const Status st = gguf_parse_exact(bytes);
  ASSERT_FALSE(st.is_ok()) << "accepted a file that should have been refused (" << part << ")";
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_EQ(st.message().rfind("m.gguf: ", 0), 0u) << st.message();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(part), std::string::npos) << "expected '" << part << "' in: " << st.message();
}

// ---- the fixtures llama.cpp wrote ----

std::vector<std::string> gguf_fixture_files() {
  std::vector<std::string> files;
  const std::string dir = testing::fixtures_dir() + "/gguf";
  if (testing::fixtures_dir().empty() || !fs::is_directory(dir)) return files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".gguf") files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

// The type llama-quantize gives blk.0.attn_q.weight for each file-name suffix.
const std::map<std::string, GgmlType> kGgufAttnQType = {
    {"F32", GgmlType::kF32},   {"F16", GgmlType::kF16},   {"BF16", GgmlType::kBF16},     {"Q8_0", GgmlType::kQ8_0},
    {"Q4_0", GgmlType::kQ4_0}, {"Q4_1", GgmlType::kQ4_1}, {"Q5_0", GgmlType::kQ5_0},     {"Q4_K_M", GgmlType::kQ4_K},
    {"Q5_K_M", GgmlType::kQ5_K}, {"Q6_K", GgmlType::kQ6_K},
};

TEST(GgufFixturesTest, EveryFixtureOpensWithItsShapesAndTypes) {
  TESSERA_REQUIRE_FIXTURES();
  const std::vector<std::string> files = gguf_fixture_files();
  ASSERT_GE(files.size(), 15u) << "expected the 15 GGUF fixtures of README section 11";
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    auto opened = GgufFile::open(path);
    ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
    const GgufFile& f = *opened.value();
    const std::string stem = fs::path(path).stem().string();
    const std::string family = stem.substr(0, stem.find('-', stem.find('-') + 1));  // gguf-llama, kjv-llama
    const std::string quant = stem.substr(family.size() + 1);
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.alignment(), 32u);
    auto arch = f.get_string("general.architecture");
    ASSERT_TRUE(arch.is_ok()) << arch.status().to_string();
    EXPECT_EQ(arch.value(), family == "gguf-qwen2" ? "qwen2" : "llama");
    auto blocks = f.get_uint(arch.value() + ".block_count");
    ASSERT_TRUE(blocks.is_ok()) << blocks.status().to_string();
    const int64_t hidden = family == "kjv-llama" ? 192 : 256;  // kjv-llama: 6 layers of 192
    EXPECT_EQ(blocks.value(), family == "kjv-llama" ? 6u : 2u);
    EXPECT_EQ(f.get_uint(arch.value() + ".embedding_length").value(), static_cast<uint64_t>(hidden));

    const GgufTensor* embd = f.find_tensor("token_embd.weight");
    ASSERT_NE(embd, nullptr);
    EXPECT_EQ(embd->dims, (std::vector<int64_t>{hidden, 1024}));
    EXPECT_EQ(embd->file, path);
    const GgufTensor* q = f.find_tensor("blk.0.attn_q.weight");
    ASSERT_NE(q, nullptr);
    ASSERT_TRUE(kGgufAttnQType.count(quant)) << quant;
    EXPECT_EQ(ggml_type_name(q->type), ggml_type_name(static_cast<uint32_t>(kGgufAttnQType.at(quant))));
    EXPECT_EQ(q->numel(), hidden * hidden);

    if (family == "gguf-llama") {
      EXPECT_EQ(f.get_uint("llama.attention.head_count").value(), 4u);
      EXPECT_EQ(f.get_uint("llama.attention.head_count_kv").value(), 2u);
      EXPECT_EQ(f.get_uint("llama.feed_forward_length").value(), 512u);
      EXPECT_EQ(f.get_float("llama.rope.freq_base").value(), 10000.0);
      EXPECT_EQ(f.tensors().size(), 21u);
    }
    if (family == "gguf-qwen2") {
      const GgufTensor* bias = f.find_tensor("blk.0.attn_q.bias");
      ASSERT_NE(bias, nullptr);
      EXPECT_EQ(bias->type, static_cast<uint32_t>(GgmlType::kF32));
      EXPECT_EQ(f.find_tensor("output.weight"), nullptr);  // tied to token_embd
    }
    auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    ASSERT_TRUE(tokens.is_ok()) << tokens.status().to_string();
    EXPECT_EQ(tokens.value().size(), 1024u);
    EXPECT_EQ(tokens.value()[1], "<s>");
    if (family == "kjv-llama") {
      EXPECT_EQ(f.get_uint("llama.vocab_size").value(), tokens.value().size());
      auto tmpl = f.get_string("tokenizer.chat_template");
      ASSERT_TRUE(tmpl.is_ok()) << tmpl.status().to_string();
      EXPECT_NE(tmpl.value().find("messages"), std::string::npos);
      EXPECT_EQ(f.get_float_array("tokenizer.ggml.scores").value().size(), 1024u);
      EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type").value().size(), 1024u);
      EXPECT_TRUE(f.get_bool("tokenizer.ggml.add_bos_token").value());
    }

    // Every tensor: its size from its type, inside the file, no two overlapping, and the f32
    // norm weights readable as finite numbers.
    std::vector<std::pair<const uint8_t*, size_t>> spans;
    for (const GgufTensor& t : f.tensors()) {
      const GgmlTypeTraits* traits = ggml_type_traits(t.type);
      ASSERT_NE(traits, nullptr) << t.name;
      EXPECT_EQ(static_cast<int64_t>(t.nbytes), t.numel() / traits->block_elems * traits->block_bytes) << t.name;
      spans.emplace_back(t.data, t.nbytes);
      if (t.name.find("norm.weight") != std::string::npos && t.type == static_cast<uint32_t>(GgmlType::kF32)) {
        std::vector<float> w(static_cast<size_t>(t.numel()));
        std::memcpy(w.data(), t.data, t.nbytes);
        for (float x : w) ASSERT_TRUE(std::isfinite(x)) << t.name;
      }
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].first + spans[i - 1].second, spans[i].first);
    const auto extent = spans.back().first + spans.back().second - spans.front().first;
    EXPECT_LE(static_cast<uintmax_t>(extent), fs::file_size(path));
  }
}

TEST(GgufFixturesTest, MissingFileIsNotFound) {
  auto f = GgufFile::open("/nonexistent/m.gguf");
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find("/nonexistent/m.gguf"), std::string::npos);
}

// ---- files written here ----

TEST(GgufFileTest, EveryValueTypeAndTensorsRoundTrip) {
  GgufTestWriter w;
  w.kv("u8", GgufValueType::kU8, gguf_le<uint8_t>(200));
  w.kv("i8", GgufValueType::kI8, gguf_le<int8_t>(-100));
  w.kv("u16", GgufValueType::kU16, gguf_le<uint16_t>(60000));
  w.kv("i16", GgufValueType::kI16, gguf_le<int16_t>(-30000));
  w.kv("u32", GgufValueType::kU32, gguf_le<uint32_t>(4000000000u));
  w.kv("i32", GgufValueType::kI32, gguf_le<int32_t>(-2000000000));
  w.kv("f32", GgufValueType::kF32, gguf_le<float>(0.25f));
  w.kv("bool", GgufValueType::kBool, gguf_le<uint8_t>(1));
  w.kv("string", GgufValueType::kString, gguf_str("h\xc3\xa9llo"));
  w.kv("u64", GgufValueType::kU64, gguf_le<uint64_t>(18000000000000000000ull));
  w.kv("i64", GgufValueType::kI64, gguf_le<int64_t>(-9000000000000000000ll));
  w.kv("f64", GgufValueType::kF64, gguf_le<double>(-1.5e300));
  w.kv("ints", GgufValueType::kArray,
       gguf_array(GgufValueType::kI32, 3, gguf_le<int32_t>(1) + gguf_le<int32_t>(-2) + gguf_le<int32_t>(3)));
  w.kv("strings", GgufValueType::kArray, gguf_array(GgufValueType::kString, 2, gguf_str("a") + gguf_str("")));
  w.kv("floats", GgufValueType::kArray, gguf_array(GgufValueType::kF32, 2, gguf_le(1.5f) + gguf_le(-2.0f)));
  w.kv("nested", GgufValueType::kArray,  // [[7, 8], []] of u16
       gguf_array(GgufValueType::kArray, 2,
                  gguf_array(GgufValueType::kU16, 2, gguf_le<uint16_t>(7) + gguf_le<uint16_t>(8)) +
                      gguf_array(GgufValueType::kU16, 0, "")));
  w.tensor("a.weight", {4, 3}, GgmlType::kF32);
  w.tensor("b.weight", {64, 2, 1}, GgmlType::kQ8_0);
  w.tensor("c.weight", {256}, GgmlType::kQ4_K);
  const std::string bytes = w.build();
  auto parsed = GgufFile::parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "rt.gguf");
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  const GgufFile& f = *parsed.value();

  EXPECT_EQ(f.path(), "rt.gguf");
  EXPECT_EQ(f.version(), 3u);
  ASSERT_EQ(f.metadata().size(), 16u);
  EXPECT_EQ(f.metadata()[0].first, "u8");  // file order
  EXPECT_EQ(f.metadata()[15].first, "nested");
  EXPECT_EQ(f.find("u8")->type, GgufValueType::kU8);
  EXPECT_EQ(f.get_uint("u8").value(), 200u);
  EXPECT_EQ(f.get_int("i8").value(), -100);
  EXPECT_EQ(f.get_uint("u16").value(), 60000u);
  EXPECT_EQ(f.get_int("i16").value(), -30000);
  EXPECT_EQ(f.get_uint("u32").value(), 4000000000u);
  EXPECT_EQ(f.get_int("u32").value(), 4000000000);
  EXPECT_EQ(f.get_int("i32").value(), -2000000000);
  EXPECT_EQ(f.get_float("f32").value(), 0.25);
  EXPECT_EQ(f.find("f32")->type, GgufValueType::kF32);
  EXPECT_TRUE(f.get_bool("bool").value());
  EXPECT_EQ(f.get_string("string").value(), "h\xc3\xa9llo");
  EXPECT_EQ(f.get_uint("u64").value(), 18000000000000000000ull);
  EXPECT_EQ(f.get_int("i64").value(), -9000000000000000000ll);
  EXPECT_EQ(f.get_float("f64").value(), -1.5e300);
  EXPECT_EQ(f.get_int_array("ints").value(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.get_string_array("strings").value(), (std::vector<std::string>{"a", ""}));
  EXPECT_EQ(f.get_float_array("floats").value(), (std::vector<float>{1.5f, -2.0f}));
  const GgufValue* nested = f.find("nested");
  ASSERT_NE(nested, nullptr);
  const auto& outer = std::get<GgufArray>(nested->value);
  EXPECT_EQ(outer.element_type, GgufValueType::kArray);
  ASSERT_EQ(outer.items.size(), 2u);
  const auto& first = std::get<GgufArray>(outer.items[0].value);
  EXPECT_EQ(first.element_type, GgufValueType::kU16);
  ASSERT_EQ(first.items.size(), 2u);
  EXPECT_EQ(std::get<uint64_t>(first.items[1].value), 8u);
  EXPECT_TRUE(std::get<GgufArray>(outer.items[1].value).items.empty());

  ASSERT_EQ(f.tensors().size(), 3u);
  const std::vector<uint64_t> offsets = w.offsets();
  const size_t data_start = bytes.size() - offsets[2] - 144;  // c.weight ends the file
  EXPECT_EQ(data_start % 32, 0u);
  const size_t expect_bytes[] = {48, 4 * 34, 144};
  for (size_t i = 0; i < 3; ++i) {
    const GgufTensor& t = f.tensors()[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.file, "rt.gguf");
    EXPECT_EQ(t.nbytes, expect_bytes[i]);
    EXPECT_EQ(t.data, reinterpret_cast<const uint8_t*>(bytes.data()) + data_start + offsets[i]);
    EXPECT_EQ(t.data[0], GgufTestWriter::data_byte(i, 0));
    EXPECT_EQ(t.data[t.nbytes - 1], GgufTestWriter::data_byte(i, t.nbytes - 1));
  }
  EXPECT_EQ(f.find_tensor("b.weight")->dims, (std::vector<int64_t>{64, 2, 1}));
  EXPECT_EQ(f.find_tensor("b.weight")->numel(), 128);
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  EXPECT_FALSE(f.has("nope"));
}

TEST(GgufFileTest, AlignmentKeyPlacesTheDataAndVersion2IsRead) {
  GgufTestWriter w = gguf_small_writer();
  w.version = 2;
  w.alignment = 64;
  w.kv_u32("general.alignment", 64);
  const std::string bytes = w.build();
  auto parsed = GgufFile::parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "a.gguf");
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed.value()->version(), 2u);
  EXPECT_EQ(parsed.value()->alignment(), 64u);
  const GgufTensor& b = parsed.value()->tensors()[1];
  EXPECT_EQ((b.data - reinterpret_cast<const uint8_t*>(bytes.data())) % 64, 0);
  EXPECT_EQ(b.data[0], GgufTestWriter::data_byte(1, 0));

  GgufTestWriter empty;  // metadata only: no data section at all
  empty.kv_string("general.name", "x");
  const std::string header_only = empty.build();
  EXPECT_TRUE(gguf_parse_exact(header_only).is_ok());
}

TEST(GgufFileTest, TypeTablesNameEveryType) {
  EXPECT_STREQ(ggml_type_traits(static_cast<uint32_t>(GgmlType::kQ4_K))->name, "q4_K");
  EXPECT_EQ(ggml_type_traits(static_cast<uint32_t>(GgmlType::kQ6_K))->block_bytes, 210);
  EXPECT_EQ(ggml_type_traits(static_cast<uint32_t>(GgmlType::kMXFP4))->block_bytes, 17);
  EXPECT_EQ(ggml_type_traits(static_cast<uint32_t>(GgmlType::kTQ1_0))->block_elems, 256);
  for (uint32_t removed : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 77u})
    EXPECT_EQ(ggml_type_traits(removed), nullptr) << removed;
  EXPECT_EQ(ggml_type_name(77), "type 77");
  EXPECT_EQ(ggml_type_name(30), "bf16");
  int known = 0;
  for (uint32_t id = 0; id < 64; ++id) known += ggml_type_traits(id) != nullptr;
  EXPECT_EQ(known, 32);
  EXPECT_STREQ(gguf_value_type_name(GgufValueType::kArray), "array");
  EXPECT_STREQ(gguf_value_type_name(GgufValueType::kF64), "f64");
}

// ---- corrupt files ----

TEST(GgufCorruptionTest, EveryPrefixOfAValidFileIsRefused) {
  const std::string bytes = gguf_small_writer().build();
  ASSERT_TRUE(gguf_parse_exact(bytes).is_ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    SCOPED_TRACE("prefix of " + std::to_string(n) + " bytes");
    const Status st = gguf_parse_exact(bytes.substr(0, n));
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.message().rfind("m.gguf: ", 0), 0u) << st.message();
  }
}

TEST(GgufCorruptionTest, HeaderProblems) {
  GgufTestWriter w = gguf_small_writer();
  w.magic = "GGUG";
  gguf_expect_error(w.build(), "not a GGUF file", StatusCode::kInvalidArgument);
  w = gguf_small_writer();
  w.version = 1;
  gguf_expect_error(w.build(), "GGUF version 1 is not supported", StatusCode::kUnimplemented);
  w.version = 4;
  gguf_expect_error(w.build(), "GGUF version 4 is not supported", StatusCode::kUnimplemented);
  w.version = 0x03000000;
  gguf_expect_error(w.build(), "big-endian", StatusCode::kUnimplemented);
  w = gguf_small_writer();
  w.kv_count = 1ull << 60;
  gguf_expect_error(w.build(), "claims 1152921504606846976 metadata keys");
  w = gguf_small_writer();
  w.tensor_count = 1000;
  gguf_expect_error(w.build(), "claims 1000 tensors");
  gguf_expect_error("GG", "truncated reading the header at byte 4 of 2");
}

TEST(GgufCorruptionTest, MetadataProblems) {
  GgufTestWriter w = gguf_small_writer();
  w.kv("s", GgufValueType::kString, gguf_le<uint64_t>(1ull << 40) + "abc");
  gguf_expect_error(w.build(), "string of 1099511627776 bytes");
  w = gguf_small_writer();
  w.kvs.push_back(gguf_le<uint64_t>(~0ull) + "key");  // the key itself
  gguf_expect_error(w.build(), "longer than the");
  w = gguf_small_writer();
  w.kv("arr", GgufValueType::kArray, gguf_array(GgufValueType::kU32, 1ull << 62, "1234"));
  gguf_expect_error(w.build(), "array of 4611686018427387904 u32 items");
  w = gguf_small_writer();
  w.kv("arr", GgufValueType::kArray, gguf_array(GgufValueType::kString, 1000, gguf_str("x")));
  gguf_expect_error(w.build(), "needs at least 8 bytes each");
  w = gguf_small_writer();
  w.kv("weird", static_cast<GgufValueType>(13), gguf_le<uint32_t>(0));
  gguf_expect_error(w.build(), "'weird'): value type 13, which GGUF does not define");
  w = gguf_small_writer();
  w.kv("arr", GgufValueType::kArray, gguf_array(static_cast<GgufValueType>(99), 0, ""));
  gguf_expect_error(w.build(), "array element type 99");
  w = gguf_small_writer();
  w.kv_u32("llama.block_count", 3);
  gguf_expect_error(w.build(), "duplicate key 'llama.block_count'");
  w = gguf_small_writer();
  w.kv("bad\nkey", GgufValueType::kU32, gguf_le<uint32_t>(1));
  w.kv("bad\nkey", GgufValueType::kU32, gguf_le<uint32_t>(1));
  gguf_expect_error(w.build(), "'bad\\x0akey'");  // escaped: still one line

  std::string deep = gguf_array(GgufValueType::kU8, 0, "");
  for (int i = 0; i < 20; ++i) deep = gguf_array(GgufValueType::kArray, 1, deep);
  w = gguf_small_writer();
  w.kv("deep", GgufValueType::kArray, deep);
  gguf_expect_error(w.build(), "nested more than 16 deep");
}

TEST(GgufCorruptionTest, AlignmentProblems) {
  for (uint32_t bad : {0u, 48u}) {
    GgufTestWriter w = gguf_small_writer();
    w.kv_u32("general.alignment", bad);
    gguf_expect_error(w.build(), "general.alignment is " + std::to_string(bad) + ", not a power of two");
  }
  GgufTestWriter w = gguf_small_writer();
  w.kv("general.alignment", GgufValueType::kU64, gguf_le<uint64_t>(32));
  gguf_expect_error(w.build(), "general.alignment has type u64, not u32");
}

TEST(GgufCorruptionTest, TensorTableProblems) {
  GgufTestWriter w = gguf_small_writer();
  w.tensors[1].type = 77;
  gguf_expect_error(w.build(), "tensor 'b.weight' has type 77, which ggml does not define", StatusCode::kUnimplemented);
  w = gguf_small_writer();
  w.tensors[0].type = 4;  // q4_2, removed from ggml
  gguf_expect_error(w.build(), "has type 4,", StatusCode::kUnimplemented);
  w = gguf_small_writer();
  w.tensors[0].dims = {4, 3, 1, 1, 1};
  gguf_expect_error(w.build(), "tensor 'a.weight' has 5 dimensions");
  w = gguf_small_writer();
  w.tensors[0].dims = {};
  gguf_expect_error(w.build(), "has 0 dimensions");
  w = gguf_small_writer();
  w.tensors[0].dims = {4, 0};
  gguf_expect_error(w.build(), "dimension 1 of size 0");
  w = gguf_small_writer();
  w.tensors[0].dims = {4, 1ull << 63};
  gguf_expect_error(w.build(), "dimension 1 of size 9223372036854775808");
  w = gguf_small_writer();
  w.tensors[0].dims = {1ull << 32, 1ull << 32};
  gguf_expect_error(w.build(), "element count overflows");
  w = gguf_small_writer();
  w.tensors[1].dims = {48, 2};
  gguf_expect_error(w.build(), "the first, 48, is not a multiple of the q8_0 block of 32 elements");
  w = gguf_small_writer();
  w.tensors[1].offset = 8;
  gguf_expect_error(w.build(), "tensor 'b.weight' has offset 8, not a multiple of the alignment 32");
  w = gguf_small_writer();
  w.tensors[1].offset = 1024;
  gguf_expect_error(w.build(), "tensor 'b.weight' (136 bytes at offset 1024");
  w = gguf_small_writer();
  w.tensors[1].offset = ~0ull - 31;
  gguf_expect_error(w.build(), "past the end of the file");
  w = gguf_small_writer();
  w.tensors[1].dims = {64, 3};  // 34 bytes more than the file holds
  gguf_expect_error(w.build().substr(0, gguf_small_writer().build().size()), "past the end of the file");
  w = gguf_small_writer();
  w.tensors[1].name = "a.weight";
  gguf_expect_error(w.build(), "duplicate tensor name 'a.weight'");
  w = gguf_small_writer();
  w.tensors[1].name = std::string(1ull << 10, 'x');
  w.tensors[1].type = 77;
  gguf_expect_error(w.build(), "'xxxx", StatusCode::kUnimplemented);  // a long name is cut in the message
  const Status st = gguf_parse_exact(w.build());
  EXPECT_LT(st.message().size(), 300u) << st.message();
}

// ---- typed reads ----

class GgufGettersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GgufTestWriter w;
    w.kv_u32("n", 7);
    w.kv("neg", GgufValueType::kI32, gguf_le<int32_t>(-5));
    w.kv("big", GgufValueType::kU64, gguf_le<uint64_t>(~0ull));
    w.kv_string("s", "text");
    w.kv("flag", GgufValueType::kBool, gguf_le<uint8_t>(0));
    w.kv("u32s", GgufValueType::kArray, gguf_array(GgufValueType::kU32, 1, gguf_le<uint32_t>(1)));
    w.kv("negs", GgufValueType::kArray, gguf_array(GgufValueType::kI8, 2, gguf_le<int8_t>(-1) + gguf_le<int8_t>(2)));
    w.kv("huge", GgufValueType::kArray, gguf_array(GgufValueType::kF64, 1, gguf_le<double>(1e300)));
    bytes_ = w.build();
    auto parsed = GgufFile::parse(reinterpret_cast<const uint8_t*>(bytes_.data()), bytes_.size(), "g.gguf");
    ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
    file_ = std::move(parsed).value();
  }
  static void expect(const Status& st, StatusCode code, const std::vector<std::string>& parts) {
    EXPECT_EQ(st.code(), code) << st.to_string();
    EXPECT_EQ(st.message().rfind("g.gguf: ", 0), 0u) << st.message();
    for (const std::string& p : parts)
      EXPECT_NE(st.message().find(p), std::string::npos) << p << " in " << st.message();
  }
  std::string bytes_;
  std::unique_ptr<GgufFile> file_;
};

TEST_F(GgufGettersTest, WrongTypesNameKeyAndStoredType) {
  expect(file_->get_string("n").status(), StatusCode::kInvalidArgument, {"'n'", "has type u32, not string"});
  expect(file_->get_uint("s").status(), StatusCode::kInvalidArgument, {"'s'", "has type string"});
  expect(file_->get_float("n").status(), StatusCode::kInvalidArgument, {"'n'", "u32"});
  expect(file_->get_bool("s").status(), StatusCode::kInvalidArgument, {"'s'", "string, not bool"});
  expect(file_->get_string_array("u32s").status(), StatusCode::kInvalidArgument, {"'u32s'", "array of u32"});
  expect(file_->get_float_array("s").status(), StatusCode::kInvalidArgument, {"'s'", "string"});
  EXPECT_EQ(file_->get_int_array("u32s").value(), (std::vector<int64_t>{1}));
  EXPECT_EQ(file_->get_int_array("negs").value(), (std::vector<int64_t>{-1, 2}));
  EXPECT_FALSE(file_->get_bool("flag").value());
}

TEST_F(GgufGettersTest, IntegersOutOfRangeAreRefused) {
  expect(file_->get_uint("neg").status(), StatusCode::kInvalidArgument, {"'neg'", "-5", "not an unsigned value"});
  EXPECT_EQ(file_->get_int("neg").value(), -5);
  expect(file_->get_int("big").status(), StatusCode::kInvalidArgument, {"'big'", "18446744073709551615"});
  EXPECT_EQ(file_->get_uint("big").value(), ~0ull);
  expect(file_->get_float_array("huge").status(), StatusCode::kInvalidArgument, {"'huge' item 0", "range of f32"});
}

TEST_F(GgufGettersTest, MissingKeyIsNotFound) {
  expect(file_->get_uint("absent").status(), StatusCode::kNotFound, {"no metadata key 'absent'"});
  expect(file_->get_string_array("absent").status(), StatusCode::kNotFound, {"'absent'"});
  EXPECT_EQ(file_->find("absent"), nullptr);
}

// ---- split models ----

class GgufSplitTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::make_temp_dir("gguf_split_test"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string part_path(int index, int count = 2) const {
    char name[64];
    std::snprintf(name, sizeof name, "/m-%05d-of-%05d.gguf", index, count);
    return dir_ + name;
  }
  // Part `no` (0-based) of `count`, holding the named f32 tensors.
  static GgufTestWriter part(uint16_t no, uint16_t count, const std::vector<std::string>& tensors) {
    GgufTestWriter w;
    if (no == 0) w.kv_string("general.name", "first");
    w.kv("split.no", GgufValueType::kU16, gguf_le(no));
    w.kv("split.count", GgufValueType::kU16, gguf_le(count));
    w.kv("split.tensors.count", GgufValueType::kI32, gguf_le<int32_t>(3));
    for (const std::string& name : tensors) w.tensor(name, {8, 2}, GgmlType::kF32);
    return w;
  }
  void write_parts() {
    testing::write_file(part_path(1), part(0, 2, {"a", "b"}).build());
    testing::write_file(part_path(2), part(1, 2, {"c"}).build());
  }
  std::string dir_;
};

TEST_F(GgufSplitTest, PartsAreJoinedIntoOneTable) {
  write_parts();
  auto opened = GgufFile::open(part_path(1));
  ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
  const GgufFile& f = *opened.value();
  EXPECT_EQ(f.path(), part_path(1));
  EXPECT_EQ(f.get_string("general.name").value(), "first");
  EXPECT_EQ(f.get_uint("split.no").value(), 0u);  // the first part's metadata
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.find_tensor("a")->file, part_path(1));
  const GgufTensor* c = f.find_tensor("c");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->file, part_path(2));
  EXPECT_EQ(c->nbytes, 64u);
  EXPECT_EQ(c->data[0], GgufTestWriter::data_byte(0, 0));  // the first tensor of its own part
  EXPECT_EQ(c->data[63], GgufTestWriter::data_byte(0, 63));
  EXPECT_EQ(f.find_tensor("b")->data[0], GgufTestWriter::data_byte(1, 0));
}

TEST_F(GgufSplitTest, MissingOrInconsistentPartsAreRefused) {
  testing::write_file(part_path(1), part(0, 2, {"a", "b"}).build());
  auto missing = GgufFile::open(part_path(1));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message().rfind(part_path(2) + ": no such file", 0), 0u) << missing.status().message();

  testing::write_file(part_path(2), part(0, 2, {"c"}).build());
  auto wrong_no = GgufFile::open(part_path(1));
  ASSERT_FALSE(wrong_no.is_ok());
  EXPECT_NE(wrong_no.status().message().find("split.no is 0, but the file name makes it part 2 of 2"),
            std::string::npos) << wrong_no.status().message();

  testing::write_file(part_path(2), part(1, 2, {"a"}).build());
  auto duplicate = GgufFile::open(part_path(1));
  ASSERT_FALSE(duplicate.is_ok());
  EXPECT_NE(duplicate.status().message().find("tensor 'a' is also in an earlier part"), std::string::npos)
      << duplicate.status().message();

  write_parts();
  auto second = GgufFile::open(part_path(2));
  ASSERT_FALSE(second.is_ok());
  EXPECT_NE(second.status().message().find("open its first part, " + part_path(1)), std::string::npos)
      << second.status().message();

  const std::string renamed = dir_ + "/renamed.gguf";
  testing::write_file(renamed, part(0, 2, {"a", "b"}).build());
  auto unnamed = GgufFile::open(renamed);
  ASSERT_FALSE(unnamed.is_ok());
  EXPECT_NE(unnamed.status().message().find("does not end in -00001-of-00002.gguf"), std::string::npos)
      << unnamed.status().message();
}

TEST_F(GgufSplitTest, AOneFileModelIsReadFromDisk) {
  const std::string path = dir_ + "/one.gguf";
  testing::write_file(path, gguf_small_writer().build());
  auto opened = GgufFile::open(path);
  ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
  EXPECT_EQ(opened.value()->tensors().size(), 2u);
  EXPECT_EQ(opened.value()->tensors()[1].file, path);
  EXPECT_EQ(opened.value()->tensors()[1].data[135], GgufTestWriter::data_byte(1, 135));
}

}  // namespace
}  // namespace tessera
