// PyTorch checkpoints read without Python: files written here byte by byte as torch.save
// writes them (tests/common/torch_file_builder.h) in the zip and legacy formats, checked
// value by value against the storages they were made from (shared storages, offsets,
// transposed and strided views, f16/bf16, nn.Parameter wrappers, zip64), every kind of bad
// file refused with one clear line, the Hugging Face folder and DeepSpeed JSON forms, and
// the fixtures' real torch.save files against the safetensors models they were made from.
#include "common/checkpoint/torch_checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/checkpoint.h"
#include "common/checkpoint/pickle_reader.h"
#include "common/checkpoint/zip_reader.h"
#include "common/safetensors_writer.h"
#include "tests/common/torch_file_builder.h"
#include "tests/test_support.h"
#include "worker/model_checkpoint.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::FakeTensor;
using testing::bytes_of;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// One clear line: the message says what and where, and nothing spills onto more lines.
void expect_one_line(const Status& st, StatusCode code, const std::vector<std::string>& parts) {
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  for (const auto& p : parts) EXPECT_TRUE(contains(st.message(), p)) << "expected '" << p << "' in: " << st.message();
}

class TorchCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_temp_dir("torch_checkpoint_test");
    for (int i = 0; i < 24; ++i) s0_.push_back(0.5f * i - 3.f);
    for (int i = 0; i < 10; ++i) s1_.push_back(f32_to_f16(0.25f * i - 1.f));
    for (int i = 0; i < 4; ++i) s2_.push_back(f32_to_bf16(1.5f * i));
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A fused tensor, a view of two of its rows and three columns, its transpose and a tied
  // copy share storage "0"; an f16 vector; a bf16 nn.Parameter.
  std::vector<FakeTensor> tensors() const {
    return {
        {"a.weight", "0", "FloatStorage", 24, 0, {4, 6}, {6, 1}},
        {"a.view", "0", "FloatStorage", 24, 7, {2, 3}, {6, 1}},
        {"a.t", "0", "FloatStorage", 24, 0, {6, 4}, {1, 6}},
        {"tied", "0", "FloatStorage", 24, 0, {4, 6}, {6, 1}},
        {"b.half", "1", "HalfStorage", 10, 0, {10}, {1}},
        {"p", "2", "BFloat16Storage", 4, 0, {2, 2}, {2, 1}, true},
    };
  }
  std::string zip_bytes() const {
    return testing::torch_zip(testing::state_dict_pickle(tensors()),
                              {{"0", bytes_of(s0_)}, {"1", bytes_of(s1_)}, {"2", bytes_of(s2_)}});
  }
  std::string legacy_bytes() const {
    return testing::torch_legacy(testing::state_dict_pickle(tensors(), true),
                                 {{"0", {24, bytes_of(s0_)}}, {"1", {10, bytes_of(s1_)}}, {"2", {4, bytes_of(s2_)}}});
  }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = dir_ + "/" + name;
    fs::create_directories(fs::path(p).parent_path());
    testing::write_file(p, bytes);
    return p;
  }
  std::string folder(const std::string& name, const std::string& config = R"({"model_type": "llama"})") {
    const std::string d = dir_ + "/" + name;
    fs::create_directories(d);
    testing::write_file(d + "/config.json", config);
    return d;
  }

  // Every tensor of `c` against the storages, in f32, whole and sliced along each axis.
  // `aligned`: the storages start element-aligned (always in the zip format, which pads to
  // 64 bytes; by chance in the legacy one, whose storages follow 8-byte counts).
  void check_values(const Checkpoint& c, bool aligned = true) {
    auto s = [&](int64_t i) { return s0_[i]; };
    auto f32 = [&](const std::string& name) {
      auto t = c.load(name, DType::kF32);
      EXPECT_TRUE(t.is_ok()) << t.status().to_string();
      return t.is_ok() ? std::vector<float>(t->data<float>(), t->data<float>() + t->numel()) : std::vector<float>();
    };
    EXPECT_EQ(f32("a.weight"), s0_);
    EXPECT_EQ(f32("tied"), s0_);
    EXPECT_EQ(f32("a.view"), (std::vector<float>{s(7), s(8), s(9), s(13), s(14), s(15)}));
    std::vector<float> t;
    for (int r = 0; r < 6; ++r)
      for (int col = 0; col < 4; ++col) t.push_back(s(col * 6 + r));
    EXPECT_EQ(f32("a.t"), t);
    std::vector<float> half;
    for (int i = 0; i < 10; ++i) half.push_back(0.25f * i - 1.f);
    EXPECT_EQ(f32("b.half"), half);
    EXPECT_EQ(f32("p"), (std::vector<float>{0.f, 1.5f, 3.f, 4.5f}));
    // A transposed tensor's slices, as tensor-parallel ranks cut them.
    auto rows = c.load_slice("a.t", DType::kF32, 0, 2, 3);
    ASSERT_TRUE(rows.is_ok()) << rows.status().to_string();
    EXPECT_EQ(std::vector<float>(rows->data<float>(), rows->data<float>() + 12),
              std::vector<float>(t.begin() + 8, t.begin() + 20));
    auto cols = c.load_slice("a.t", DType::kF32, 1, 1, 2);
    ASSERT_TRUE(cols.is_ok()) << cols.status().to_string();
    std::vector<float> want_cols;
    for (int r = 0; r < 6; ++r)
      for (int col = 1; col < 3; ++col) want_cols.push_back(s(col * 6 + r));
    EXPECT_EQ(std::vector<float>(cols->data<float>(), cols->data<float>() + 12), want_cols);
    auto view_cols = c.load_slice("a.view", DType::kF32, 1, 1, 2);
    ASSERT_TRUE(view_cols.is_ok());
    EXPECT_EQ(std::vector<float>(view_cols->data<float>(), view_cols->data<float>() + 4),
              (std::vector<float>{s(8), s(9), s(14), s(15)}));
    // A contiguous, aligned f32 tensor is borrowed from the mapping, as with safetensors;
    // an unaligned one is copied.
    auto borrowed = c.load("a.weight", DType::kF32);
    ASSERT_TRUE(borrowed.is_ok());
    EXPECT_EQ(borrowed->data<const void>() == c.find("a.weight")->data, aligned);
    EXPECT_EQ(c.find("tied")->data, c.find("a.weight")->data) << "tied weights share their storage";
    // Conversion: the transposed f32 tensor to bf16.
    auto as_bf16 = c.load("a.t", DType::kBF16);
    ASSERT_TRUE(as_bf16.is_ok());
    EXPECT_EQ(bf16_to_f32(as_bf16->data<uint16_t>()[1]), s(6));
  }

  std::string dir_;
  std::vector<float> s0_;
  std::vector<uint16_t> s1_, s2_;
};

