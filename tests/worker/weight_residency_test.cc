// Weight streaming on the CPU backend (worker/weight_residency.h): kjv-llama with 25% of its
// weights resident gives its goldens (ids, logits within 1e-3), and int8 weights streamed give
// the logits of int8 weights resident, bit for bit; the accounting stays within the budget
// plus the units in flight, and the process's own pages where the streamed units lie (the
// spill file, or the checkpoint file they are mapped from as stored) stay within what is in
// flight while each layer runs; bad budgets and spill folders are
// refused naming the key. Each of map, read and direct.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "kernels/backend.h"
#include "tests/data_on_64_bytes.h"
#include "tests/test_support.h"
#include "worker/generator.h"
#include "worker/transformer.h"

namespace tessera {
// Named, not anonymous: a unity build may compile this file beside another test file with
// helpers of the same names.
namespace weight_residency_test {

// This process's pages where the streamed units lie (the spill file's mapping or region, the
// checkpoint files' mappings: worker/checkpoint_backing.h), from /proc/self/pagemap's present
// bit; a page two units share counts once.
int64_t streamed_rss(const WeightResidency& r) {
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  std::set<uintptr_t> present;
  for (const auto& [begin, bytes] : r.streamed_ranges()) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(begin) / 4096, end = (reinterpret_cast<uintptr_t>(begin) + bytes + 4095) / 4096;
    std::vector<uint64_t> entries(end - first);
    const ssize_t n = ::pread(fd, entries.data(), entries.size() * 8, static_cast<off_t>(first * 8));
    for (ssize_t i = 0; i < n / 8; ++i)
      if (entries[static_cast<size_t>(i)] >> 63) present.insert(first + static_cast<uintptr_t>(i));
  }
  ::close(fd);
  return static_cast<int64_t>(present.size()) * 4096;
}

// kjv-llama with its data on 64 bytes, as Tessera's writer lays a file out (its own starts 48
// bytes off, which UnitsConvertedAtLoad... below streams from too). Made once per process.
std::string aligned_kjv_llama() {
  static const std::string dir = testing::copy_with_data_on_64_bytes(testing::fixtures_dir() + "/kjv-llama");
  return dir;
}

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transformer> model;
};

Loaded load(const std::string& budget, WeightQuantization quant = WeightQuantization::kNone,
            WeightStreaming streaming = WeightStreaming::kRead, DType dtype = DType::kF32,
            Bf16Coding coding = Bf16Coding::kOff) {
  Loaded l;
  auto b = make_backend("cpu", BackendOptions{2, 0, KernelOptions{}});
  EXPECT_TRUE(b.is_ok());
  l.backend = std::move(b).value();
  ModelLoadOptions lo;
  lo.dtype = dtype;
  lo.quant.kind = quant;
  // Coded (model.bf16_coding on) or not on both sides of a comparison, bit for bit: the same
  // kernels on both sides.
  lo.quant.bf16_coding = coding;
  lo.residency.budget = parse_weights_budget(budget).value();
  lo.residency.streaming = streaming;
  auto m = Transformer::load(aligned_kjv_llama(), lo, *l.backend);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  if (m.is_ok()) l.model = std::move(m).value();
  return l;
}

std::vector<GenerationRequest> golden_requests(std::vector<std::vector<int32_t>>* greedy) {
  std::ifstream in(testing::fixtures_dir() + "/kjv-llama/goldens/index.json");
  const auto index = nlohmann::json::parse(in);
  std::vector<GenerationRequest> reqs;
  for (const auto& c : index["cases"]) {
    GenerationRequest r;
    r.prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    r.max_new_tokens = static_cast<int>(c["greedy_ids"].size());
    reqs.push_back(r);
    greedy->push_back(c["greedy_ids"].get<std::vector<int32_t>>());
  }
  return reqs;
}

// The goldens' prompts on both, batched: the same tokens and logits, bit for bit.
void expect_same_tokens_and_logits(const Loaded& streamed, const Loaded& resident) {
  std::vector<std::vector<int32_t>> greedy;
  const std::vector<GenerationRequest> reqs = golden_requests(&greedy);
  Generator a(*streamed.model, *streamed.backend), b(*resident.model, *resident.backend);
  auto got = a.generate(reqs, true), want = b.generate(reqs, true);
  ASSERT_TRUE(got.is_ok() && want.is_ok());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got.value()[i].output, want.value()[i].output) << "case " << i;
    EXPECT_EQ(got.value()[i].logits, want.value()[i].logits) << "case " << i;
  }
}

