// A cache file of streamed weights (model.weights_cache_dir, worker/weight_cache.h): the first
// start writes it and gives the logits of every weight resident; a second start reads the
// streamed layers back from it instead of the checkpoint, which the test proves by zeroing a
// streamed layer's matrix in the checkpoint (keeping its size and time) between the two: the
// logits stay bit for bit those of the first start. Int8 weights too. A checkpoint changed
// since, a file of another cache format, a damaged file, both a spill and a cache folder and a
// folder that cannot be made are refused naming the key and the file, and the file is left as
// it was (a folder not there yet is made).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "kernels/backend.h"
#include "tests/test_support.h"
#include "tests/worker/golden_model_fixture.h"
#include "worker/generator.h"
#include "worker/transformer.h"
#include "worker/weight_cache.h"
#include "worker/weight_residency.h"

namespace tessera {
// Named, not anonymous: a unity build puts other tests' helpers of the same names beside these.
namespace weight_cache_test {

namespace fs = std::filesystem;

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transformer> model;
  Status status = Status::ok();
};

Loaded load(const std::string& model, const std::string& budget, const std::string& cache_dir,
            WeightQuantization quant = WeightQuantization::kNone, WeightStreaming streaming = WeightStreaming::kRead) {
  Loaded l;
  l.backend = make_backend("cpu", BackendOptions{2, 0, KernelOptions{}}).value();
  ModelLoadOptions lo;
  lo.quant.kind = quant;
  lo.residency.budget = parse_weights_budget(budget).value();
  lo.residency.cache_dir = cache_dir;
  lo.residency.streaming = streaming;
  auto m = Transformer::load(model, lo, *l.backend);
  if (m.is_ok()) {
    l.model = std::move(m).value();
  } else {
    l.status = m.status();
  }
  return l;
}

// Every golden prompt's greedy ids and logits.
std::vector<GenerationResult> goldens_run(const Loaded& l) {
  Generator gen(*l.model, *l.backend);
  auto out = gen.generate(testing::golden_generation_requests(testing::fixtures_dir() + "/kjv-llama"),
                          /*keep_logits=*/true);
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  return out.is_ok() ? out.value() : std::vector<GenerationResult>{};
}

void expect_same(const std::vector<GenerationResult>& got, const std::vector<GenerationResult>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].output, want[i].output) << what << ", case " << i;
    EXPECT_EQ(got[i].logits, want[i].logits) << what << ", case " << i;
  }
}