TEST_F(TorchCheckpointTest, ZipFormatViewsHonourOffsetsStridesAndSharedStorage) {
  const std::string d = folder("zip");
  write("zip/pytorch_model.bin", zip_bytes());
  auto c = Checkpoint::open(d);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c.value()->tensor_names(), (std::vector<std::string>{"a.t", "a.view", "a.weight", "b.half", "p", "tied"}));
  EXPECT_EQ(c.value()->find("p")->dtype, DType::kBF16);
  EXPECT_EQ(c.value()->find("b.half")->stored_dtype, "HalfStorage");
  check_values(*c.value());
}

TEST_F(TorchCheckpointTest, LegacyFormatReadsTheSameTensors) {
  const std::string d = folder("legacy");
  write("legacy/pytorch_model.bin", legacy_bytes());
  auto f = TorchCheckpointFile::open(d + "/pytorch_model.bin");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_TRUE(f.value()->legacy_format());
  auto c = Checkpoint::open(d);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  check_values(*c.value(), reinterpret_cast<uintptr_t>(c.value()->find("a.weight")->data) % 4 == 0);
}

TEST_F(TorchCheckpointTest, Zip64ArchiveIsRead) {
  const std::string d = folder("zip64");
  write("zip64/model.pt", testing::torch_zip(testing::state_dict_pickle(tensors()),
                                              {{"0", bytes_of(s0_)}, {"1", bytes_of(s1_)}, {"2", bytes_of(s2_)}},
                                              {.zip64 = true}));
  auto c = Checkpoint::open(d + "/model.pt");  // a single file, config.json beside it
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  check_values(*c.value());
}

