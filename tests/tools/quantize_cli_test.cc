// Int8 weight-only quantization as users reach it: tessera-generate --quantize int8 on
// checkpoints made by tessera-make-checkpoint (no fixtures needed): it runs at tensor-parallel
// 1 and 2 with the same tokens, and every bad input is one line on stderr naming what is
// wrong — a group that does not divide an input dimension (also per tensor-parallel slice),
// int8 asked for a tensor the plan keeps whole, a rule matching nothing, and checkpoints
// already quantized in a format Tessera does not compute (GPTQ/AWQ tensors, config.json
// quantization_config).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::run_command;

class QuantizeCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_temp_dir("tessera-quant-cli");
    llama_ = make("llama");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A tiny random-weight checkpoint (hidden 64, 4 heads of 16, ffn 128).
  std::string make(const std::string& arch, const std::string& extra = "") {
    const std::string out = dir_ + "/" + arch + (extra.empty() ? "" : "-tied");
    auto r = run_command(testing::bin_dir() + "/tessera-make-checkpoint --arch " + arch + " --preset tiny --out " +
                         testing::shell_quote(out) + " --seed 11 " + extra);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return out;
  }

  testing::CommandResult generate(const std::string& model, const std::string& extra) {
    return run_command(testing::bin_dir() + "/tessera-generate --model " + testing::shell_quote(model) +
                       " --prompt-ids 1,5,9,13 --max-new-tokens 8 --json " + extra);
  }

  void expect_one_line_error(const testing::CommandResult& r, const std::string& needle) {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_LT(r.exit_code, 128) << "killed by a signal: " << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr: " << r.err;
  }

  std::string copy(const std::string& model, const std::string& name) {
    const std::string dst = dir_ + "/" + name;
    fs::copy(model, dst, fs::copy_options::recursive);
    return dst;
  }

  std::string dir_, llama_;
};

TEST_F(QuantizeCliTest, Int8RunsAndTensorParallelTwoPrintsWhatOneRankPrints) {
  // Group 32 divides every input of every rank's slice (o_proj and down_proj inputs are 32
  // and 64 wide on 2 ranks).
  auto one = generate(llama_, "--quantize int8 --quantize-group 32");
  auto two = generate(llama_, "--quantize int8 --quantize-group 32 --tensor-parallel 2");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_EQ(nlohmann::json::parse(one.out)["output_ids"], nlohmann::json::parse(two.out)["output_ids"]);
  // The plain op path computes the same int8 products.
  auto plain = generate(llama_, "--quantize int8 --quantize-group 32 --no-kernel-inject");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(nlohmann::json::parse(one.out)["output_ids"], nlohmann::json::parse(plain.out)["output_ids"]);
}

TEST_F(QuantizeCliTest, GroupNotDividingTheInputDimension) {
  expect_one_line_error(generate(llama_, "--quantize int8 --quantize-group 96"),
                        "model.quantization_group 96 does not divide the input dimension 64");
}