// A copy of kjv-llama the test may change.
std::string copy_of_kjv_llama(const std::string& dir) {
  const std::string model = dir + "/kjv-llama";
  fs::create_directories(model);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(testing::fixtures_dir() + "/kjv-llama/" + f, model + "/" + f);
  return model;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

struct timespec modified(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mtim;
}

void set_modified(const std::string& path, struct timespec when) {
  const struct timespec times[2] = {when, when};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

// Zeroes one tensor of a safetensors file in place, keeping its size and modification time.
void zero_tensor_keeping_the_time(const std::string& file, const std::string& name) {
  const struct timespec when = modified(file);
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_bytes = 0;
  f.read(reinterpret_cast<char*>(&header_bytes), 8);
  std::string header(header_bytes, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_bytes));
  const auto entry = nlohmann::json::parse(header).at(name);
  const auto begin = entry["data_offsets"][0].get<uint64_t>(), end = entry["data_offsets"][1].get<uint64_t>();
  ASSERT_GT(end, begin) << name;
  const std::string zeros(end - begin, '\0');
  f.seekp(static_cast<std::streamoff>(8 + header_bytes + begin));
  f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
  f.close();
  set_modified(file, when);
}

class WeightCacheTest : public ::testing::TestWithParam<WeightStreaming> {};

TEST_P(WeightCacheTest, TheSecondStartReadsTheStreamedLayersBackInsteadOfLoadingThem) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-weight-cache");
  const std::string model = copy_of_kjv_llama(dir), cache = dir + "/cache";  // made by the first start

  Loaded first = load(model, "25%", cache, WeightQuantization::kNone, GetParam());
  ASSERT_TRUE(first.model) << first.status.to_string();
  ASSERT_NE(first.model->residency(), nullptr);
  EXPECT_FALSE(first.model->residency()->cache_reused());
  const std::string plan = first.model->residency()->plan();
  std::cout << "[ REPORT   ] " << plan << std::endl;
  EXPECT_NE(plan.find("(written now)"), std::string::npos) << plan;
  const std::vector<std::string> written = files_in(cache);
  ASSERT_EQ(written.size(), 1u) << "one cache file and nothing else (no partial file)";
  EXPECT_NE(written[0].find("kjv-llama-"), std::string::npos) << written[0];
  EXPECT_NE(written[0].find("-rank0of1.tessera-weights"), std::string::npos) << written[0];
  const std::vector<GenerationResult> want = goldens_run(first);
  {
    Loaded resident = load(model, "all", "");
    ASSERT_TRUE(resident.model) << resident.status.to_string();
    expect_same(want, goldens_run(resident), "the first start against every weight resident");
  }
  first = Loaded{};

  // The last layer streams at 25%; with its matrix zeroed in the checkpoint, a start that
  // loaded it would answer otherwise.
  const std::string layer = plan.find("5 layers") != std::string::npos ? "5" : "";
  ASSERT_FALSE(layer.empty()) << "kjv-llama's last layer should stream at 25%: " << plan;
  zero_tensor_keeping_the_time(model + "/model.safetensors", "model.layers." + layer + ".mlp.down_proj.weight");
  {
    Loaded changed = load(model, "all", "");
    ASSERT_TRUE(changed.model) << changed.status.to_string();
    const std::vector<GenerationResult> other = goldens_run(changed);
    ASSERT_EQ(other.size(), want.size());
    EXPECT_NE(other[0].logits, want[0].logits) << "zeroing the matrix changed nothing: the test proves nothing";
  }
  Loaded second = load(model, "25%", cache, WeightQuantization::kNone, GetParam());
  ASSERT_TRUE(second.model) << second.status.to_string();
  ASSERT_NE(second.model->residency(), nullptr);
  EXPECT_TRUE(second.model->residency()->cache_reused());
  EXPECT_NE(second.model->residency()->plan().find("(read back)"), std::string::npos)
      << second.model->residency()->plan();
  expect_same(goldens_run(second), want, "the second start against the first");
  EXPECT_EQ(files_in(cache), written);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Modes, WeightCacheTest, ::testing::Values(WeightStreaming::kMap, WeightStreaming::kRead),
                         [](const auto& info) { return std::string(weight_streaming_name(info.param)); });

TEST(WeightCache, Int8LayersReadBackGiveTheLogitsOfInt8Resident) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-weight-cache");
  const std::string model = testing::fixtures_dir() + "/kjv-llama";
  Loaded resident = load(model, "all", "", WeightQuantization::kInt8);
  ASSERT_TRUE(resident.model) << resident.status.to_string();
  const std::vector<GenerationResult> want = goldens_run(resident);
  for (int start = 0; start < 2; ++start) {
    Loaded cached = load(model, "25%", dir, WeightQuantization::kInt8);
    ASSERT_TRUE(cached.model) << cached.status.to_string();
    ASSERT_NE(cached.model->residency(), nullptr);
    EXPECT_EQ(cached.model->residency()->cache_reused(), start == 1);
    expect_same(goldens_run(cached), want, "int8 through the cache file, start " + std::to_string(start + 1));
  }
  // Another budget streams other units: a file of its own beside the first.
  ASSERT_EQ(files_in(dir).size(), 1u);
  Loaded half = load(model, "50%", dir, WeightQuantization::kInt8);
  ASSERT_TRUE(half.model) << half.status.to_string();
  EXPECT_FALSE(half.model->residency()->cache_reused());
  EXPECT_EQ(files_in(dir).size(), 2u);
  expect_same(goldens_run(half), want, "int8 at 50% through its own cache file");
  fs::remove_all(dir);
}