TEST_F(TorchCheckpointTest, UnsupportedStorageTypeIsListedButRefusedOnLoad) {
  std::vector<double> d(4, 1.0);
  const std::string p = write("f64.bin", testing::torch_zip(testing::state_dict_pickle({{"d", "0", "DoubleStorage", 4, 0, {4}, {1}}}),
                                                            {{"0", bytes_of(d)}}));
  auto f = TorchCheckpointFile::open(p);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_FALSE(f.value()->tensors()[0].dtype_supported);
  EXPECT_EQ(f.value()->tensors()[0].stored_dtype, "DoubleStorage");
}

// ---- bad files: each one line, naming what is wrong --------------------------------------

TEST_F(TorchCheckpointTest, TruncatedZipIsDataLoss) {
  std::string bytes = zip_bytes();
  const std::string p = write("cut.bin", bytes.substr(0, bytes.size() - 40));
  expect_one_line(TorchCheckpointFile::open(p).status(), StatusCode::kDataLoss, {p, "truncated"});
  // Cut inside a storage: the central directory is gone as well.
  const std::string q = write("cut2.bin", bytes.substr(0, bytes.size() / 2));
  expect_one_line(TorchCheckpointFile::open(q).status(), StatusCode::kDataLoss, {q, "truncated"});
}

TEST_F(TorchCheckpointTest, StorageShorterThanItsTensorNeedsIsDataLoss) {
  std::vector<float> short_storage(20, 1.f);
  const std::string p = write("short.bin", testing::torch_zip(testing::state_dict_pickle({{"w", "0", "FloatStorage", 24, 0, {4, 6}, {6, 1}}}),
                                                              {{"0", bytes_of(short_storage)}}));
  expect_one_line(TorchCheckpointFile::open(p).status(), StatusCode::kDataLoss, {p, "'w'", "storage 0", "24", "80 bytes"});
}

TEST_F(TorchCheckpointTest, StridesPastTheStorageAreDataLoss) {
  const std::string p = write("strides.bin", testing::torch_zip(testing::state_dict_pickle({{"w", "0", "FloatStorage", 24, 0, {4, 6}, {7, 1}}}),
                                                                {{"0", bytes_of(s0_)}}));
  expect_one_line(TorchCheckpointFile::open(p).status(), StatusCode::kDataLoss, {p, "'w'", "stride [7, 1]", "element 26", "24 elements"});
  // An offset that pushes a contiguous tensor past the end, too.
  const std::string q = write("offset.bin", testing::torch_zip(testing::state_dict_pickle({{"w", "0", "FloatStorage", 24, 4, {4, 6}, {6, 1}}}),
                                                               {{"0", bytes_of(s0_)}}));
  expect_one_line(TorchCheckpointFile::open(q).status(), StatusCode::kDataLoss, {"'w'", "offset 4"});
}

TEST_F(TorchCheckpointTest, PickleNamingOsSystemIsRefusedNamingTheGlobal) {
  testing::PickleBuilder p;
  p.proto().global("os", "system").str("touch /tmp/pwned").op('\x85').op('R').op('.');
  const std::string path = write("evil.bin", testing::torch_zip(p.bytes(), {}));
  expect_one_line(TorchCheckpointFile::open(path).status(), StatusCode::kInvalidArgument, {path, "'os.system'", "refused"});
  // The same through STACK_GLOBAL (protocol 4), and in the legacy format.
  std::string p4("\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x02ls\x85R.", 22);
  expect_one_line(read_pickle(p4.data(), p4.size(), PickleOptions{}, "x").status(), StatusCode::kInvalidArgument, {"'os.system'"});
  const std::string legacy = write("evil_legacy.bin", testing::torch_legacy(p.bytes(), {}));
  expect_one_line(TorchCheckpointFile::open(legacy).status(), StatusCode::kInvalidArgument, {"'os.system'"});
  // An allowed name that is not callable (a storage class) cannot be called either.
  testing::PickleBuilder call_storage;
  call_storage.proto().global("torch", "FloatStorage").op(')').op('R').op('.');
  const std::string q = write("call.bin", testing::torch_zip(call_storage.bytes(), {}));
  expect_one_line(TorchCheckpointFile::open(q).status(), StatusCode::kInvalidArgument, {"'torch.FloatStorage'"});
}