// Whether files in the default spill folder ($TMPDIR, else /var/tmp) can be read with O_DIRECT,
// as weights_streaming direct reads them (an overlay filesystem in a container may refuse).
bool spill_folder_takes_direct_reads() {
  const char* tmp = std::getenv("TMPDIR");
  std::string name = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/var/tmp") + "/tessera-odirect-XXXXXX";
  const int fd = ::mkstemp(name.data());
  if (fd < 0) return false;
  ::unlink(name.c_str());
  const int direct = ::open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDONLY | O_DIRECT);
  if (direct >= 0) ::close(direct);
  ::close(fd);
  return direct >= 0;
}

// Each way of bringing a unit in (model.weights_streaming): map, read, direct.
class WeightStreamingTest : public ::testing::TestWithParam<WeightStreaming> {
 protected:
  void SetUp() override {
    if (GetParam() == WeightStreaming::kDirect && !spill_folder_takes_direct_reads())
      GTEST_SKIP() << "SKIPPED: the spill folder's filesystem does not take O_DIRECT reads (direct is refused there "
                      "at start-up, naming model.weights_streaming)";
  }
};

TEST_P(WeightStreamingTest, AQuarterResidentGivesTheGoldensWithinTheBudgetAndWhatIsInFlight) {
  TESSERA_REQUIRE_FIXTURES();
  Loaded streamed = load("25%", WeightQuantization::kNone, GetParam());
  ASSERT_TRUE(streamed.model);
  const WeightResidency* r = streamed.model->residency();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->streaming(), GetParam());
  std::cout << "[ REPORT   ] " << r->plan() << std::endl;
  // kjv-llama is stored in f32, as computed here: every streamed unit (the embedding table
  // and 5 layers) comes from the checkpoint file, read and direct bringing the layers into
  // the process's own pages; direct reads them from the spill file instead where the
  // checkpoint's filesystem refuses O_DIRECT (the table's rows still from the checkpoint).
  const int ckpt_fd = ::open((aligned_kjv_llama() + "/model.safetensors").c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  const bool direct_from_checkpoint = ckpt_fd >= 0;
  if (ckpt_fd >= 0) ::close(ckpt_fd);
  EXPECT_EQ(r->checkpoint_units(), GetParam() != WeightStreaming::kDirect || direct_from_checkpoint ? 6 : 1);
  const int64_t all = streamed.model->weights().total_bytes;
  EXPECT_LE(r->budget_bytes(), all / 4 + 1);
  std::vector<std::vector<int32_t>> greedy;
  const std::vector<GenerationRequest> reqs = golden_requests(&greedy);
  Generator gen(*streamed.model, *streamed.backend);
  auto out = gen.generate(reqs, /*keep_logits=*/true);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(out.value()[i].output, greedy[i]) << "case " << i;
  // The process holds no page of the files streamed from beyond what is in flight after a step
  // (read before another model maps the same file).
  const int64_t rss = streamed_rss(*r);
  ASSERT_GE(rss, 0) << "/proc/self/pagemap cannot be read";
  EXPECT_LE(rss, r->in_flight_bytes() + 16 * 4096 * r->prefetch_layers()) << "pages of released layers stay in the process";

  // The same logits as every weight resident (the goldens' own check is tessera-generate's).
  Loaded resident = load("all");
  ASSERT_TRUE(resident.model);
  EXPECT_EQ(resident.model->residency(), nullptr);
  Generator plain(*resident.model, *resident.backend);
  auto want = plain.generate(reqs, true);
  ASSERT_TRUE(want.is_ok());
  float worst = 0;
  for (size_t i = 0; i < reqs.size(); ++i)
    for (size_t k = 0; k < want.value()[i].logits.size(); ++k)
      worst = std::max(worst, std::fabs(out.value()[i].logits[k] - want.value()[i].logits[k]));
  EXPECT_EQ(worst, 0.0f) << "the same weights in the same layout, only read from elsewhere";

  // The accounting: never more than the budget plus the units in flight; and streaming happened.
  const int64_t bound = r->budget_bytes() + r->prefetch_layers() * r->largest_streamed_bytes();
  EXPECT_LE(r->peak_resident_bytes(), bound);
  EXPECT_GT(r->peak_resident_bytes(), r->resident_bytes() - r->in_flight_bytes()) << "nothing was streamed";
  std::cout << "[ REPORT   ] peak resident " << r->peak_resident_bytes() << " bytes, budget " << r->budget_bytes()
            << ", bound " << bound << ", all weights " << all << std::endl;
}

