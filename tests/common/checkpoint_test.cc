// Checkpoint: Hugging Face folders (single file, index + shards, bare shards), DeepSpeed
// checkpoint JSONs, dtype conversion and slicing against values computed here from the
// source arrays, every user error, and peak RSS when loading a large model.
#include "common/checkpoint.h"
#include "worker/model_checkpoint.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
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
using ::tessera::testing::write_file;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir("checkpoint_test");
    // w: [4, 6] f32 with w[r][c] = r * 10 + c + 0.5; h: [5, 3] f16; v: [6] bf16.
    w_.resize(24);
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 6; ++c) w_[r * 6 + c] = r * 10.f + c + 0.5f;
    for (int i = 0; i < 15; ++i) h_.push_back(f32_to_f16(0.25f * i - 1.f));
    for (int i = 0; i < 6; ++i) v_.push_back(f32_to_bf16(-2.f + i));
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string sub(const std::string& name) {
    std::string p = dir_ + "/" + name;
    fs::create_directories(p);
    return p;
  }
  static void write_config(const std::string& dir, const std::string& text = R"({"model_type": "llama"})") {
    write_file(dir + "/config.json", text);
  }
  void write_model(const std::string& file) {
    ASSERT_TRUE(write_safetensors(file, {{"w", TensorView(w_.data(), DType::kF32, {4, 6})},
                                         {"h", TensorView(h_.data(), DType::kF16, {5, 3})},
                                         {"v", TensorView(v_.data(), DType::kBF16, {6})}})
                    .is_ok());
  }
  void write_one(const std::string& file, const std::string& name) {
    float x[2] = {1.f, 2.f};
    ASSERT_TRUE(write_safetensors(file, {{name, TensorView(x, DType::kF32, {2})}}).is_ok());
  }

  std::string dir_;
  std::vector<float> w_;
  std::vector<uint16_t> h_, v_;
};

TEST_F(CheckpointTest, OpensHuggingFaceFolder) {
  std::string d = sub("hf");
  write_config(d, R"({"model_type": "llama", "hidden_size": 6})");
  write_model(d + "/model.safetensors");
  auto c = Checkpoint::open(d);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  const Checkpoint& ckpt = *c.value();
  EXPECT_EQ(ckpt.config_dir(), d);
  EXPECT_EQ(ckpt.config()["hidden_size"], 6);
  EXPECT_EQ(ckpt.tensor_names(), (std::vector<std::string>{"h", "v", "w"}));
  EXPECT_EQ(ckpt.total_bytes(), 24 * 4 + 15 * 2 + 6 * 2);
  ASSERT_NE(ckpt.find("w"), nullptr);
  EXPECT_EQ(ckpt.find("w")->shape, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(ckpt.find("nope"), nullptr);
}

TEST_F(CheckpointTest, OpensASingleSafetensorsFileWithConfigBesideIt) {
  std::string d = sub("single");
  write_config(d, R"({"model_type": "bloom"})");
  write_model(d + "/weights.safetensors");
  auto c = Checkpoint::open(d + "/weights.safetensors");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c.value()->config()["model_type"], "bloom");
  EXPECT_EQ(c.value()->tensor_names().size(), 3u);
}

TEST_F(CheckpointTest, LoadSameDtypeBorrowsTheMapping) {
  std::string d = sub("hf");
  write_config(d);
  write_model(d + "/model.safetensors");
  auto c = Checkpoint::open(d);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  auto t = c.value()->load("w", DType::kF32);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t.value().data<const void>(), c.value()->find("w")->data) << "expected zero copy";
  EXPECT_EQ(t.value().view().dims(), (std::vector<int64_t>{4, 6}));
  for (int i = 0; i < 24; ++i) EXPECT_EQ(t.value().data<float>()[i], w_[i]);
  // The tensor keeps the file mapped after the checkpoint is gone.
  Tensor kept = std::move(t.value());
  c.value().reset();
  EXPECT_EQ(kept.data<float>()[23], w_[23]);
}

