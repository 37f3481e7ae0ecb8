// SafetensorsFile (reader) and SafetensorsWriter: round trips, the byte layout the Python
// `safetensors` library expects (checked by hand-parsing the bytes, not with our reader),
// the reference fixtures, and every kind of corrupt file a user might hand us.
#include "common/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/safetensors_writer.h"
#include "tests/test_support.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using ::tessera::testing::make_temp_dir;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir("safetensors_test"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // A file from raw parts: the 8-byte length (`header_len`, or the real length when < 0),
  // the header text and the data bytes.
  std::string raw_file(const std::string& name, const std::string& header, const std::string& data,
                       int64_t header_len = -1) {
    std::string p = path(name);
    std::ofstream out(p, std::ios::binary);
    uint64_t n = header_len < 0 ? header.size() : static_cast<uint64_t>(header_len);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header << data;
    return p;
  }

  std::string dir_;
};


TEST_F(SafetensorsTest, RoundTripKeepsNamesShapesTypesAndBytes) {
  std::vector<float> a(6);
  for (int i = 0; i < 6; ++i) a[i] = 0.5f * i - 1.0f;
  std::vector<uint16_t> b = {f32_to_f16(1.5f), f32_to_f16(-2.0f), f32_to_f16(0.25f)};
  std::vector<uint16_t> c = {f32_to_bf16(3.0f), f32_to_bf16(-0.125f)};
  std::vector<int32_t> d = {7, -9, 11, 13};
  std::string p = path("rt.safetensors");
  ASSERT_TRUE(write_safetensors(p, {{"a", TensorView(a.data(), DType::kF32, {2, 3})},
                                    {"b", TensorView(b.data(), DType::kF16, {3})},
                                    {"c", TensorView(c.data(), DType::kBF16, {1, 2})},
                                    {"d", TensorView(d.data(), DType::kI32, {2, 2})}},
                                {{"format", "pt"}, {"note", "x"}})
                  .is_ok());

  auto f = SafetensorsFile::open(p);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  const auto& file = *f.value();
  EXPECT_EQ(file.path(), p);
  ASSERT_EQ(file.tensors().size(), 4u);
  EXPECT_EQ(file.metadata().value("format", ""), "pt");
  EXPECT_EQ(file.metadata().value("note", ""), "x");

  const TensorInfo* ta = file.find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->dtype, DType::kF32);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta->nbytes, 24u);
  EXPECT_EQ(ta->file, p);
  EXPECT_EQ(std::memcmp(ta->data, a.data(), 24), 0);
  const TensorInfo* tb = file.find("b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->dtype, DType::kF16);
  EXPECT_EQ(tb->stored_dtype, "F16");
  EXPECT_EQ(std::memcmp(tb->data, b.data(), 6), 0);
  const TensorInfo* tc = file.find("c");
  ASSERT_NE(tc, nullptr);
  EXPECT_EQ(tc->dtype, DType::kBF16);
  EXPECT_EQ(std::memcmp(tc->data, c.data(), 4), 0);
  const TensorInfo* td = file.find("d");
  ASSERT_NE(td, nullptr);
  EXPECT_EQ(td->dtype, DType::kI32);
  EXPECT_EQ(std::memcmp(td->data, d.data(), 16), 0);
  EXPECT_EQ(file.find("missing"), nullptr);
}

// The layout the Python library reads, checked from the raw bytes.
TEST_F(SafetensorsTest, WriterProducesTheSpecifiedByteLayout) {
  std::vector<float> a = {1, 2, 3};
  std::vector<uint16_t> b = {1, 2, 3, 4, 5};
  std::string p = path("layout.safetensors");
  ASSERT_TRUE(write_safetensors(p, {{"w.a", TensorView(a.data(), DType::kF32, {3})},
                                    {"w.b", TensorView(b.data(), DType::kBF16, {5, 1})}})
                  .is_ok());
  std::string bytes = ::tessera::testing::read_file(p);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u) << "header must be padded to a multiple of 8 bytes";
  ASSERT_EQ(bytes.size(), 8 + n + 12 + 10) << "no gaps, no trailing bytes";
  std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}') << "padding must be spaces";
  auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  EXPECT_EQ(j["w.a"]["dtype"], "F32");
  EXPECT_EQ(j["w.a"]["shape"], nlohmann::json::array({3}));
  EXPECT_EQ(j["w.a"]["data_offsets"], nlohmann::json::array({0, 12}));
  EXPECT_EQ(j["w.b"]["dtype"], "BF16");
  EXPECT_EQ(j["w.b"]["shape"], nlohmann::json::array({5, 1}));
  EXPECT_EQ(j["w.b"]["data_offsets"], nlohmann::json::array({12, 22}));
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, a.data(), 12), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n + 12, b.data(), 10), 0);
}