// Expects the load to be refused naming the key, the file, and `why`; the file stays.
void expect_refused(const Loaded& l, const std::string& file, const std::string& why) {
  ASSERT_EQ(l.model, nullptr) << "not refused: " << why;
  const std::string m = l.status.message();
  EXPECT_NE(m.find("model.weights_cache_dir"), std::string::npos) << m;
  EXPECT_NE(m.find(file), std::string::npos) << m;
  EXPECT_NE(m.find(why), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << "one line: " << m;
  EXPECT_TRUE(fs::exists(file)) << "the refused file was removed";
}

TEST(WeightCache, AChangedCheckpointAnotherFormatOrADamagedFileIsRefusedNamingIt) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-weight-cache");
  const std::string model = copy_of_kjv_llama(dir), cache = dir + "/cache";
  fs::create_directories(cache);
  ASSERT_TRUE(load(model, "25%", cache).model);
  ASSERT_EQ(files_in(cache).size(), 1u);
  const std::string file = cache + "/" + files_in(cache)[0];

  const std::string weights = model + "/model.safetensors";
  const struct timespec when = modified(weights);
  set_modified(weights, {when.tv_sec + 60, when.tv_nsec});
  expect_refused(load(model, "25%", cache), file, fs::weakly_canonical(weights).string() + "' had ");
  expect_refused(load(model, "25%", cache), file, "the model changed since");
  set_modified(weights, when);
  ASSERT_TRUE(load(model, "25%", cache).model) << "the checkpoint as it was: the file is used again";

  // The trailer rewritten as another format wrote it.
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  auto trailer = read_weight_cache_trailer(fd, fs::file_size(file));
  ASSERT_TRUE(trailer.is_ok()) << trailer.status().to_string();
  nlohmann::json contents = trailer.value().contents;
  contents["identity"]["format"] = 0;
  const std::string other = encode_weight_cache_trailer(contents);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(trailer.value().data_end)), 0);
  ASSERT_EQ(::pwrite(fd, other.data(), other.size(), static_cast<off_t>(trailer.value().data_end)),
            static_cast<ssize_t>(other.size()));
  expect_refused(load(model, "25%", cache), file, "written by cache format 0");

  // Cut short: no trailer.
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(trailer.value().data_end)), 0);
  ::close(fd);
  expect_refused(load(model, "25%", cache), file, "is not a Tessera weight cache file");

  // Both folders; a folder that cannot be made (a file is in the way; one not there is made).
  Loaded both = [&] {
    Loaded l;
    l.backend = make_backend("cpu").value();
    ModelLoadOptions lo;
    lo.residency.budget = parse_weights_budget("25%").value();
    lo.residency.cache_dir = cache;
    lo.residency.spill_dir = dir;
    auto m = Transformer::load(model, lo, *l.backend);
    l.status = m.status();
    return l;
  }();
  EXPECT_NE(both.status.message().find("model.weights_spill_dir"), std::string::npos) << both.status.to_string();
  EXPECT_NE(both.status.message().find("model.weights_cache_dir"), std::string::npos) << both.status.to_string();
  const std::string blocked = model + "/config.json/cache";
  const Loaded nowhere = load(model, "25%", blocked);
  ASSERT_EQ(nowhere.model, nullptr);
  EXPECT_NE(nowhere.status.message().find("model.weights_cache_dir"), std::string::npos) << nowhere.status.to_string();
  EXPECT_NE(nowhere.status.message().find(blocked), std::string::npos) << nowhere.status.to_string();
  fs::remove_all(dir);
}