TEST_F(CheckpointTest, LoadConvertsBetweenFloatTypes) {
  std::string d = sub("hf");
  write_config(d);
  write_model(d + "/model.safetensors");
  auto c = Checkpoint::open(d);
  ASSERT_TRUE(c.is_ok());
  auto hf = c.value()->load("h", DType::kF32);
  ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();
  // Every value is a multiple of 0.25 in [-1, 2.5]: exact in f16, so exact after widening.
  for (int i = 0; i < 15; ++i) EXPECT_EQ(hf.value().data<float>()[i], 0.25f * i - 1.f) << i;
  auto wb = c.value()->load("w", DType::kBF16);
  ASSERT_TRUE(wb.is_ok());
  EXPECT_EQ(wb.value().dtype(), DType::kBF16);
  for (int i = 0; i < 24; ++i) {  // bf16 keeps 8 significant bits
    float back = bf16_to_f32(wb.value().data<uint16_t>()[i]);
    EXPECT_NEAR(back, w_[i], std::fabs(w_[i]) / 128.f) << i;
  }
  auto vh = c.value()->load("v", DType::kF16);
  ASSERT_TRUE(vh.is_ok());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(f16_to_f32(vh.value().data<uint16_t>()[i]), -2.f + i);
}

TEST_F(CheckpointTest, LoadSliceRowsAndColumns) {
  std::string d = sub("hf");
  write_config(d);
  write_model(d + "/model.safetensors");
  auto c = Checkpoint::open(d);
  ASSERT_TRUE(c.is_ok());
  const Checkpoint& ckpt = *c.value();

  auto rows = ckpt.load_slice("w", DType::kF32, 0, 1, 2);
  ASSERT_TRUE(rows.is_ok()) << rows.status().to_string();
  EXPECT_EQ(rows.value().view().dims(), (std::vector<int64_t>{2, 6}));
  for (int r = 0; r < 2; ++r)
    for (int col = 0; col < 6; ++col) EXPECT_EQ(rows.value().data<float>()[r * 6 + col], (r + 1) * 10.f + col + 0.5f);
  // Same dtype, contiguous rows: borrowed from the mapping, starting at row 1.
  EXPECT_EQ(rows.value().data<const char>(), static_cast<const char*>(ckpt.find("w")->data) + 6 * 4);

  auto cols = ckpt.load_slice("w", DType::kF32, 1, 2, 3);
  ASSERT_TRUE(cols.is_ok()) << cols.status().to_string();
  EXPECT_EQ(cols.value().view().dims(), (std::vector<int64_t>{4, 3}));
  for (int r = 0; r < 4; ++r)
    for (int col = 0; col < 3; ++col) EXPECT_EQ(cols.value().data<float>()[r * 3 + col], r * 10.f + (col + 2) + 0.5f);

  auto hcols = ckpt.load_slice("h", DType::kF32, 1, 1, 1);  // f16 -> f32, one column
  ASSERT_TRUE(hcols.is_ok());
  for (int r = 0; r < 5; ++r) EXPECT_EQ(hcols.value().data<float>()[r], 0.25f * (r * 3 + 1) - 1.f);

  auto v = ckpt.load_slice("v", DType::kF32, 0, 4, 2);  // 1-D
  ASSERT_TRUE(v.is_ok());
  EXPECT_EQ(v.value().data<float>()[0], 2.f);
  EXPECT_EQ(v.value().data<float>()[1], 3.f);

  auto empty = ckpt.load_slice("w", DType::kF32, 1, 6, 0);
  ASSERT_TRUE(empty.is_ok());
  EXPECT_EQ(empty.value().numel(), 0);
}

TEST_F(CheckpointTest, LoadSliceRejectsBadRanges) {
  std::string d = sub("hf");
  write_config(d);
  write_model(d + "/model.safetensors");
  auto c = Checkpoint::open(d);
  ASSERT_TRUE(c.is_ok());
  auto past = c.value()->load_slice("w", DType::kF32, 0, 3, 2);
  EXPECT_EQ(past.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(past.status().message(), "'w'")) << past.status().message();
  EXPECT_EQ(c.value()->load_slice("w", DType::kF32, 2, 0, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.value()->load_slice("v", DType::kF32, 1, 0, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.value()->load_slice("w", DType::kF32, 0, -1, 1).status().code(), StatusCode::kInvalidArgument);
  auto missing = c.value()->load("nope", DType::kF32);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(missing.status().message(), "'nope'"));
}

TEST_F(CheckpointTest, ShardedFolderWithIndex) {
  std::string d = sub("sharded");
  write_config(d);
  write_one(d + "/model-00001-of-00002.safetensors", "a");
  write_one(d + "/model-00002-of-00002.safetensors", "b");
  write_file(d + "/model.safetensors.index.json",
             R"({"metadata": {"total_size": 16}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                 "b": "model-00002-of-00002.safetensors"}})");
  auto c = Checkpoint::open(d);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c.value()->tensor_names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.value()->files().size(), 2u);
  EXPECT_TRUE(contains(c.value()->find("b")->file, "00002"));
}