// While a layer runs, the process's pages of the streamed units are at most those in flight:
// each layer's tensors are read through whole between before_layer and after_layer (what a
// step does), and the mapping's Rss is read in between.
TEST_P(WeightStreamingTest, TheProcessHoldsOnlyTheLayersInFlight) {
  TESSERA_REQUIRE_FIXTURES();
  Loaded streamed = load("25%", WeightQuantization::kNone, GetParam());
  ASSERT_TRUE(streamed.model);
  auto* r = const_cast<WeightResidency*>(streamed.model->residency());
  ASSERT_NE(r, nullptr);
  auto& weights = const_cast<ModelWeights&>(streamed.model->weights());
  int64_t worst = 0;
  for (int step = 0; step < 2; ++step) {
    for (int l = 0; l < static_cast<int>(weights.layers.size()); ++l) {
      r->before_layer(l);
      volatile uint8_t sink = 0;
      for_each_layer_tensor(weights.layers[l], [&](Tensor& t) {
        if (t.empty()) return;
        const auto* p = static_cast<const uint8_t*>(t.view().data);
        for (size_t i = 0; i < t.nbytes(); i += 512) sink = sink + p[i];
      });
      const int64_t rss = streamed_rss(*r);
      worst = std::max(worst, rss);
      // (The kernel may map up to 16 pages around a fault or a populate into the next unit;
      // from a checkpoint file whose page-cache pages are large folios, as a file just
      // written on ext4 has, a whole folio of up to 2 MiB beyond each end of a unit in flight.
      // Released with the unit: the check after a step in the test above.)
      const int64_t around = r->checkpoint_units() > 0 ? 2 * (int64_t{2} << 20) : 16 * 4096;
      EXPECT_LE(rss, r->in_flight_bytes() + around * r->prefetch_layers()) << "layer " << l;
      r->after_layer(l);
    }
  }
  EXPECT_GT(worst, 0) << "no page of a streamed unit was ever read";
  std::cout << "[ REPORT   ] most of the streamed units resident while a layer ran: " << worst << " bytes (largest unit "
            << r->largest_streamed_bytes() << ")" << std::endl;
}

TEST_P(WeightStreamingTest, Int8WeightsStreamedGiveTheLogitsOfInt8Resident) {
  TESSERA_REQUIRE_FIXTURES();
  Loaded streamed = load("25%", WeightQuantization::kInt8, GetParam()), resident = load("all", WeightQuantization::kInt8);
  ASSERT_TRUE(streamed.model && resident.model);
  ASSERT_NE(streamed.model->residency(), nullptr);
  expect_same_tokens_and_logits(streamed, resident);
}

// Coded bf16 layers (model.bf16_coding on) stream from the spill file in their 12 bits, never
// from the checkpoint (they are not as stored there): the logits of coded weights all resident,
// bit for bit, within the budget and what is in flight.
TEST_P(WeightStreamingTest, CodedBf16WeightsStreamedGiveTheLogitsOfCodedResident) {
  TESSERA_REQUIRE_FIXTURES();
  Loaded streamed = load("25%", WeightQuantization::kNone, GetParam(), DType::kBF16, Bf16Coding::kOn);
  Loaded resident = load("all", WeightQuantization::kNone, WeightStreaming::kRead, DType::kBF16, Bf16Coding::kOn);
  ASSERT_TRUE(streamed.model && resident.model);
  const WeightResidency* r = streamed.model->residency();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->checkpoint_units(), 0) << r->plan();
  const int coded = coded_bf16_linears(streamed.model->weights());
  EXPECT_EQ(coded, coded_bf16_linears(resident.model->weights()));
  EXPECT_GT(coded, 0);
  expect_same_tokens_and_logits(streamed, resident);
  EXPECT_GT(r->streamed_bytes(), 0);
  EXPECT_LE(r->peak_resident_bytes(), r->budget_bytes() + r->prefetch_layers() * r->largest_streamed_bytes());
}