TEST_F(QuantizeCliTest, GroupNotDividingOneRanksSlice) {
  // Whole, o_proj's input is 64 wide; each of 2 ranks holds 32 of its columns.
  // Each rank quantizes its own slice, so the refusal comes from the workers (whose logs go
  // to stderr too); the program's own last line names the tensor and the slice.
  ASSERT_EQ(generate(llama_, "--quantize int8 --quantize-group 64").exit_code, 0);
  auto r = generate(llama_, "--quantize int8 --quantize-group 64 --tensor-parallel 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  std::string last = r.err.substr(0, r.err.size() - 1);
  last = last.substr(last.rfind('\n') + 1);
  EXPECT_EQ(last.rfind("tessera-generate: ", 0), 0u) << r.err;
  EXPECT_NE(last.find("does not divide the input dimension 32 of \"model.layers.0.self_attn.o_proj.weight\" "
                      "(this rank's matrix is [64, 32])"),
            std::string::npos)
      << r.err;
}

// The default group, auto, fits each rank's slice: 64 for the whole o_proj input, 32 for a
// rank's half of it, where an explicit 64 is refused (GroupNotDividingOneRanksSlice).
TEST_F(QuantizeCliTest, AutoGroupFitsEachRanksSlice) {
  auto one = generate(llama_, "--quantize int8");
  auto two = generate(llama_, "--quantize int8 --tensor-parallel 2");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(two.exit_code, 0) << two.err;
  expect_one_line_error(generate(llama_, "--quantize int8 --quantize-group automatic"),
                        "--quantize-group: expected auto or a multiple of 32 in [32, 256], got \"automatic\"");
}

TEST_F(QuantizeCliTest, Int8ForATensorThePlanKeepsWhole) {
  const std::string mixtral = make("mixtral");
  expect_one_line_error(generate(mixtral, "--quantize int8 --quantize-group 32 --quantize-rule 'block_sparse_moe\\.gate\\.=int8'"),
                        "is kept whole by the TP plan (role keep)");
}

// The load says what the weights became (info level), the LM head by itself: int8 under int4,
// the compute dtype under int8 or when a rule keeps it.
TEST_F(QuantizeCliTest, TheLoadLogSaysWhatTheLinearsAndTheLmHeadBecame) {
  auto load_log = [&](const std::string& extra) {
    auto r = run_command("TESSERA_LOG_LEVEL=info " + testing::bin_dir() + "/tessera-generate --model " +
                         testing::shell_quote(llama_) + " --prompt-ids 1,5 --max-new-tokens 1 " + extra);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const size_t at = r.err.find("model.quantization ");
    return at == std::string::npos ? r.err : r.err.substr(at, r.err.find('\n', at) - at);
  };
  const std::string int4 = load_log("--quantize int4");
  EXPECT_NE(int4.find("model.quantization int4: the layers' linear weights "), std::string::npos) << int4;
  EXPECT_NE(int4.find(" 4-bit; the LM head int8"), std::string::npos) << int4;
  EXPECT_NE(load_log("--quantize int4 --quantize-rule 'lm_head=none'").find(" 4-bit; the LM head float32"),
            std::string::npos);
  EXPECT_NE(load_log("--quantize int8").find(" int8; the LM head float32"), std::string::npos);
}

// Coded bf16 (model.bf16_coding, kernels/coded_bf16_layout.h): the same values in 12 bits a
// weight, so the same tokens as 16-bit bf16, alone and at tensor-parallel 2 (where o_proj's
// 32-wide slices stay uncoded: not a multiple of the 64-input block); the load log says what
// was coded; under a weights budget the coded layers stream from the spill file (an untied
// and a tied LM head); what cannot apply is refused in one line.
TEST_F(QuantizeCliTest, CodedBf16GivesBf16sTokensAndSaysSo) {
  auto plain = generate(llama_, "--dtype bfloat16 --bf16-coding off");
  auto coded = generate(llama_, "--dtype bfloat16 --bf16-coding on");
  auto coded_tp2 = generate(llama_, "--dtype bfloat16 --bf16-coding on --tensor-parallel 2");
  auto plain_tp2 = generate(llama_, "--dtype bfloat16 --bf16-coding off --tensor-parallel 2");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(coded.exit_code, 0) << coded.err;
  ASSERT_EQ(coded_tp2.exit_code, 0) << coded_tp2.err;
  ASSERT_EQ(plain_tp2.exit_code, 0) << plain_tp2.err;
  EXPECT_EQ(nlohmann::json::parse(coded.out)["output_ids"], nlohmann::json::parse(plain.out)["output_ids"]);
  EXPECT_EQ(nlohmann::json::parse(coded_tp2.out)["output_ids"], nlohmann::json::parse(plain_tp2.out)["output_ids"]);
  auto r = run_command("TESSERA_LOG_LEVEL=info " + testing::bin_dir() + "/tessera-generate --model " +
                       testing::shell_quote(llama_) + " --prompt-ids 1,5 --max-new-tokens 1 --dtype bfloat16 --bf16-coding on");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("model.quantization none, model.bf16_coding on: the layers' linear weights "), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find(" coded bf16; the LM head coded bf16"), std::string::npos) << r.err;
  expect_one_line_error(generate(llama_, "--dtype float32 --bf16-coding on"),
                        "model.bf16_coding on codes bfloat16 weights, but model.dtype is float32");
  const std::string tied = make("llama", "--tie-embeddings");
  for (const std::string& model : {llama_, tied}) {
    auto resident = generate(model, "--dtype bfloat16 --bf16-coding off");
    auto streamed = run_command("TESSERA_LOG_LEVEL=info " + testing::bin_dir() + "/tessera-generate --model " +
                                testing::shell_quote(model) +
                                " --prompt-ids 1,5,9,13 --max-new-tokens 8 --json --dtype bfloat16 --bf16-coding on "
                                "--weights-budget 30%");
    ASSERT_EQ(resident.exit_code, 0) << resident.err;
    ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
    EXPECT_NE(streamed.err.find(" coded bf16"), std::string::npos) << streamed.err;
    EXPECT_NE(streamed.err.find("from an unlinked spill file"), std::string::npos) << streamed.err;
    const std::string json = streamed.out.substr(streamed.out.find('{'));
    EXPECT_EQ(nlohmann::json::parse(json)["output_ids"], nlohmann::json::parse(resident.out)["output_ids"]) << model;
  }
  expect_one_line_error(generate(llama_, "--bf16-coding yes"), "--bf16-coding: unsupported \"yes\" (expected auto, on or off)");
}