// A trailer whose checksum holds but whose records do not describe the file (edited by hand,
// written by a broken tool): every such file is refused naming the key, never read past its
// units or taken for a layer of another shape.
TEST(WeightCache, RecordsThatDoNotDescribeTheFileAreRefused) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-weight-cache");
  const std::string model = testing::fixtures_dir() + "/kjv-llama";
  ASSERT_TRUE(load(model, "25%", dir).model);
  ASSERT_EQ(files_in(dir).size(), 1u);
  const std::string file = dir + "/" + files_in(dir)[0];
  const std::string original = testing::read_file(file);
  const int fd = ::open(file.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  auto trailer = read_weight_cache_trailer(fd, original.size());
  ::close(fd);
  ASSERT_TRUE(trailer.is_ok()) << trailer.status().to_string();
  const nlohmann::json good = trailer.value().contents;
  using Edit = std::function<void(nlohmann::json&)>;
  auto tensor = [](nlohmann::json& c) -> nlohmann::json& {  // layer 5's first matrix
    for (auto& r : c["units"]["layer 5"]["tensors"])
      if (!r.is_null() && r[1].size() >= 2) return r;
    return c["units"]["layer 5"]["tensors"][0];
  };
  const std::vector<std::pair<std::string, Edit>> edits = {
      {"a unit past the file", [](nlohmann::json& c) { c["units"]["layer 5"]["offset"] = uint64_t{1} << 40; }},
      {"a span past the file", [](nlohmann::json& c) { c["units"]["layer 5"]["span"] = uint64_t{1} << 50; }},
      {"a unit off its alignment", [](nlohmann::json& c) { c["units"]["layer 5"]["offset"] = 4096 + 64; }},
      {"a negative offset", [](nlohmann::json& c) { c["units"]["layer 5"]["offset"] = -4096; }},
      {"an unknown dtype", [&](nlohmann::json& c) { tensor(c)[0] = 99; }},
      {"a negative size", [&](nlohmann::json& c) { tensor(c)[1][0] = -1; }},
      {"a size past its unit", [&](nlohmann::json& c) { tensor(c)[1][0] = int64_t{1} << 30; }},
      {"sizes whose product overflows", [&](nlohmann::json& c) { tensor(c)[1] = {1, int64_t{1} << 40, int64_t{1} << 40}; }},
      {"a row stride below a row", [&](nlohmann::json& c) { tensor(c)[2] = 1; }},
      {"a tensor before its unit", [&](nlohmann::json& c) { tensor(c)[3] = 0; }},
      {"a record of another form", [&](nlohmann::json& c) { tensor(c) = "x"; }},
      {"a tensor too few", [](nlohmann::json& c) { c["units"]["layer 5"]["tensors"].erase(0); }},
      {"fields of another form", [](nlohmann::json& c) { c["units"]["layer 5"]["fields"] = {{"experts", "many"}}; }},
      {"a split of another type", [](nlohmann::json& c) { c["units"]["layer 5"]["fields"]["attn_split"] = 3; }},
      {"a million experts", [](nlohmann::json& c) { c["units"]["layer 5"]["fields"]["experts"] = 1000000; }},
      {"two units in one place",
       [](nlohmann::json& c) { c["units"]["layer 4"]["offset"] = c["units"]["layer 5"]["offset"]; }},
      {"a unit this start does not stream", [](nlohmann::json& c) { c["units"]["LM head"] = c["units"]["layer 5"]; }},
      {"a unit missing", [](nlohmann::json& c) { c["units"].erase("embedding table"); }},
      {"a negative layer count", [](nlohmann::json& c) { c["layers"] = -1; }},
      {"units of another form", [](nlohmann::json& c) { c["units"] = nlohmann::json::array(); }},
      {"an identity of another form", [](nlohmann::json& c) { c["identity"]["files"] = "all"; }},
  };
  for (const auto& [what, edit] : edits) {
    nlohmann::json contents = good;
    edit(contents);
    testing::write_file(file, original.substr(0, trailer.value().data_end) + encode_weight_cache_trailer(contents));
    const Loaded l = load(model, "25%", dir);
    EXPECT_EQ(l.model, nullptr) << what << ": not refused";
    EXPECT_NE(l.status.message().find("model.weights_cache_dir"), std::string::npos) << what << ": " << l.status.to_string();
  }
  testing::write_file(file, original);
  EXPECT_TRUE(load(model, "25%", dir).model) << "the file as written is read back";
  fs::remove_all(dir);
}

}  // namespace weight_cache_test
}  // namespace tessera
