// The activation plan (worker/activation_memory.h) against what a step really takes: every
// fixture model runs steps of prompt chunks on the CPU backend through the Executor, and what
// the backend's activation pool holds at its peak (its own accounting: buffers in use and free)
// must stay within the plan's pooled part and not fall far below it (a plan twice too large
// starves the KV pool for nothing). Then steps of several shapes with the pool held to the
// plan: it never holds more.
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <span>

#include "kernels/cpu/buffer_pool.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/test_support.h"
#include "worker/activation_memory.h"
#include "worker/executor.h"
#include "worker/transformer.h"

namespace tessera {
namespace {

constexpr int kPlanBlockSize = 16;

// One step of `seqs` sequences, `per_seq` prompt tokens each, every one sampling (greedy).
StepPlan prompt_chunk_step(uint64_t step_id, int seqs, int per_seq, int64_t vocab) {
  StepPlan plan;
  plan.step_id = step_id;
  const int blocks = (per_seq + kPlanBlockSize - 1) / kPlanBlockSize;
  for (int s = 0; s < seqs; ++s) {
    SeqStep st;
    st.seq_id = step_id * 1000 + static_cast<uint64_t>(s) + 1;
    for (int t = 0; t < per_seq; ++t) st.tokens.push_back(static_cast<int32_t>((s * 131 + t * 7) % vocab));
    st.num_computed = 0;
    st.sample = true;
    st.version = 1;
    st.start.emplace().prompt_len = per_seq;
    for (int b = 0; b < blocks; ++b) st.new_blocks.push_back(s * blocks + b);
    plan.seqs.push_back(std::move(st));
  }
  return plan;
}

struct StepShape {
  int seqs, per_seq;  // tokens = seqs x per_seq, rows of logits = seqs
};
constexpr StepShape kPlanShapes[] = {{4, 64}, {16, 8}, {2, 100}};

struct MeasuredSteps {
  ModelConfig config;
  size_t peak_held = 0;
};

// `shapes` steps one after the other on a fresh backend, its pool held to `limit` bytes (0: none).
StatusOr<MeasuredSteps> run_prompt_steps(const std::string& dir, std::span<const StepShape> shapes, size_t limit) {
  CpuBackend backend(2);
  if (limit > 0) backend.bound_activation_memory(static_cast<int64_t>(limit));
  ModelLoadOptions lo;
  lo.dtype = DType::kF32;
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> model, Transformer::load(dir, lo, backend));
  {
    Executor executor(*model, backend, kPlanBlockSize, 64, DType::kF32);
    uint64_t id = 1;
    for (const StepShape& shape : shapes) {
      const StepPlan plan = prompt_chunk_step(id++, shape.seqs, shape.per_seq, model->config().vocab);
      TESSERA_RETURN_IF_ERROR(executor.execute(plan).status());
    }
  }
  return MeasuredSteps{model->config(), backend.activation_pool().peak_held_bytes()};
}

TEST(ActivationMemory, ThePlanCoversEveryFixtureModelsStepsAndHoldsThePool) {
  TESSERA_REQUIRE_FIXTURES();
  for (const std::string& name : testing::golden_models()) {
    const std::string dir = testing::fixtures_dir() + "/" + name;
    // Each shape on a fresh pool: what that step makes the pool hold (a buffer in use may be
    // a free one up to 4x larger, so in use alone can pass the plan; held cannot), against
    // its own plan.
    ModelConfig config;
    for (const StepShape& shape : kPlanShapes) {
      auto one = run_prompt_steps(dir, std::span(&shape, 1), 0);
      ASSERT_TRUE(one.is_ok()) << name << ": " << one.status().to_string();
      const StepActivations plan = step_activations(ActivationWidths::of(one->config, 1, false, false, false),
                                                    shape.seqs * shape.per_seq, shape.seqs, /*threads=*/2);
      std::cout << "[ REPORT   ] " << name << ", " << shape.seqs << " x " << shape.per_seq
                << " tokens: activation buffers held at the peak " << one->peak_held << " bytes, planned " << plan.pooled
                << std::endl;
      EXPECT_LE(one->peak_held, static_cast<size_t>(plan.pooled)) << name << ": the plan is short";
      // A MoE plan covers a router sending every token to one expert, which these random
      // routers do not do (each expert gets about top_k / experts of the tokens).
      const size_t over = one->config.num_experts > 0 ? 3 : 2;
      EXPECT_GE(one->peak_held * over, static_cast<size_t>(plan.pooled)) << name << ": the plan is over " << over
                                                                         << " times the need";
      config = one->config;
    }
    // All of them in turn (new shapes the cache cannot all serve) with the pool held to the
    // plan of the largest (256 tokens, 16 rows of logits): it never holds more.
    const StepActivations largest = step_activations(ActivationWidths::of(config, 1, false, false, false), 256, 16, 2);
    auto held = run_prompt_steps(dir, kPlanShapes, static_cast<size_t>(largest.pooled));
    ASSERT_TRUE(held.is_ok()) << name << ": " << held.status().to_string();
    EXPECT_LE(held->peak_held, static_cast<size_t>(largest.pooled)) << name;
  }
}

TEST(ActivationMemory, LogitRowsAreTheSamplingRowsAndThePromptRowsWithinTheStepsTokens) {
  EXPECT_EQ(step_logit_rows(4096, 256, 0, 0), 256);
  EXPECT_EQ(step_logit_rows(4096, 256, 4, 0), 1280);  // each sequence's row and its 4 proposals'
  EXPECT_EQ(step_logit_rows(4096, 256, 0, 256), 512);
  EXPECT_EQ(step_logit_rows(512, 256, 4, 256), 512);
  // A configuration's plan: prompt rows cut to kPromptLogprobRowsPerStep with chunked prefill,
  // else as many as a step's tokens.
  TesseraConfig config;
  config.scheduler.max_num_batched_tokens = 2048;
  config.scheduler.max_num_seqs = 16;
  const ActivationWidths widths{.hidden = 64, .q_width = 64, .kv_width = 32, .ffn = 128, .vocab = 1000};
  EXPECT_EQ(planned_step_activations(config, widths).logit_rows, 16 + kPromptLogprobRowsPerStep);
  config.scheduler.chunked_prefill = false;
  EXPECT_EQ(planned_step_activations(config, widths).logit_rows, 2048);
}

}  // namespace
}  // namespace tessera