TEST_F(QuantizeCliTest, RuleErrors) {
  expect_one_line_error(generate(llama_, "--quantize int8 --quantize-group 32 --quantize-rule 'no_such_module=none'"),
                        "matches no linear weight of this model");
  expect_one_line_error(generate(llama_, "--quantize int8 --quantize-group 32 --quantize-rule 'embed_tokens=int8'"),
                        "is the embedding, a lookup table");
  expect_one_line_error(generate(llama_, "--quantize int8 --quantize-rule 'lm_head'"), "expected REGEX=int8, REGEX=int4 or REGEX=none");
  expect_one_line_error(generate(llama_, "--quantize-rule 'lm_head=int8'"), "--quantize-rule needs --quantize int8");
  expect_one_line_error(generate(llama_, "--quantize int2"), "--quantize: unsupported \"int2\"");
  expect_one_line_error(generate(llama_, "--quantize int8 --quantize-group 48"), "--quantize-group: expected auto or a multiple of 32");
  // The LM head may be made int8 on purpose.
  EXPECT_EQ(generate(llama_, "--quantize int8 --quantize-group 32 --quantize-rule 'lm_head=int8'").exit_code, 0);
}

TEST_F(QuantizeCliTest, CheckpointWithQuantizationConfigIsRefused) {
  const std::string m = copy(llama_, "gptq-config");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(m + "/config.json"));
  cfg["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}};
  std::ofstream(m + "/config.json") << cfg.dump(2);
  expect_one_line_error(generate(m, ""), "already quantized (quantization_config, quant_method gptq)");
  expect_one_line_error(generate(m, "--quantize int8"), "already quantized");
}

TEST_F(QuantizeCliTest, CheckpointWithGptqTensorsIsRefused) {
  // Renames q_proj's weight to GPTQ's packed name in the safetensors header (same bytes).
  const std::string m = copy(llama_, "gptq-tensors");
  const std::string path = m + "/model.safetensors";
  std::string bytes = testing::read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  header["model.layers.0.self_attn.q_proj.qweight"] = header["model.layers.0.self_attn.q_proj.weight"];
  header.erase("model.layers.0.self_attn.q_proj.weight");
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  const uint64_t hn = h.size();
  testing::write_file(path, std::string(reinterpret_cast<const char*>(&hn), 8) + h + bytes.substr(8 + n));
  expect_one_line_error(generate(m, "--quantize int8"),
                        "tensor \"model.layers.0.self_attn.q_proj.qweight\" belongs to a quantized checkpoint format");
}

}  // namespace
}  // namespace tessera
