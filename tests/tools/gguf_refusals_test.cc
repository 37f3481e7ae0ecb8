// GGUF files Tessera does not serve, through tessera-generate: each exits non-zero with one
// line naming the file and the problem, never a crash or a partial load. The files are a
// generated Llama (hidden 256, so that a K-quant's 256-element blocks fit a row) converted as
// llama.cpp's converter does (tests/worker/gguf_from_hf.h), then broken in one place: an
// architecture Tessera does not serve, a tensor of a type it does not decode, a tensor no
// role claims, a file cut short (in the tensor data, in the metadata).
// Needs no fixtures: the Llama comes from tessera-make-checkpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "tests/test_support.h"
#include "tests/worker/gguf_from_hf.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::GgufTestWriter;

class GgufRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = testing::make_temp_dir("tessera-gguf-refusal");
    const testing::CommandResult made = testing::run_command(
        testing::bin_dir() + "/tessera-make-checkpoint --arch llama --hidden 256 --layers 1 --heads 4 --kv-heads 2 "
                             "--ffn 256 --vocab 256 --out " + tmp_ + "/hf");
    ASSERT_EQ(made.exit_code, 0) << made.err;
    auto conv = testing::gguf_from_hf(tmp_ + "/hf");
    ASSERT_TRUE(conv.is_ok()) << conv.status().to_string();
    writer_ = conv->writer;
    // The unbroken file loads and runs: the refusals below are the breakage's.
    const std::string good = write("good", writer_.build());
    const testing::CommandResult r = generate(good);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  void TearDown() override { fs::remove_all(tmp_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = tmp_ + "/" + name + ".gguf";
    testing::write_file(path, bytes);
    return path;
  }
  testing::CommandResult generate(const std::string& gguf, const std::string& flags = "") {
    return testing::run_command(testing::bin_dir() + "/tessera-generate --model " + gguf +
                                " --prompt-ids 1,2,3 --max-new-tokens 2 --threads 1 " + flags);
  }
  GgufTestWriter::Tensor& tensor(const std::string& name) {
    auto it = std::find_if(writer_.tensors.begin(), writer_.tensors.end(),
                           [&](const GgufTestWriter::Tensor& t) { return t.name == name; });
    EXPECT_NE(it, writer_.tensors.end()) << name;
    return *it;
  }

  // tessera-generate on `bytes` fails, and exactly one line of its output names the file and
  // says each of `parts`.
  void expect_refused(const std::string& name, const std::string& bytes, const std::vector<std::string>& parts) {
    const std::string path = write(name, bytes);
    const testing::CommandResult r = generate(path);
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_LT(r.exit_code, 128) << "killed by a signal: " << r.err;
    std::istringstream lines(r.out + "\n" + r.err);
    std::string line;
    int naming = 0;
    while (std::getline(lines, line)) {
      if (line.find(path) == std::string::npos) continue;
      bool all = true;
      for (const std::string& p : parts) all = all && line.find(p) != std::string::npos;
      naming += all ? 1 : 0;
    }
    EXPECT_EQ(naming, 1) << "expected one line naming " << path << " and the problem; stderr:\n" << r.err;
  }

  std::string tmp_;
  GgufTestWriter writer_;
};

TEST_F(GgufRefusalTest, ArchitectureTesseraDoesNotServe) {
  // general.architecture is the first key the converter writes.
  ASSERT_EQ(writer_.kvs[0].rfind(testing::gguf_str("general.architecture"), 0), 0u);
  writer_.kvs[0] = testing::gguf_str("general.architecture") + testing::gguf_le(static_cast<uint32_t>(GgufValueType::kString)) +
                   testing::gguf_str("bert");
  expect_refused("bert", writer_.build(), {"GGUF architecture 'bert' is not supported", "supported: ", "llama"});
}

TEST_F(GgufRefusalTest, TensorOfATypeTesseraDoesNotDecode) {
  GgufTestWriter::Tensor& t = tensor("blk.0.ffn_up.weight");  // {256, 256}: one q2_K block per 256 elements
  t.type = static_cast<uint32_t>(GgmlType::kQ2_K);
  t.data.reset();  // filler of q2_K's size
  expect_refused("q2_k", writer_.build(), {"tensor 'blk.0.ffn_up.weight' has type q2_K", "not supported"});
}

TEST_F(GgufRefusalTest, TensorNoRoleClaims) {
  // A per-head q norm (Qwen3's) in a Llama: llama.cpp's llama graph has no such tensor either.
  writer_.tensor("blk.0.attn_q_norm.weight", {64}, GgmlType::kF32, std::string(64 * sizeof(float), '\0'));
  expect_refused("unclaimed", writer_.build(), {"tensor 'blk.0.attn_q_norm.weight' has no place in a llama model"});
}

// 4-bit weights split by tensor parallelism inside a block: --quantize int4 refuses with the
// numbers; auto (the default) decodes that matrix instead and says so.
TEST_F(GgufRefusalTest, Int4SplitInsideAQ4KBlock) {
  GgufTestWriter::Tensor& t = tensor("blk.0.attn_output.weight");  // [256, 256]: row-parallel, 128 inputs a rank
  t.type = static_cast<uint32_t>(GgmlType::kQ4_K);
  // 256 blocks of 144 bytes: d and dmin 1.0 (f16), then filler; finite, as model.check_weights wants.
  std::string blocks;
  for (int b = 0; b < 256; ++b) {
    std::string block(144, '\0');
    for (int j = 4; j < 144; ++j) block[j] = static_cast<char>(GgufTestWriter::data_byte(b, j));
    block[1] = block[3] = '\x3c';  // 0x3c00 little-endian
    blocks += block;
  }
  t.data = blocks;
  const std::string path = write("q4_k-o", writer_.build());
  const testing::CommandResult strict = generate(path, "--quantize int4 --tensor-parallel 2");
  EXPECT_NE(strict.exit_code, 0) << strict.out;
  EXPECT_LT(strict.exit_code, 128) << strict.err;
  // Each rank refuses its own half; whichever reports first is the one named.
  const std::string refused = "tensor 'model.layers.0.self_attn.o_proj.weight' (q4_K, blocks of 256 inputs) cannot be "
                              "split at inputs ";
  const std::string inside = ": the split falls inside a block";
  EXPECT_TRUE(strict.err.find(refused + "[0, 128)" + inside) != std::string::npos ||
              strict.err.find(refused + "[128, 256)" + inside) != std::string::npos)
      << strict.err;
  const testing::CommandResult fallback = generate(path, "--tensor-parallel 2");
  EXPECT_EQ(fallback.exit_code, 0) << fallback.err;
  EXPECT_NE(fallback.err.find("is split at inputs [128, 256), inside its 256-input q4_K blocks; this rank decodes it"),
            std::string::npos)
      << fallback.err;
}

TEST_F(GgufRefusalTest, FileCutShortInTheTensorData) {
  const std::string bytes = writer_.build();
  expect_refused("cut-data", bytes.substr(0, bytes.size() - 1000), {"lies past the end of the file"});
}

TEST_F(GgufRefusalTest, FileCutShortInTheMetadata) {
  const std::string bytes = writer_.build();
  expect_refused("cut-metadata", bytes.substr(0, 100), {"metadata keys", "bytes after it can hold"});
}

}  // namespace
}  // namespace tessera