TEST_F(CheckpointTest, IndexNamingMissingShardIsNotFound) {
  std::string d = sub("sharded");
  write_config(d);
  write_one(d + "/model-00001-of-00002.safetensors", "a");
  write_file(d + "/model.safetensors.index.json",
             R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
  auto c = Checkpoint::open(d);
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(c.status().message(), "model-00002-of-00002.safetensors")) << c.status().message();
}

TEST_F(CheckpointTest, IndexListingTensorAbsentFromShardIsDataLoss) {
  std::string d = sub("sharded");
  write_config(d);
  write_one(d + "/model-00001-of-00001.safetensors", "a");
  write_file(d + "/model.safetensors.index.json",
             R"({"weight_map": {"a": "model-00001-of-00001.safetensors", "ghost": "model-00001-of-00001.safetensors"}})");
  auto c = Checkpoint::open(d);
  EXPECT_EQ(c.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(contains(c.status().message(), "'ghost'")) << c.status().message();
}

TEST_F(CheckpointTest, SameTensorInTwoShardsIsRejected) {
  std::string d = sub("dup");
  write_config(d);
  write_one(d + "/part-a.safetensors", "x");
  write_one(d + "/part-b.safetensors", "x");
  auto c = Checkpoint::open(d);  // no index: every *.safetensors in the folder
  EXPECT_EQ(c.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(contains(c.status().message(), "'x'")) << c.status().message();
  EXPECT_TRUE(contains(c.status().message(), "part-a.safetensors"));
  EXPECT_TRUE(contains(c.status().message(), "part-b.safetensors"));
}

TEST_F(CheckpointTest, MissingFolderIsNotFound) {
  auto c = Checkpoint::open(dir_ + "/no-such-model");
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(c.status().message(), "no-such-model"));
}

TEST_F(CheckpointTest, MissingConfigIsNotFound) {
  std::string d = sub("noconfig");
  write_model(d + "/model.safetensors");
  auto c = Checkpoint::open(d);
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(c.status().message(), "config.json")) << c.status().message();
}

// A llama.cpp user's folder of GGUF files, with or without a config.json beside them: the
// refusal names the files and says the file itself is the model.
TEST_F(CheckpointTest, FolderOfGgufFilesNamesThem) {
  std::string d = sub("gguf-folder");
  for (const char* name : {"m-Q4_K_M.gguf", "m-Q8_0.gguf"}) write_file(d + "/" + name, "GGUF");
  auto c = Checkpoint::open(d);
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  const std::string hint = "the folder holds GGUF files (m-Q4_K_M.gguf, m-Q8_0.gguf): give the .gguf file itself";
  EXPECT_TRUE(contains(c.status().message(), "config.json")) << c.status().message();
  EXPECT_TRUE(contains(c.status().message(), hint)) << c.status().message();
  write_config(d);
  auto with_config = Checkpoint::open(d);
  EXPECT_EQ(with_config.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(with_config.status().message(), "no model weights in the folder"))
      << with_config.status().message();
  EXPECT_TRUE(contains(with_config.status().message(), hint)) << with_config.status().message();
}

TEST_F(CheckpointTest, ConfigNotJsonIsInvalidArgument) {
  std::string d = sub("badconfig");
  write_config(d, "{\"model_type\": llama");
  write_model(d + "/model.safetensors");
  auto c = Checkpoint::open(d);
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(c.status().message(), "config.json")) << c.status().message();
}

TEST_F(CheckpointTest, FolderWithoutSafetensorsIsNotFound) {
  std::string d = sub("empty");
  write_config(d);
  auto c = Checkpoint::open(d);
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(c.status().message(), "safetensors")) << c.status().message();
  // A pytorch_model.bin is read as PyTorch's format, and one that is not says so, naming it.
  write_file(d + "/pytorch_model.bin", "not really");
  auto pt = Checkpoint::open(d);
  EXPECT_EQ(pt.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(pt.status().message(), "pytorch_model.bin: neither a safetensors file nor a PyTorch checkpoint"))
      << pt.status().message();
}

