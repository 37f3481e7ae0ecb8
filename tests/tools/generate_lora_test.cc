// Mixed LoRA batches (issue 39, acceptance 2): 32 kjv-llama sequences, every fifth of the base
// and the others of four adapters of ranks 8, 16, 64 and 16 targeting different modules, run
// together in one tessera-generate process (at tensor-parallel 1 and 2) give every sequence
// exactly the greedy tokens it gets when run alone with its adapter.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tests/data_on_64_bytes.h"
#include "tests/test_support.h"
#include "tests/worker/golden_model_fixture.h"

namespace tessera {
namespace {

using nlohmann::json;

// 32 sequences; 10 under the sanitizers (each adapter and the base model twice), which look for
// memory errors the same code reaches with fewer (32 took 35 s there, each run alone a process).
constexpr size_t kSequences = testing::kSanitizedBuild ? 10 : 32;

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

std::vector<std::vector<int32_t>> outputs_of(const testing::CommandResult& r) {
  std::vector<std::vector<int32_t>> out;
  size_t at = 0;
  while (at < r.out.size()) {
    const size_t end = r.out.find('\n', at);
    const json j = json::parse(r.out.substr(at, end - at), nullptr, false);
    if (j.is_object()) out.push_back(j["output_ids"].get<std::vector<int32_t>>());
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return out;
}

TEST(GenerateLora, EverySequenceOfAMixedBatchGetsItsSingleRequestTokens) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = testing::fixtures_dir() + "/kjv-llama";
  const std::string dir = testing::make_temp_dir("tessera-generate-lora");
  const std::vector<std::pair<std::string, std::string>> adapters = {
      {"r8", "--lora-rank 8 --lora-alpha 64 --seed 1"},
      {"r16", "--lora-rank 16 --lora-alpha 128 --lora-targets q_proj,v_proj --seed 2"},
      {"r64", "--lora-rank 64 --lora-alpha 32 --lora-rslora --seed 3"},
      {"r16mlp", "--lora-rank 16 --lora-alpha 128 --lora-targets gate_proj,up_proj,down_proj --seed 4"},
  };
  std::string lora_flags;
  for (const auto& [name, flags] : adapters) {
    const testing::CommandResult made = testing::run_command(testing::bin_dir() + "/tessera-make-checkpoint --lora-of " +
                                                             model + " --out " + dir + "/" + name + " " + flags + " 2>&1");
    ASSERT_EQ(made.exit_code, 0) << made.out;
    lora_flags += " --lora " + name + "=" + dir + "/" + name;
  }
  // kSequences prompts: prefixes of the goldens' prompts, each sequence its own.
  const std::vector<testing::GoldenIds> goldens = testing::read_golden_ids(model);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> names;
  std::string file_text, names_text;
  for (int i = 0; prompts.size() < kSequences; ++i) {
    const std::vector<int32_t>& g = goldens[static_cast<size_t>(i) % goldens.size()].prompt;
    const auto len = static_cast<size_t>(
        std::max<int64_t>(1, static_cast<int64_t>(g.size()) - i / static_cast<int64_t>(goldens.size())));
    prompts.emplace_back(g.begin(), g.begin() + static_cast<std::ptrdiff_t>(len));
    names.push_back(i % 5 == 0 ? "-" : adapters[static_cast<size_t>(i % 5 - 1)].first);
    file_text += ids_text(prompts.back()) + "\n";
    names_text += (names_text.empty() ? "" : ",") + names.back();
  }
  testing::write_file(dir + "/prompts.txt", file_text);
  const std::string generate = testing::bin_dir() + "/tessera-generate --model " + model +
                               " --threads 1 --json --max-new-tokens 10" + lora_flags;

  std::vector<std::vector<int32_t>> alone;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const testing::CommandResult r =
        testing::run_command(generate + " --prompt-ids " + ids_text(prompts[i]) + " --prompt-lora " + names[i]);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto out = outputs_of(r);
    ASSERT_EQ(out.size(), 1u) << r.out;
    alone.push_back(out[0]);
  }
  // Every adapter resident, then at most 2 and 1 resident (lora.max_loras: the others wait in
  // host memory, and the scheduler runs at most that many adapters at once).
  // (The sanitized build runs the first and the last: one rank and all, ranks and the limit.)
  for (const std::string flags : {" --tensor-parallel 1", " --tensor-parallel 2", " --tensor-parallel 1 --lora-max-loras 2",
                                  " --tensor-parallel 2 --lora-max-loras 1"}) {
    if (testing::kSanitizedBuild && (flags == " --tensor-parallel 2" || flags == " --tensor-parallel 1 --lora-max-loras 2"))
      continue;
    const testing::CommandResult mixed =
        testing::run_command(generate + " --prompt-ids-file " + dir + "/prompts.txt --prompt-lora " + names_text + flags);
    ASSERT_EQ(mixed.exit_code, 0) << mixed.err;
    const auto together = outputs_of(mixed);
    ASSERT_EQ(together.size(), prompts.size()) << mixed.out;
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(together[i], alone[i]) << "sequence " << i << " (" << names[i] << ") with" << flags;
  }
  // The adapters change the tokens (the base's first prompt with each adapter), or the
  // comparison could not tell a wrong adapter apart.
  int differ = 0;
  for (const auto& [name, flags] : adapters) {
    const auto out = outputs_of(testing::run_command(generate + " --prompt-ids " + ids_text(prompts[0]) +
                                                     " --prompt-lora " + name));
    differ += out.size() == 1 && out[0] != alone[0] ? 1 : 0;
  }
  EXPECT_GE(differ, 3);
}

// With 25% of the weights resident and the layers mapped from the checkpoint as stored (a copy
// with its data on 64 bytes; q, k, v and gate, up then unpacked), an adapter on q, v and the MLP gives
// the tokens it gives with every weight resident, and changes them.
TEST(GenerateLora, LayersMappedFromTheCheckpointTakeTheAdapter) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = testing::copy_with_data_on_64_bytes(testing::fixtures_dir() + "/kjv-llama");
  const std::string dir = testing::make_temp_dir("tessera-generate-lora-mapped");
  const testing::CommandResult made = testing::run_command(
      testing::bin_dir() + "/tessera-make-checkpoint --lora-of " + model + " --out " + dir +
      "/a --lora-rank 8 --lora-alpha 64 --lora-targets q_proj,v_proj,gate_proj,up_proj,down_proj --seed 5 2>&1");
  ASSERT_EQ(made.exit_code, 0) << made.out;
  const std::vector<testing::GoldenIds> goldens = testing::read_golden_ids(testing::fixtures_dir() + "/kjv-llama");
  const std::string generate = "TESSERA_LOG_LEVEL=info " + testing::bin_dir() + "/tessera-generate --model " + model +
                               " --threads 1 --json --max-new-tokens 12 --prompt-ids " + ids_text(goldens[0].prompt) +
                               " --lora a=" + dir + "/a";
  const testing::CommandResult base = testing::run_command(generate);
  const testing::CommandResult resident = testing::run_command(generate + " --prompt-lora a");
  const testing::CommandResult mapped =
      testing::run_command(generate + " --prompt-lora a --weights-budget 25% --weights-streaming map");
  for (const auto* r : {&base, &resident, &mapped}) ASSERT_EQ(r->exit_code, 0) << r->err;
  EXPECT_NE(mapped.err.find("model.safetensors (as stored)"), std::string::npos) << mapped.err;
  ASSERT_EQ(outputs_of(mapped).size(), 1u) << mapped.out;
  EXPECT_EQ(outputs_of(mapped), outputs_of(resident));
  EXPECT_NE(outputs_of(resident), outputs_of(base)) << "the adapter changes nothing: the comparison tells nothing";
}

}  // namespace
}  // namespace tessera