// One layer streamed, one in flight, on a model with a tied head (no table read by rows): each
// step's fetch of that layer finds the spare pages the last step released still holding it
// and reads nothing; the logits stay those of every weight resident.
TEST_P(WeightStreamingTest, TheOneStreamedLayerIsKeptBetweenStepsWhereItCan) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::fixtures_dir() + "/tiny-llama3";
  auto backend = make_backend("cpu", BackendOptions{2, 0, KernelOptions{}}).value();
  ModelLoadOptions lo;
  lo.residency.streaming = GetParam();
  lo.residency.prefetch_layers = 1;
  std::unique_ptr<Transformer> streamed;
  for (int share = 95; share >= 50 && streamed == nullptr; share -= 5) {
    lo.residency.budget = parse_weights_budget(std::to_string(share) + "%").value();
    auto m = Transformer::load(dir, lo, *backend);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    const WeightResidency* r = m.value()->residency();
    if (r != nullptr && r->plan().find("streamed") != std::string::npos &&
        r->plan().find("(1 layer;") != std::string::npos)
      streamed = std::move(m).value();
  }
  ASSERT_NE(streamed, nullptr) << "no share from 95% to 50% streams exactly one layer of " << dir;
  std::cout << "[ REPORT   ] " << streamed->residency()->plan() << std::endl;
  lo.residency = WeightResidencyOptions{};
  auto resident = Transformer::load(dir, lo, *backend);
  ASSERT_TRUE(resident.is_ok());
  GenerationRequest req;
  req.prompt = {1, 5, 9, 13, 17};
  req.max_new_tokens = 12;
  Generator a(*streamed, *backend), b(*resident.value(), *backend);
  auto got = a.generate({req}, true), want = b.generate({req}, true);
  ASSERT_TRUE(got.is_ok() && want.is_ok());
  EXPECT_EQ(got.value()[0].output, want.value()[0].output);
  EXPECT_EQ(got.value()[0].logits, want.value()[0].logits);
  const WeightResidency* r = streamed->residency();
  EXPECT_LE(r->peak_resident_bytes(), r->budget_bytes() + r->largest_streamed_bytes());
}

INSTANTIATE_TEST_SUITE_P(Modes, WeightStreamingTest,
                         ::testing::Values(WeightStreaming::kMap, WeightStreaming::kRead, WeightStreaming::kDirect),
                         [](const auto& info) { return std::string(weight_streaming_name(info.param)); });

// kjv-llama (stored in f32) computed in bf16: every tensor is converted at load, so nothing
// lies in the checkpoint as the kernels read it, and every streamed unit goes to the spill
// file, mapped from there; the logits are those of bf16 resident, bit for bit. In f32 with a
// spill folder named, the folder takes every streamed unit (the checkpoint may be on a
// network volume). The fixture as it is, its data 48 bytes off 64, streams from the checkpoint
// as the copy on 64 bytes does.
TEST(WeightResidency, UnitsConvertedAtLoadOrGivenASpillFolderStreamFromTheSpillFile) {
  TESSERA_REQUIRE_FIXTURES();
  {
    auto backend = make_backend("cpu", BackendOptions{2, 0, KernelOptions{}});
    ASSERT_TRUE(backend.is_ok());
    ModelLoadOptions lo;
    lo.residency.budget = parse_weights_budget("25%").value();
    lo.residency.streaming = WeightStreaming::kMap;
    lo.residency.spill_dir = testing::make_temp_dir("tessera-spill-named");
    auto m = Transformer::load(aligned_kjv_llama(), lo, *backend.value());
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    ASSERT_NE(m.value()->residency(), nullptr);
    EXPECT_EQ(m.value()->residency()->checkpoint_units(), 0) << m.value()->residency()->plan();
  }
  {
    // The fixture as it is: the kernels load weights unaligned, so its layers (f32 on
    // multiples of 4 bytes) and its table are mapped from the checkpoint too.
    auto backend = make_backend("cpu", BackendOptions{2, 0, KernelOptions{}});
    ASSERT_TRUE(backend.is_ok());
    ModelLoadOptions lo;
    lo.residency.budget = parse_weights_budget("25%").value();
    lo.residency.streaming = WeightStreaming::kMap;
    auto m = Transformer::load(testing::fixtures_dir() + "/kjv-llama", lo, *backend.value());
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    ASSERT_NE(m.value()->residency(), nullptr);
    const WeightResidency* r = m.value()->residency();
    EXPECT_EQ(r->checkpoint_units(), static_cast<int>(r->streamed_ranges().size())) << r->plan();
    EXPECT_GT(r->checkpoint_units(), 1) << r->plan();
  }
  Loaded streamed = load("25%", WeightQuantization::kNone, WeightStreaming::kMap, DType::kBF16);
  ASSERT_TRUE(streamed.model);
  const WeightResidency* r = streamed.model->residency();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->checkpoint_units(), 0) << r->plan();
  EXPECT_NE(r->plan().find("from an unlinked spill file"), std::string::npos) << r->plan();
  std::vector<std::vector<int32_t>> greedy;
  const std::vector<GenerationRequest> reqs = golden_requests(&greedy);
  Generator gen(*streamed.model, *streamed.backend);
  auto out = gen.generate(reqs, /*keep_logits=*/true);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  Loaded resident = load("all", WeightQuantization::kNone, WeightStreaming::kRead, DType::kBF16);
  ASSERT_TRUE(resident.model);
  Generator plain(*resident.model, *resident.backend);
  auto want = plain.generate(reqs, true);
  ASSERT_TRUE(want.is_ok());
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(out.value()[i].logits, want.value()[i].logits) << "case " << i;
}