TEST_F(CheckpointTest, TruncatedShardIsDataLossNamingFile) {
  std::string d = sub("cut");
  write_config(d);
  write_model(d + "/model.safetensors");
  fs::resize_file(d + "/model.safetensors", fs::file_size(d + "/model.safetensors") - 4);
  auto c = Checkpoint::open(d);
  EXPECT_EQ(c.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(contains(c.status().message(), "model.safetensors")) << c.status().message();
}

TEST_F(CheckpointTest, UnsupportedDtypesAreUnimplementedNamingTensorAndType) {
  std::string d = sub("f64");
  write_config(d);
  // Raw bytes: our writer only writes types Tessera computes with.
  std::string header = R"({"layers.0.w":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},)"
                       R"("layers.0.q":{"dtype":"I8","shape":[4],"data_offsets":[16,20]},)"
                       R"("layers.0.m":{"dtype":"BOOL","shape":[4],"data_offsets":[20,24]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_file(d + "/model.safetensors", bytes + header + std::string(24, '\0'));
  auto c = Checkpoint::open(d);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  for (auto [name, type] : {std::pair{"layers.0.w", "F64"}, {"layers.0.q", "I8"}, {"layers.0.m", "BOOL"}}) {
    auto t = c.value()->load(name, DType::kF32);
    EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented) << name;
    EXPECT_TRUE(contains(t.status().message(), std::string("'") + name + "'")) << t.status().message();
    EXPECT_TRUE(contains(t.status().message(), type)) << t.status().message();
    EXPECT_EQ(c.value()->load_slice(name, DType::kBF16, 0, 0, 1).status().code(), StatusCode::kUnimplemented);
  }
}

TEST_F(CheckpointTest, IntegerTensorsLoadOnlyUnconverted) {
  std::string d = sub("int");
  write_config(d);
  int32_t ids[3] = {4, 5, 6};
  ASSERT_TRUE(write_safetensors(d + "/model.safetensors", {{"ids", TensorView(ids, DType::kI32, {3})}}).is_ok());
  auto c = Checkpoint::open(d);
  ASSERT_TRUE(c.is_ok());
  auto same = c.value()->load("ids", DType::kI32);
  ASSERT_TRUE(same.is_ok());
  EXPECT_EQ(same.value().data<int32_t>()[2], 6);
  EXPECT_EQ(c.value()->load("ids", DType::kF32).status().code(), StatusCode::kUnimplemented);
}

// ---- DeepSpeed checkpoint JSON ---------------------------------------------------------

TEST_F(CheckpointTest, DeepSpeedJsonListForm) {
  std::string d = sub("ds");
  write_config(d);
  write_one(d + "/a.safetensors", "a");
  write_one(d + "/b.safetensors", "b");
  write_file(d + "/ds.json", R"({"type": "BLOOM-176B", "checkpoints": ["a.safetensors", "b.safetensors"], "version": 1.0})");
  auto c = Checkpoint::open(d + "/ds.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c.value()->tensor_names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.value()->config_dir(), d);
  EXPECT_EQ(c.value()->config()["model_type"], "llama") << "architecture comes from config.json, not the type";
}

TEST_F(CheckpointTest, DeepSpeedJsonDictFormAndBaseDir) {
  std::string d = sub("ds2");
  std::string w = sub("ds2/weights");
  write_config(w, R"({"model_type": "mixtral"})");
  write_one(w + "/non_tp.safetensors", "embed");
  write_one(w + "/tp_0.safetensors", "q");
  write_one(w + "/tp_1.safetensors", "k");
  write_file(d + "/ds.json", R"({"type": "mixtral", "base_dir": "weights", "version": 1.0,
      "checkpoints": {"non_tp": ["non_tp.safetensors"], "tp": ["tp_0.safetensors", "tp_1.safetensors"]}})");
  auto c = Checkpoint::open(d + "/ds.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c.value()->tensor_names(), (std::vector<std::string>{"embed", "k", "q"}));
  EXPECT_EQ(c.value()->config_dir(), w) << "config.json is looked up in base_dir first";
  EXPECT_EQ(c.value()->config()["model_type"], "mixtral");
}

TEST_F(CheckpointTest, DeepSpeedTypeIsCaseInsensitiveAndChecked) {
  std::string d = sub("dstype");
  write_config(d);
  write_one(d + "/a.safetensors", "a");
  for (const char* type : {"llama-2-7b", "Mistral", "ds_model", "BLOOM"}) {
    write_file(d + "/ds.json", std::string(R"({"type": ")") + type + R"(", "checkpoints": ["a.safetensors"]})");
    EXPECT_TRUE(open_model_checkpoint(d + "/ds.json").is_ok()) << type;
  }
  // The family is judged by the architecture table, where the model is opened for serving.
  write_file(d + "/ds.json", R"({"type": "GPT-J", "checkpoints": ["a.safetensors"]})");
  auto bad = open_model_checkpoint(d + "/ds.json");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(bad.status().message(), "GPT-J")) << bad.status().message();
  EXPECT_TRUE(contains(bad.status().message(), "ds_model")) << "lists accepted types";
}

TEST_F(CheckpointTest, DeepSpeedJsonNamingMissingFileIsNotFound) {
  std::string d = sub("dsmiss");
  write_config(d);
  write_file(d + "/ds.json", R"({"type": "llama", "checkpoints": ["gone.safetensors"], "version": 1.0})");
  auto c = Checkpoint::open(d + "/ds.json");
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(c.status().message(), "gone.safetensors")) << c.status().message();
  EXPECT_TRUE(contains(c.status().message(), "ds.json"));
}