TEST_F(SafetensorsTest, StreamingWriterAcceptsChunksAcrossTensorsAndChecksOrder) {
  std::string p = path("stream.safetensors");
  auto w = SafetensorsWriter::create(p, {{"x", DType::kF32, {4}}, {"empty", DType::kF32, {0, 3}},
                                         {"y", DType::kF32, {2}}});
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  auto& writer = *w.value();
  EXPECT_EQ(writer.next_tensor(), "x");
  std::vector<float> all = {1, 2, 3, 4, 5, 6};
  Status wrong = writer.write("y", all.data(), 8);
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("expected 'x'"), std::string::npos) << wrong.message();
  ASSERT_TRUE(writer.append(all.data(), 12).is_ok());  // 3 of x's 4 floats
  Status early = writer.finish();
  EXPECT_EQ(early.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(early.message().find("'x'"), std::string::npos) << early.message();
  ASSERT_TRUE(writer.append(all.data() + 3, 12).is_ok());  // rest of x + all of y
  EXPECT_EQ(writer.append(all.data(), 4).code(), StatusCode::kInvalidArgument);  // too many bytes
  ASSERT_TRUE(writer.finish().is_ok());

  auto f = SafetensorsFile::open(p);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  const TensorInfo* y = f.value()->find("y");
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(static_cast<const float*>(y->data)[0], 5.f);
  EXPECT_EQ(static_cast<const float*>(y->data)[1], 6.f);
  const TensorInfo* e = f.value()->find("empty");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->nbytes, 0u);
  EXPECT_EQ(e->shape, (std::vector<int64_t>{0, 3}));
}

TEST_F(SafetensorsTest, WriterRejectsDuplicateNamesAndWrongSizes) {
  auto dup = SafetensorsWriter::create(path("dup.safetensors"), {{"x", DType::kF32, {1}}, {"x", DType::kF32, {1}}});
  EXPECT_EQ(dup.status().code(), StatusCode::kInvalidArgument);
  auto w = SafetensorsWriter::create(path("size.safetensors"), {{"x", DType::kF32, {2}}});
  ASSERT_TRUE(w.is_ok());
  float v[3] = {0, 0, 0};
  Status s = w.value()->write("x", v, 12);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("needs 8 bytes"), std::string::npos) << s.message();
}

// The fixtures were written by Python tooling, not by our writer.
TEST_F(SafetensorsTest, ReadsReferenceFixture) {
  TESSERA_REQUIRE_FIXTURES();
  auto f = SafetensorsFile::open(::tessera::testing::fixtures_dir() + "/tiny-llama/model.safetensors");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  const auto& file = *f.value();
  // embed + lm_head + norm + 3 layers x (4 attention + 3 mlp + 2 norms)
  EXPECT_EQ(file.tensors().size(), 3u + 3u * 9u);
  const TensorInfo* down = file.find("model.layers.0.mlp.down_proj.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->shape, (std::vector<int64_t>{128, 344}));
  EXPECT_EQ(down->dtype, DType::kF32);
  const TensorInfo* k = file.find("model.layers.2.self_attn.k_proj.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->shape, (std::vector<int64_t>{64, 128}));  // 2 kv heads x head_dim 32
  const TensorInfo* norm = file.find("model.norm.weight");
  ASSERT_NE(norm, nullptr);
  // Norm weights are "around 1" (README): a sanity check that offsets point at the right bytes.
  const float* w = static_cast<const float*>(norm->data);
  double mean = 0;
  for (int i = 0; i < 128; ++i) mean += w[i] / 128.0;
  EXPECT_NEAR(mean, 1.0, 0.3);
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  auto f = SafetensorsFile::open(path("nope.safetensors"));
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find("nope.safetensors"), std::string::npos);
}

TEST_F(SafetensorsTest, FileShorterThanLengthFieldIsDataLoss) {
  std::string p = path("tiny.safetensors");
  ::tessera::testing::write_file(p, "abc");
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find("tiny.safetensors"), std::string::npos);
}