TEST_F(TorchCheckpointTest, UnknownOpcodeIsRefusedNamingIt) {
  const std::string p = write("op.bin", testing::torch_zip(std::string("\x80\x02}\xff.", 5), {}));
  expect_one_line(TorchCheckpointFile::open(p).status(), StatusCode::kDataLoss, {p, "unknown pickle opcode 0xff", "byte 3"});
  // A real pickle opcode that a state dict never needs is named too.
  const std::string q = write("inst.bin", testing::torch_zip(std::string("\x80\x02(ios\nsystem\n.", 15), {}));
  expect_one_line(TorchCheckpointFile::open(q).status(), StatusCode::kInvalidArgument, {"INST"});
}

TEST_F(TorchCheckpointTest, CompressedMemberIsRefused) {
  const std::string p = write("deflate.bin", testing::torch_zip(testing::state_dict_pickle(tensors()),
                                                                {{"0", bytes_of(s0_)}}, {.compress_flag = true}));
  expect_one_line(TorchCheckpointFile::open(p).status(), StatusCode::kInvalidArgument, {p, "compressed", "archive/data.pkl"});
}

TEST_F(TorchCheckpointTest, OtherBadFilesAreOneLineErrors) {
  // Not a checkpoint at all.
  const std::string junk = write("junk/pytorch_model.bin", "definitely not a pickle");
  testing::write_file(dir_ + "/junk/config.json", R"({"model_type": "llama"})");
  expect_one_line(Checkpoint::open(dir_ + "/junk").status(), StatusCode::kInvalidArgument, {junk, "neither"});
  // A value that is not a tensor.
  testing::PickleBuilder p;
  p.proto().op('}').str("step").integer(3).op('s').op('.');
  const std::string step = write("step.bin", testing::torch_zip(p.bytes(), {}));
  expect_one_line(TorchCheckpointFile::open(step).status(), StatusCode::kInvalidArgument, {"'step'", "int", "not a tensor"});
  // A storage the archive lacks.
  const std::string missing = write("missing.bin", testing::torch_zip(testing::state_dict_pickle(tensors()), {{"0", bytes_of(s0_)}}));
  expect_one_line(TorchCheckpointFile::open(missing).status(), StatusCode::kDataLoss, {"'b.half'", "archive/data/1"});
  // A legacy file cut inside its storages.
  std::string legacy = legacy_bytes();
  const std::string cut = write("cut_legacy.bin", legacy.substr(0, legacy.size() - 10));
  expect_one_line(TorchCheckpointFile::open(cut).status(), StatusCode::kDataLoss, {cut, "truncated"});
  // A pickle that ends before STOP.
  std::string sd = testing::state_dict_pickle(tensors());
  const std::string early = write("early.bin", testing::torch_zip(sd.substr(0, sd.size() / 2), {}));
  expect_one_line(TorchCheckpointFile::open(early).status(), StatusCode::kDataLoss, {"truncated"});
}

TEST(PickleReader, DeepNestingAndHugeMemoIndicesAreBounded) {
  std::string deep("\x80\x02", 2);
  deep.append(100000, '(');
  expect_one_line(read_pickle(deep.data(), deep.size(), PickleOptions{}, "deep").status(), StatusCode::kDataLoss, {"MARK"});
  std::string get("\x80\x02j\xff\xff\xff\x7f.", 8);  // LONG_BINGET of an entry never stored
  expect_one_line(read_pickle(get.data(), get.size(), PickleOptions{}, "get").status(), StatusCode::kDataLoss, {"memo"});
  // A list that contains itself is fine to read (the tree is never walked blindly) and frees cleanly.
  std::string cyc("\x80\x02]q\x00h\x00\x61.", 9);
  auto doc = read_pickle(cyc.data(), cyc.size(), PickleOptions{}, "cycle");
  ASSERT_TRUE(doc.is_ok()) << doc.status().to_string();
  EXPECT_EQ(doc.value()->root()->items[0], doc.value()->root());
}

// ---- folders and DeepSpeed JSONs ---------------------------------------------------------