TEST_F(CheckpointTest, MalformedDeepSpeedJsonIsInvalidArgument) {
  std::string d = sub("dsbad");
  write_config(d);
  write_file(d + "/ds.json", R"({"type": "llama", "checkpoints": [)");
  auto broken = Checkpoint::open(d + "/ds.json");
  EXPECT_EQ(broken.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(broken.status().message(), "ds.json")) << broken.status().message();
  write_file(d + "/ds.json", R"({"type": "llama", "version": 1.0})");
  auto lacking = Checkpoint::open(d + "/ds.json");
  EXPECT_EQ(lacking.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(lacking.status().message(), "checkpoints")) << lacking.status().message();
  write_file(d + "/ds.json", R"({"type": "llama", "checkpoints": [3]})");
  EXPECT_EQ(Checkpoint::open(d + "/ds.json").status().code(), StatusCode::kInvalidArgument);
}

// PyTorch files are read (tests/common/torch_checkpoint_test.cc); a file of neither kind,
// listed in a DeepSpeed JSON or given directly, is refused naming it.
TEST_F(CheckpointTest, CheckpointFileOfUnknownKindIsRefusedNamingIt) {
  std::string d = sub("pt");
  write_config(d);
  write_file(d + "/model.pt", "pickle");
  write_file(d + "/ds.json", R"({"type": "bloom", "checkpoints": ["model.pt"]})");
  auto c = Checkpoint::open(d + "/ds.json");
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(c.status().message(), "model.pt: neither a safetensors file nor a PyTorch checkpoint"))
      << c.status().message();
  auto direct = Checkpoint::open(d + "/model.pt");
  EXPECT_EQ(direct.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(direct.status().message(), "model.pt: neither")) << direct.status().message();
}

TEST_F(CheckpointTest, OpensReferenceFixtures) {
  TESSERA_REQUIRE_FIXTURES();
  for (const char* model : {"tiny-llama", "tiny-bloom", "tiny-mixtral"}) {
    auto c = Checkpoint::open(::tessera::testing::fixtures_dir() + "/" + model);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_FALSE(c.value()->tensor_names().empty());
    EXPECT_TRUE(c.value()->config().contains("model_type")) << model;
  }
  auto bloom = Checkpoint::open(::tessera::testing::fixtures_dir() + "/tiny-bloom");
  ASSERT_TRUE(bloom.is_ok());
  // The fused QKV weight is [3 * hidden, hidden] (README: hidden 96).
  const TensorInfo* qkv = bloom.value()->find("transformer.h.0.self_attention.query_key_value.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->shape, (std::vector<int64_t>{288, 96}));
  EXPECT_EQ(bloom.value()->find("lm_head.weight"), nullptr);
}

// ---- peak RSS ---------------------------------------------------------------------------

int64_t proc_status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key)));
  }
  return -1;
}

// Runs `load` in a forked child (VmHWM is a per-process high-water mark) and returns the
// growth of peak RSS in bytes, or -1 when the child failed.
template <typename Fn>
int64_t peak_rss_growth(Fn load) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    // Reset the high-water mark to the current RSS (Linux >= 4.0); without it the child
    // inherits nothing useful as a baseline.
    { std::ofstream("/proc/self/clear_refs") << "5"; }
    int64_t before = proc_status_kb("VmRSS:");
    int64_t hwm_before = proc_status_kb("VmHWM:");
    if (hwm_before > before) before = hwm_before;  // reset unavailable: a conservative baseline
    bool ok = load();
    int64_t growth = ok ? (proc_status_kb("VmHWM:") - before) * 1024 : -1;
    ssize_t n = write(fds[1], &growth, sizeof(growth));
    _exit(n == sizeof(growth) ? 0 : 1);
  }
  close(fds[1]);
  int64_t growth = -1;
  if (read(fds[0], &growth, sizeof(growth)) != sizeof(growth)) growth = -1;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return growth;
}

