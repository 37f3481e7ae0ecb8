// n > 1 on the real kjv-llama model: one request with n = 4 choices prefills its 64-token
// prompt once and forks (choices 1..3 sample from its logits), and its choices are exactly what 4 separate n = 1 requests seeded
// seed, seed + 1, seed + 2, seed + 3 draw (what the API layer asked the engine for before the
// fork existed). The block manager's counters and the tokens fed to the model show the
// prompt was allocated and computed once.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "coordinator/engine/engine.h"
#include "coordinator/engine/request.h"
#include "kernels/backend.h"
#include "tests/scripted_executor.h"
#include "tests/test_support.h"
#include "worker/executor.h"
#include "worker/transformer.h"

namespace tessera {
namespace {

constexpr int kPromptLen = 64;
constexpr int kChoices = 4;
constexpr int kMaxTokens = 12;
constexpr uint64_t kSeed = 1234;

struct EngineRun {
  std::map<int, std::vector<int32_t>> outputs;  // by choice
  BlockManagerStats blocks;
  int64_t fed = 0;
};

class EngineForkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::fixtures_dir().empty()) GTEST_SKIP() << "SKIPPED: ../shared/fixtures not found";
    auto b = make_backend("cpu");
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    backend_ = std::move(b).value();
    auto m = Transformer::load(testing::fixtures_dir() + "/kjv-llama", ModelLoadOptions{}, *backend_);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    model_ = std::move(m).value();
  }

  SchedulerConfig config() const {
    SchedulerConfig c;
    c.block_size = 16;
    c.num_blocks = 64;
    c.max_model_len = 256;
    return c;
  }

  std::vector<int32_t> prompt() const {
    std::vector<int32_t> p(kPromptLen);
    const int32_t vocab = static_cast<int32_t>(model_->config().vocab);
    for (int i = 0; i < kPromptLen; ++i) p[static_cast<size_t>(i)] = 3 + (i * 37 + 11) % (vocab - 3);
    return p;
  }

  std::shared_ptr<Request> sampled_request(int n, uint64_t seed) const {
    auto r = std::make_shared<Request>();
    r->prompt = prompt();
    r->n = n;
    r->max_tokens = kMaxTokens;
    r->sampling.temperature = 1.0f;  // a wide distribution: a choice sampled wrong shows
    r->sampling.top_k = 40;
    r->sampling.seed = seed;
    r->stop.ignore_eos = true;
    return r;
  }

  // Runs `requests` (by id) to the end on a fresh engine and KV cache.
  EngineRun run(const std::map<RequestId, std::shared_ptr<const Request>>& requests, bool choice_by_request) {
    const SchedulerConfig c = config();
    Executor executor(*model_, *backend_, c.block_size, c.num_blocks, model_->dtype());
    testing::ScriptedExecutor counting(executor);  // passes plans to the model, counting what they feed
    Engine engine(c, counting);
    for (const auto& [id, r] : requests) {
      const Status st = engine.add_request(id, r);
      EXPECT_TRUE(st.is_ok()) << st.to_string();
    }
    EngineRun out;
    for (int steps = 0; engine.has_work() && steps < 10000; ++steps) {
      for (const SequenceEvent& ev : engine.step()) {
        EXPECT_NE(ev.reason, FinishReason::kError) << ev.error;
        if (ev.finished) { EXPECT_EQ(ev.reason, FinishReason::kLength); }
        const int choice = choice_by_request ? static_cast<int>(request_of(ev.seq_id)) - 1 : choice_of(ev.seq_id);
        for (const SampledToken& t : ev.new_tokens) out.outputs[choice].push_back(t.token);
      }
      engine.scheduler().check_invariants();
    }
    EXPECT_FALSE(engine.has_work());
    out.blocks = engine.scheduler().block_manager().stats();
    out.fed = counting.fed();
    return out;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Transformer> model_;
};

TEST_F(EngineForkTest, FourChoicesAllocateThePromptOnceAndEqualFourSeededRequests) {
  // Today's choices: 4 requests, choice i seeded kSeed + i, all submitted together.
  std::map<RequestId, std::shared_ptr<const Request>> separate;
  for (int i = 0; i < kChoices; ++i) separate[static_cast<RequestId>(i + 1)] = sampled_request(1, kSeed + i);
  const EngineRun apart = run(separate, /*choice_by_request=*/true);

  const EngineRun forked = run({{1, sampled_request(kChoices, kSeed)}}, /*choice_by_request=*/false);

  ASSERT_EQ(forked.outputs.size(), static_cast<size_t>(kChoices));
  for (int i = 0; i < kChoices; ++i) {
    EXPECT_EQ(forked.outputs.at(i).size(), static_cast<size_t>(kMaxTokens)) << "choice " << i;
    EXPECT_EQ(forked.outputs.at(i), apart.outputs.at(i)) << "choice " << i;
  }
  // The choices really differ (so the comparison above checks per-choice seeds).
  EXPECT_NE(forked.outputs.at(0), forked.outputs.at(1));

  // Blocks: the 64-token prompt takes blocks 0..3, allocated once and shared by every
  // choice (choices 1..3 sample their first token from the logits of choice 0's prefill).
  // It ends on a block boundary, so nothing is copied; every choice's output (positions
  // 64..74) gets one block.
  const uint64_t prompt_blocks = kPromptLen / 16;
  const uint64_t output_blocks = 1;
  EXPECT_EQ(forked.blocks.cow_copies, 0u);
  EXPECT_EQ(forked.blocks.blocks_allocated, prompt_blocks + kChoices * output_blocks);
  EXPECT_EQ(apart.blocks.blocks_allocated, kChoices * (prompt_blocks + output_blocks));
  // Tokens fed: the 64 prompt tokens once, then per choice 11 outputs.
  EXPECT_EQ(forked.fed, kPromptLen + kChoices * (kMaxTokens - 1));
  EXPECT_EQ(apart.fed, kChoices * kPromptLen + kChoices * (kMaxTokens - 1));
  EXPECT_EQ(forked.blocks.num_free, forked.blocks.num_blocks);
}

TEST_F(EngineForkTest, GreedyChoicesAreTheOneGreedyContinuation) {
  auto greedy = sampled_request(3, kSeed);
  greedy->sampling.temperature = 0.0f;
  auto single = sampled_request(1, kSeed);
  single->sampling.temperature = 0.0f;
  const EngineRun reference = run({{9, single}}, /*choice_by_request=*/false);
  const EngineRun forked = run({{1, greedy}}, false);
  ASSERT_EQ(reference.outputs.at(0).size(), static_cast<size_t>(kMaxTokens));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(forked.outputs.at(i), reference.outputs.at(0)) << "choice " << i;
}

}  // namespace
}  // namespace tessera