TEST_F(TorchCheckpointTest, ShardedBinIndexFolderAndMissingShard) {
  const std::string d = folder("sharded");
  write("sharded/pytorch_model-00001-of-00002.bin",
        testing::torch_zip(testing::state_dict_pickle({tensors()[0]}), {{"0", bytes_of(s0_)}}));
  write("sharded/pytorch_model-00002-of-00002.bin",
        testing::torch_legacy(testing::state_dict_pickle({tensors()[4]}, true), {{"1", {10, bytes_of(s1_)}}}));
  testing::write_file(d + "/pytorch_model.bin.index.json",
                      R"({"metadata": {"total_size": 116}, "weight_map": {"a.weight": "pytorch_model-00001-of-00002.bin",
                          "b.half": "pytorch_model-00002-of-00002.bin"}})");
  auto c = Checkpoint::open(d);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c.value()->tensor_names(), (std::vector<std::string>{"a.weight", "b.half"}));
  EXPECT_EQ(c.value()->files().size(), 2u);
  fs::remove(d + "/pytorch_model-00002-of-00002.bin");
  expect_one_line(Checkpoint::open(d).status(), StatusCode::kNotFound,
                  {"pytorch_model.bin.index.json", "pytorch_model-00002-of-00002.bin", "'b.half'", "does not exist"});
}

TEST_F(TorchCheckpointTest, SafetensorsArePreferredWhenAFolderHasBoth) {
  const std::string d = folder("both");
  write("both/pytorch_model.bin", zip_bytes());
  float x[2] = {1.f, 2.f};
  ASSERT_TRUE(write_safetensors(d + "/model.safetensors", {{"only_in_safetensors", TensorView(x, DType::kF32, {2})}}).is_ok());
  auto c = Checkpoint::open(d);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c.value()->tensor_names(), (std::vector<std::string>{"only_in_safetensors"}));
}

TEST_F(TorchCheckpointTest, FolderWithOnlyOtherBinFilesSaysWhatItLookedFor) {
  const std::string d = folder("args");
  write("args/training_args.bin", zip_bytes());
  expect_one_line(Checkpoint::open(d).status(), StatusCode::kNotFound, {"pytorch_model.bin", "training_args.bin", "DeepSpeed"});
}

TEST_F(TorchCheckpointTest, BaseModelKeysGetTheFamilyPrefix) {
  const std::string d = folder("bloom_base", R"({"model_type": "bloom"})");
  FakeTensor embed{"word_embeddings.weight", "0", "FloatStorage", 24, 0, {4, 6}, {6, 1}};
  FakeTensor norm{"ln_f.weight", "0", "FloatStorage", 24, 0, {6}, {1}};
  write("bloom_base/pytorch_model.bin", testing::torch_zip(testing::state_dict_pickle({embed, norm}), {{"0", bytes_of(s0_)}}));
  auto c = open_model_checkpoint(d);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c.value()->tensor_names(), (std::vector<std::string>{"transformer.ln_f.weight", "transformer.word_embeddings.weight"}));
  auto t = c.value()->load("transformer.ln_f.weight", DType::kF32);
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(t->data<float>()[5], s0_[5]);
  // Names that already carry the prefix stay as they are.
  EXPECT_FALSE(c.value()->add_missing_prefix("transformer."));
}

// A causal-LM checkpoint whose base-model keys lack "model." keeps its lm_head.weight: the
// head is not part of the base model.
TEST_F(TorchCheckpointTest, BaseModelPrefixLeavesTheLmHeadAlone) {
  const std::string d = folder("llama_base", R"({"model_type": "llama"})");
  FakeTensor embed{"embed_tokens.weight", "0", "FloatStorage", 24, 0, {4, 6}, {6, 1}};
  FakeTensor head{"lm_head.weight", "0", "FloatStorage", 24, 0, {4, 6}, {6, 1}};
  write("llama_base/pytorch_model.bin", testing::torch_zip(testing::state_dict_pickle({embed, head}), {{"0", bytes_of(s0_)}}));
  auto c = open_model_checkpoint(d);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c.value()->tensor_names(), (std::vector<std::string>{"lm_head.weight", "model.embed_tokens.weight"}));
}

