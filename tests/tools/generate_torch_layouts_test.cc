// PyTorch checkpoints in the layouts found in the wild, written here byte by byte from the
// fixture models' safetensors (no Python): every tensor a view into ONE shared storage at
// its own offset, every matrix stored transposed (strides [1, rows], a non-contiguous view),
// and, for BLOOM, names without the base model's `transformer.` prefix. tessera-generate
// must still give the goldens (tokens exact, logits within 1e-3) at TP 1 and 2, fused and
// plain: strided tensors are gathered per rank slice, shared storages and offsets honoured.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/checkpoint.h"
#include "tests/common/torch_file_builder.h"
#include "tests/test_support.h"
#include "tests/tools/golden_prompts.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct LayoutRun {
  std::string model;
  int world = 1;
  bool inject = true;
};

// Writes <dir>/pytorch_model.bin holding `source`'s tensors as transposed views of one
// storage; `strip` is removed from the front of every name that has it.
void write_strided_shared(const std::string& source, const std::string& dir, const std::string& strip) {
  auto src = Checkpoint::open(source);
  ASSERT_TRUE(src.is_ok()) << src.status().to_string();
  std::vector<float> storage;
  std::vector<testing::FakeTensor> tensors;
  for (const std::string& name : src.value()->tensor_names()) {
    auto t = src.value()->load(name, DType::kF32);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    const std::vector<int64_t> shape = src.value()->find(name)->shape;
    const float* p = t->data<float>();
    testing::FakeTensor f;
    f.name = name.rfind(strip, 0) == 0 ? name.substr(strip.size()) : name;
    f.storage_key = "0";
    f.offset = static_cast<int64_t>(storage.size()) + 3;  // never at the storage's start
    storage.resize(static_cast<size_t>(f.offset));
    f.shape = shape;
    if (shape.size() == 2) {  // column-major: element (r, c) at offset + c * rows + r
      const int64_t rows = shape[0], cols = shape[1];
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t r = 0; r < rows; ++r) storage.push_back(p[r * cols + c]);
      f.strides = {1, rows};
    } else {
      storage.insert(storage.end(), p, p + t->numel());
      int64_t stride = 1;
      f.strides.assign(shape.size(), 1);
      for (size_t i = shape.size(); i-- > 0;) {
        f.strides[i] = stride;
        stride *= shape[i];
      }
    }
    tensors.push_back(std::move(f));
  }
  for (auto& f : tensors) f.storage_numel = static_cast<int64_t>(storage.size());
  fs::create_directories(dir);
  fs::copy_file(fs::path(source) / "config.json", fs::path(dir) / "config.json");
  testing::write_file(dir + "/pytorch_model.bin",
                      testing::torch_zip(testing::state_dict_pickle(tensors), {{"0", testing::bytes_of(storage)}}));
}

class GenerateTorchLayoutsTest : public ::testing::TestWithParam<LayoutRun> {};

TEST_P(GenerateTorchLayoutsTest, StridedSharedStorageGivesTheGoldens) {
  TESSERA_REQUIRE_FIXTURES();
  const LayoutRun& p = GetParam();
  const std::string source = testing::fixtures_dir() + "/" + p.model;
  const std::string dir = testing::make_temp_dir("tessera-torch-layouts");
  const std::string model = dir + "/model";
  write_strided_shared(source, model, p.model == "tiny-bloom" ? "transformer." : "");
  if (HasFatalFailure()) return;
  std::ifstream in(source + "/goldens/index.json");
  const auto index = nlohmann::json::parse(in);
  testing::write_golden_prompts(index["cases"], dir + "/prompts.txt");
  std::string cmd = testing::bin_dir() + "/tessera-generate --model '" + model + "' --prompt-ids-file '" + dir +
                    "/prompts.txt' --max-new-tokens 24 --json --dump-logits '" + dir + "/logits.f32'";
  if (!p.inject) cmd += " --no-kernel-inject";
  if (p.world > 1) cmd += " --tensor-parallel " + std::to_string(p.world);
  const auto r = testing::run_command(cmd);
  ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
  const std::vector<float> got = testing::read_f32_file(dir + "/logits.f32");
  fs::remove_all(dir);
  std::stringstream out(r.out);
  std::string line;
  size_t offset = 0;
  float worst = 0;
  for (const auto& c : index["cases"]) {
    ASSERT_TRUE(std::getline(out, line)) << r.out;
    EXPECT_EQ(nlohmann::json::parse(line)["output_ids"], c["greedy_ids"]);
    const auto want = testing::read_f32_file(source + "/goldens/" + c["logits_file"].get<std::string>());
    ASSERT_LE(offset + want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[offset + i] - want[i]));
    offset += want.size();
  }
  EXPECT_LE(worst, 1e-3f);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GenerateTorchLayoutsTest,
                         ::testing::Values(LayoutRun{"tiny-llama", 1, true}, LayoutRun{"tiny-llama", 1, false},
                                           LayoutRun{"tiny-llama", 2, true}, LayoutRun{"tiny-bloom", 1, true},
                                           LayoutRun{"tiny-bloom", 2, false}),
                         [](const auto& info) {
                           std::string m = info.param.model;
                           for (char& ch : m) if (ch == '-') ch = '_';
                           return m + "_tp" + std::to_string(info.param.world) + (info.param.inject ? "_fused" : "_plain");
                         });

}  // namespace
}  // namespace tessera
