// Which streamed units may be read from the checkpoint file itself (worker/checkpoint_backing.h),
// on real safetensors files written by Tessera's writer and opened as a checkpoint: matrices
// borrowed from the file's mapping qualify (8 bytes off 64 too), with the page range covering
// them; a matrix copied at load, one whose elements lie off their own size (unless read a row
// at a time), one in another file, or a unit spread over a range much larger than its tensors
// do not; and the resident tensors left in such a file get copies of their own.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "common/checkpoint.h"
#include "common/safetensors_writer.h"
#include "tests/test_support.h"
#include "worker/checkpoint_backing.h"
#include "worker/weight_residency.h"
#include "worker/weight_spill.h"

namespace tessera {
namespace {

struct Named {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kF32;  // or kBF16: 2 bytes an element
};

// A folder with config.json and model.safetensors holding `tensors` in that order (each f32
// element its index; a bf16 tensor holds the first bytes of such floats), opened as a checkpoint.
std::unique_ptr<Checkpoint> checkpoint_of(const std::vector<Named>& tensors) {
  const std::string dir = testing::make_temp_dir("tessera-ckpt-backing");
  testing::write_file(dir + "/config.json", "{}");
  std::vector<std::vector<float>> data;
  std::vector<std::pair<std::string, TensorView>> views;
  for (const Named& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    data.emplace_back(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) data.back()[static_cast<size_t>(i)] = static_cast<float>(i);
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    views.emplace_back(tensors[i].name, TensorView(data[i].data(), tensors[i].dtype, tensors[i].shape));
  EXPECT_TRUE(write_safetensors(dir + "/model.safetensors", views).is_ok());
  auto ckpt = Checkpoint::open(dir);
  EXPECT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  return ckpt.is_ok() ? std::move(ckpt).value() : nullptr;
}

Tensor borrowed(const Checkpoint& c, const std::string& name) {
  auto t = c.load(name, DType::kF32);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  return t.is_ok() ? std::move(t).value() : Tensor();
}

TEST(CheckpointBacking, MatricesBorrowedOnSixtyFourBytesLieInTheFile) {
  // 1024 + 1024 floats, then a norm of 16 (64 bytes): every tensor on 64 bytes.
  auto c = checkpoint_of({{"a", {32, 32}}, {"b", {32, 32}}, {"norm", {16}}});
  ASSERT_TRUE(c);
  Tensor a = borrowed(*c, "a"), b = borrowed(*c, "b"), norm = borrowed(*c, "norm");
  Tensor converted = Tensor::zeros({16}, DType::kF32);  // a norm copied at load
  auto span = checkpoint_span(*c, {&a, &b, &norm, &converted});
  ASSERT_TRUE(span.has_value());
  const char* base = span->file->whole_mapping().base;
  EXPECT_EQ(span->offset % kSpillPage, 0u);
  EXPECT_EQ(span->span % kSpillPage, 0u);
  // The range covers every tensor of the unit in the file.
  for (const Tensor* t : {&a, &b, &norm}) {
    const auto at = static_cast<size_t>(t->data<const char>() - base);
    EXPECT_GE(at, span->offset);
    EXPECT_LE(at + t->nbytes(), span->offset + span->span);
  }
  EXPECT_EQ(span->outside_bytes, static_cast<int64_t>(converted.nbytes()));
}

TEST(CheckpointBacking, ACopiedOrMisalignedMatrixOrASparseUnitDoesNot) {
  // "odd": 2 floats (8 bytes) puts "m" 8 bytes off 64; "pad" (56 bytes) puts "tail" back on 64.
  auto c = checkpoint_of({{"odd", {2}}, {"m", {32, 32}}, {"big", {512, 512}}, {"pad", {14}}, {"tail", {32, 32}}});
  ASSERT_TRUE(c);
  Tensor m = borrowed(*c, "m"), tail = borrowed(*c, "tail");
  ASSERT_NE(reinterpret_cast<uintptr_t>(m.data<const char>()) % 64, 0u) << "the file did not put m off 64";
  EXPECT_TRUE(checkpoint_span(*c, {&m}).has_value()) << "a matrix 8 bytes off 64 (the kernels load unaligned)";
  EXPECT_TRUE(checkpoint_span(*c, {&m}, /*rows_only=*/true).has_value()) << "a table read a row at a time";
  // One bf16 element (2 bytes) puts the f32 matrix "w" 2 bytes off 4, where C++ cannot read it
  // in place: the loader copies it, so it does not stream from the file.
  auto off = checkpoint_of({{"half", {1}, DType::kBF16}, {"w", {32, 32}}});
  ASSERT_TRUE(off);
  Tensor w = borrowed(*off, "w");
  EXPECT_FALSE(off->files().front()->whole_mapping().holds(w.data<const char>(), w.nbytes()));
  EXPECT_FALSE(checkpoint_span(*off, {&w}).has_value()) << "an f32 matrix stored 2 bytes off 4";
  // m and tail with a megabyte of "big" between them: the range would read it each step.
  EXPECT_FALSE(checkpoint_span(*c, {&tail, &m}, true).has_value());
  Tensor copy = Tensor::zeros({32, 32}, DType::kF32);
  std::memcpy(copy.data<char>(), tail.data<const char>(), tail.nbytes());
  EXPECT_FALSE(checkpoint_span(*c, {&copy}).has_value()) << "a matrix copied at load";
  EXPECT_TRUE(checkpoint_span(*c, {&tail}).has_value());
  // A unit with a matrix from another checkpoint's file.
  auto other = checkpoint_of({{"x", {32, 32}}});
  ASSERT_TRUE(other);
  Tensor x = borrowed(*other, "x");
  EXPECT_FALSE(checkpoint_span(*c, {&tail, &x}).has_value());
}

TEST(CheckpointBacking, ResidentTensorsLeftInTheFileGetCopiesOfTheirOwn) {
  auto c = checkpoint_of({{"embed", {32, 32}}, {"streamed", {32, 32}}, {"resident", {32, 32}}, {"norm", {16}}});
  ASSERT_TRUE(c);
  ModelWeights w;
  w.embed = borrowed(*c, "embed");
  w.final_norm_w = borrowed(*c, "norm");
  w.layers.resize(2);
  w.layers[0].o.w = borrowed(*c, "resident");
  w.layers[1].o.w = borrowed(*c, "streamed");
  const void* streamed = w.layers[1].o.w.view().data;
  const void* table = w.embed.view().data;
  const std::vector<float> want(w.layers[0].o.w.data<const float>(), w.layers[0].o.w.data<const float>() + 1024);
  auto span = checkpoint_span(*c, {&w.layers[1].o.w});
  ASSERT_TRUE(span.has_value());
  const int64_t copied = copy_resident_from_files(w, {span->file.get()}, {&w.layers[1].o.w});
  EXPECT_EQ(copied, 1024 * 4 + 16 * 4);
  EXPECT_EQ(w.layers[1].o.w.view().data, streamed) << "the streamed unit stays in the file";
  EXPECT_EQ(w.embed.view().data, table) << "the table stays in the file (read a row at a time)";
  EXPECT_FALSE(c->file_holding(w.layers[0].o.w.view().data, w.layers[0].o.w.nbytes()));
  EXPECT_FALSE(c->file_holding(w.final_norm_w.view().data, w.final_norm_w.nbytes()));
  EXPECT_EQ(std::vector<float>(w.layers[0].o.w.data<const float>(), w.layers[0].o.w.data<const float>() + 1024), want);
}

// read streams the checkpoint's layers unless the worker's memory group is smaller than the
// checkpoint's files (then the spill file takes them); map and direct, or no limit, keep them.
TEST(CheckpointBacking, ReadTakesTheSpillFileUnderAMemoryLimitSmallerThanTheCheckpoint) {
  const auto ckpt = checkpoint_of({{"w", {256, 256}}});
  ASSERT_NE(ckpt, nullptr);
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(ckpt->files().front()->path()));
  WeightResidencyOptions read;
  read.streaming = WeightStreaming::kRead;
  const CgroupMemory smaller{file_bytes - 1, file_bytes / 2};
  const CgroupMemory larger{file_bytes + 1, file_bytes};
  EXPECT_TRUE(read_streams_from_spill_under_limit(read, *ckpt, smaller));
  EXPECT_FALSE(read_streams_from_spill_under_limit(read, *ckpt, larger));
  EXPECT_FALSE(read_streams_from_spill_under_limit(read, *ckpt, std::nullopt));
  for (WeightStreaming other : {WeightStreaming::kMap, WeightStreaming::kDirect}) {
    WeightResidencyOptions o;
    o.streaming = other;
    EXPECT_FALSE(read_streams_from_spill_under_limit(o, *ckpt, smaller)) << weight_streaming_name(other);
  }
}

}  // namespace
}  // namespace tessera