TEST_F(SafetensorsTest, HeaderLengthLargerThanFileIsDataLoss) {
  std::string p = raw_file("hl.safetensors", "{}      ", "", 4096);
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find("header length 4096"), std::string::npos) << f.status().message();
}

TEST_F(SafetensorsTest, DataShorterThanHeaderSaysIsDataLoss) {
  // A real file cut short: the last tensor's bytes are missing.
  std::vector<float> a(64, 1.f);
  std::string p = path("cut.safetensors");
  ASSERT_TRUE(write_safetensors(p, {{"a", TensorView(a.data(), DType::kF32, {64})}}).is_ok());
  fs::resize_file(p, fs::file_size(p) - 10);
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find("'a'"), std::string::npos) << f.status().message();
  EXPECT_NE(f.status().message().find("cut.safetensors"), std::string::npos);
}

TEST_F(SafetensorsTest, OffsetsOutsideFileAreDataLoss) {
  std::string p = raw_file("out.safetensors",
                           R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[1000,1008]}})", std::string(8, '\0'));
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find("'w'"), std::string::npos) << f.status().message();
}

TEST_F(SafetensorsTest, SpanNotMatchingShapeIsDataLoss) {
  std::string p = raw_file("span.safetensors",
                           R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(16, '\0'));
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find("need 12"), std::string::npos) << f.status().message();
}

TEST_F(SafetensorsTest, ReversedOffsetsAndNegativeShapeAreDataLoss) {
  auto rev = SafetensorsFile::open(raw_file(
      "rev.safetensors", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", std::string(8, '\0')));
  EXPECT_EQ(rev.status().code(), StatusCode::kDataLoss);
  auto neg = SafetensorsFile::open(raw_file(
      "neg.safetensors", R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0')));
  EXPECT_EQ(neg.status().code(), StatusCode::kDataLoss);
  // A shape whose byte count overflows 64 bits must not wrap around to a small number.
  auto huge = SafetensorsFile::open(raw_file(
      "huge.safetensors",
      R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", ""));
  EXPECT_EQ(huge.status().code(), StatusCode::kDataLoss);
}

TEST_F(SafetensorsTest, OverlappingTensorsAreRejected) {
  std::string p = raw_file("overlap.safetensors",
                           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                           std::string(12, '\0'));
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find("overlapping"), std::string::npos) << f.status().message();
}

TEST_F(SafetensorsTest, HeaderNotJsonIsDataLoss) {
  auto f = SafetensorsFile::open(raw_file("nj.safetensors", "{\"w\": [1, 2", ""));
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find("not valid JSON"), std::string::npos) << f.status().message();
  auto arr = SafetensorsFile::open(raw_file("arr.safetensors", "[1, 2]  ", ""));
  EXPECT_EQ(arr.status().code(), StatusCode::kDataLoss);
  auto missing = SafetensorsFile::open(raw_file("nodt.safetensors", R"({"w":{"shape":[1],"data_offsets":[0,4]}})",
                                                std::string(4, '\0')));
  EXPECT_EQ(missing.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(missing.status().message().find("dtype"), std::string::npos);
}

TEST_F(SafetensorsTest, UnknownDtypeIsUnimplementedNamingTensorAndType) {
  auto f = SafetensorsFile::open(raw_file(
      "f99.safetensors", R"({"w.q":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')));
  EXPECT_EQ(f.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(f.status().message().find("'w.q'"), std::string::npos) << f.status().message();
  EXPECT_NE(f.status().message().find("F99"), std::string::npos);
}

// Valid safetensors types Tessera cannot compute with are listed (sizes validated) but flagged;
// Checkpoint::load refuses them (tests/common/checkpoint_test.cc).
TEST_F(SafetensorsTest, ForeignDtypesAreListedButFlagged) {
  auto f = SafetensorsFile::open(raw_file("f64.safetensors",
                                          R"({"d":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},)"
                                          R"("m":{"dtype":"BOOL","shape":[3],"data_offsets":[16,19]}})",
                                          std::string(19, '\0')));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  const TensorInfo* d = f.value()->find("d");
  ASSERT_NE(d, nullptr);
  EXPECT_FALSE(d->dtype_supported);
  EXPECT_EQ(d->stored_dtype, "F64");
  EXPECT_EQ(d->nbytes, 16u);
  // F64 with the size of an F32 tensor: the element size is known, so the lie is caught.
  auto lie = SafetensorsFile::open(raw_file(
      "lie.safetensors", R"({"d":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')));
  EXPECT_EQ(lie.status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace tessera