TEST(WeightResidency, BadBudgetsAndSpillFoldersAreRefusedNamingTheKey) {
  TESSERA_REQUIRE_FIXTURES();
  auto backend = make_backend("cpu").value();
  ModelLoadOptions lo;
  lo.residency.budget = parse_weights_budget("1").value();
  auto tiny = Transformer::load(testing::fixtures_dir() + "/kjv-llama", lo, *backend);
  ASSERT_FALSE(tiny.is_ok());
  EXPECT_NE(tiny.status().message().find("model.weights_memory_budget 1 "), std::string::npos) << tiny.status().to_string();
  EXPECT_NE(tiny.status().message().find("below the norms and biases every step reads"), std::string::npos);
  // GPT-2's learned position table is read every step too, and named.
  auto gpt2 = Transformer::load(testing::fixtures_dir() + "/tiny-gpt2", lo, *backend);
  ASSERT_FALSE(gpt2.is_ok());
  EXPECT_NE(gpt2.status().message().find("below the norms, biases and position table every step reads"),
            std::string::npos)
      << gpt2.status().to_string();
  // A byte count below one layer (kjv-llama's are 1.5 MiB) is taken for a slip of unit; a
  // share that small streams every layer, as asked.
  lo.residency.budget = parse_weights_budget("100KiB").value();
  auto slip = Transformer::load(testing::fixtures_dir() + "/kjv-llama", lo, *backend);
  ASSERT_FALSE(slip.is_ok());
  EXPECT_NE(slip.status().message().find("is below this rank's largest layer"), std::string::npos)
      << slip.status().to_string();
  lo.residency.budget = parse_weights_budget("1%").value();
  auto every_layer = Transformer::load(testing::fixtures_dir() + "/kjv-llama", lo, *backend);
  ASSERT_TRUE(every_layer.is_ok()) << every_layer.status().to_string();
  EXPECT_NE(every_layer.value()->streaming_plan().find("6 layers"), std::string::npos)
      << every_layer.value()->streaming_plan();
  lo.residency.budget = parse_weights_budget("25%").value();
  lo.residency.spill_dir = "/nonexistent/spill";
  auto nowhere = Transformer::load(testing::fixtures_dir() + "/kjv-llama", lo, *backend);
  ASSERT_FALSE(nowhere.is_ok());
  EXPECT_NE(nowhere.status().message().find("model.weights_spill_dir"), std::string::npos) << nowhere.status().to_string();
  EXPECT_NE(nowhere.status().message().find("/nonexistent/spill"), std::string::npos);
  for (const char* bad : {"0", "0%", "100%", "-5", "12 parsecs", "lots", "25"}) {
    const auto b = parse_weights_budget(bad);
    if (std::string(bad) == "25") {
      EXPECT_TRUE(b.is_ok());  // 25 bytes: a byte count
      continue;
    }
    EXPECT_FALSE(b.is_ok()) << bad;
    if (!b.is_ok()) {
      EXPECT_NE(b.status().message().find(std::string("'") + bad + "'"), std::string::npos);
    }
  }
  EXPECT_EQ(parse_weights_budget("6GiB").value().bytes, int64_t{6} << 30);
  EXPECT_EQ(parse_weights_budget("500MB").value().bytes, 500000000);
  EXPECT_DOUBLE_EQ(parse_weights_budget("25%").value().share, 0.25);
  EXPECT_TRUE(parse_weights_budget("all").value().all());
}

}  // namespace
}  // namespace tessera