// Built with += rather than "t" + to_string(i), which trips a GCC 12 -Wrestrict false positive.
std::string big_tensor_name(int i) {
  std::string name = "t";
  name += std::to_string(i);
  return name;
}

TEST_F(CheckpointTest, PeakRssStaysNearModelSize) {
  // 104 tensors x 4 MB of f32 = 416 MB, written in 4 MB chunks.
  constexpr int kTensors = 104;
  constexpr int64_t kElems = 1 << 20;
  std::string d = sub("big");
  write_config(d);
  std::vector<SafetensorsWriter::Entry> entries;
  for (int i = 0; i < kTensors; ++i) entries.push_back({big_tensor_name(i), DType::kF32, {1024, kElems / 1024}});
  auto w = SafetensorsWriter::create(d + "/model.safetensors", entries);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  {
    std::vector<float> buf(kElems);
    for (int i = 0; i < kTensors; ++i) {
      for (int64_t j = 0; j < kElems; ++j) buf[j] = static_cast<float>((i * 7 + j) % 1000) * 1e-3f;
      ASSERT_TRUE(w.value()->write(big_tensor_name(i), buf.data(), kElems * 4).is_ok());
    }
  }
  ASSERT_TRUE(w.value()->finish().is_ok());
  const double file_bytes = static_cast<double>(fs::file_size(d + "/model.safetensors"));

  // f32, zero copy: every page of every tensor touched and all tensors kept, as a model would.
  int64_t zero_copy = peak_rss_growth([&] {
    auto c = Checkpoint::open(d);
    if (!c.is_ok()) return false;
    std::vector<Tensor> kept;
    double sum = 0;
    for (const auto& name : c.value()->tensor_names()) {
      auto t = c.value()->load(name, DType::kF32);
      if (!t.is_ok() || t.value().data<const void>() != c.value()->find(name)->data) return false;
      const float* p = t.value().data<float>();
      for (int64_t j = 0; j < t.value().numel(); j += 1024) sum += p[j];
      kept.push_back(std::move(t.value()));
    }
    return sum > 0;
  });
  // bf16: converted copies (half the size) kept, each source released after conversion.
  auto load_bf16 = [&](bool release) {
    auto c = Checkpoint::open(d);
    if (!c.is_ok()) return false;
    std::vector<Tensor> kept;
    for (const auto& name : c.value()->tensor_names()) {
      auto t = c.value()->load(name, DType::kBF16);
      if (!t.is_ok()) return false;
      if (release) c.value()->release(name);
      kept.push_back(std::move(t.value()));
    }
    // Released pages are re-read on demand: the data is still right.
    return c.value()->load("t3", DType::kF32).value().data<float>()[5] == static_cast<float>((3 * 7 + 5) % 1000) * 1e-3f;
  };
  int64_t converted = peak_rss_growth([&] { return load_bf16(true); });
  int64_t unreleased = peak_rss_growth([&] { return load_bf16(false); });
  fs::remove(d + "/model.safetensors");

  ASSERT_GT(zero_copy, 0) << "child failed";
  ASSERT_GT(converted, 0) << "child failed";
  ASSERT_GT(unreleased, 0) << "child failed";
  std::printf("file %.0f MB; peak RSS growth: f32 zero-copy %.2fx, bf16+release %.2fx, bf16 without release %.2fx\n",
              file_bytes / 1e6, zero_copy / file_bytes, converted / file_bytes, unreleased / file_bytes);
  EXPECT_LT(zero_copy, 1.3 * file_bytes);
  EXPECT_GT(zero_copy, 0.8 * file_bytes) << "every page was touched: the measurement must see them";
  EXPECT_LT(converted, 1.3 * file_bytes);
  // Without release the mapped file and the copies add up (~1.5x): release is what keeps it low.
  EXPECT_GT(unreleased, converted + 0.3 * file_bytes);
}

}  // namespace
}  // namespace tessera