TEST_F(TorchCheckpointTest, DeepSpeedJsonListsBinAndPtFilesUnderBaseDir) {
  const std::string d = folder("ds");
  write("ds/shards/one.bin", testing::torch_zip(testing::state_dict_pickle({tensors()[0]}), {{"0", bytes_of(s0_)}}));
  write("ds/shards/two.pt", testing::torch_legacy(testing::state_dict_pickle({tensors()[4]}, true), {{"1", {10, bytes_of(s1_)}}}));
  testing::write_file(d + "/ds.json", R"({"type": "llama", "base_dir": "shards", "checkpoints": ["one.bin", "two.pt"],
                                          "version": 1.0, "parallelization": "pp", "mp_size": 1, "dtype": "float32"})");
  auto c = Checkpoint::open(d + "/ds.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c.value()->tensor_names(), (std::vector<std::string>{"a.weight", "b.half"}));
  EXPECT_EQ(c.value()->config_dir(), d);  // no config.json under base_dir: the JSON's folder
}

TEST_F(TorchCheckpointTest, DeepSpeedTpListNotMatchingTpSizeIsRefused) {
  const std::string d = folder("dstp");
  for (const char* f : {"non-tp.pt", "tp_00_00.pt", "tp_01_00.pt", "tp_02_00.pt"}) write(std::string("dstp/") + f, zip_bytes());
  testing::write_file(d + "/bad.json", R"({"type": "bloom", "checkpoints": {"non_tp": ["non-tp.pt"],
      "tp": ["tp_00_00.pt", "tp_01_00.pt", "tp_02_00.pt"]}, "parallelization": "tp", "tp_size": 2, "version": 1.0})");
  expect_one_line(Checkpoint::open(d + "/bad.json").status(), StatusCode::kInvalidArgument,
                  {"bad.json", "3 files", "tp_size 2"});
  // A consistent pre-sharded checkpoint is refused saying what to use instead.
  testing::write_file(d + "/good.json", R"({"type": "bloom", "checkpoints": {"non_tp": ["non-tp.pt"],
      "tp": ["tp_00_00.pt", "tp_01_00.pt", "tp_02_00.pt"]}, "parallelization": "tp", "tp_size": 3, "version": 1.0})");
  expect_one_line(Checkpoint::open(d + "/good.json").status(), StatusCode::kUnimplemented,
                  {"pre-sharded", "original checkpoint"});
  testing::write_file(d + "/mp.json", R"({"type": "bloom", "checkpoints": ["non-tp.pt"], "tp_size": 2, "mp_size": 4})");
  expect_one_line(Checkpoint::open(d + "/mp.json").status(), StatusCode::kInvalidArgument, {"disagree"});
}

// ---- the fixtures: real torch.save files -------------------------------------------------

// Each torch-checkpoints folder holds the same weights as its source safetensors model:
// every tensor must be bit-identical (after the base-model prefix is restored).
TEST(TorchCheckpointFixtures, EveryTensorEqualsTheSourceSafetensors) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string root = testing::fixtures_dir() + "/torch-checkpoints";
  if (!fs::exists(root)) GTEST_SKIP() << "SKIPPED: " << root << " not found";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"bloom-bin-sharded", "tiny-bloom"}, {"bloom-bin-sharded/ds_inference.json", "tiny-bloom"},
      {"llama-bin-legacy", "tiny-llama"}};
  for (const auto& [torch_path, source] : cases) {
    auto got = open_model_checkpoint(root + "/" + torch_path);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    auto want = open_model_checkpoint(testing::fixtures_dir() + "/" + source);
    ASSERT_TRUE(want.is_ok()) << want.status().to_string();
    EXPECT_EQ(got.value()->tensor_names(), want.value()->tensor_names()) << torch_path;
    for (const std::string& name : want.value()->tensor_names()) {
      const TensorInfo* a = got.value()->find(name);
      const TensorInfo* b = want.value()->find(name);
      ASSERT_NE(a, nullptr) << torch_path << ": " << name;
      EXPECT_EQ(a->shape, b->shape) << name;
      ASSERT_EQ(a->nbytes, b->nbytes) << name;
      EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes), 0) << torch_path << ": " << name << " differs";
    }
  }
}

}  // namespace
}  // namespace tessera
