// The scheduler's structured-output path (Scheduler::on_step_result): a step's tokens move
// their grammars on, then the step's next masks are computed together on the mask threads
// (coordinator/engine/structured/mask_pool.h), then each sequence's verdict is applied. Run with 1
// and with 4 mask threads, a batch of constrained requests (some of n = 3 choices, sharing
// grammars) must give exactly the same events: the same tokens, the same finish reasons and
// errors — and every choice that stops is a complete string of its grammar.
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/engine/scheduler.h"
#include "coordinator/api/grammars/request_constraint.h"
#include "coordinator/engine/structured/token_constraint.h"

namespace tessera {
namespace {

using structured::ConstraintKind;
using structured::TokenConstraint;
using structured::TokenVocabulary;

// Token 0 is the end of sequence (no bytes). No token starts with "z", so the regex "az"
// reaches a dead end after "a".
std::vector<std::string> scheduler_tokens() {
  return {"",   "{",    "}",  "\"", "a",    "b",   ":",  ",",     " ",    "\"a\"", "1",     "12",
          "[",  "]",    "true", "null", "\":", "\",", "},", "ab", "\"b", "2", "0", "-", "false", "x"};
}

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  std::string error;
  bool operator==(const Outcome&) const = default;
};

// A fixed choice among the ids a mask allows: a function of the sequence and the index of the
// token among its output, so a row checking a proposal draws what decoding one by one would.
int32_t pick_allowed(std::span<const uint32_t> mask, SeqId seq, size_t index) {
  std::vector<int32_t> allowed;
  for (size_t w = 0; w < mask.size(); ++w)
    for (uint32_t b = mask[w]; b != 0; b &= b - 1)
      allowed.push_back(static_cast<int32_t>(w * 32 + static_cast<size_t>(std::countr_zero(b))));
  EXPECT_FALSE(allowed.empty()) << "sequence " << seq;
  if (allowed.empty()) return 0;
  // Mostly the smallest allowed id (outputs that repeat themselves, which lookup proposes).
  const size_t h = seq * 2654435761u + index * 40503u;
  return allowed[h % 4 == 0 ? h % allowed.size() : 0];
}

struct SpecCounts {
  uint64_t proposed = 0, accepted = 0;
};

// `mask_budget_ms` > 0: masks that outrun it go to the MaskWarmer, and the loop below takes
// them up as Engine::step does (advance_deferred_masks before every schedule). With
// `speculative`, n-gram proposals ride along and each checked row draws under its own mask.
std::map<SeqId, Outcome> run_batch(const std::vector<std::shared_ptr<const TokenConstraint>>& constraints,
                                   const char* mask_threads, bool speculative = false, int mask_budget_ms = 0,
                                   SpecCounts* spec = nullptr) {
  setenv("TESSERA_MASK_THREADS", mask_threads, 1);
  SchedulerConfig config;
  config.block_size = 16;
  config.num_blocks = 256;
  config.max_model_len = 128;
  config.structured_mask_budget_ms = mask_budget_ms;
  if (speculative) config.speculative.method = SpeculativeConfig::Method::kNgram;
  Scheduler sched(config);
  unsetenv("TESSERA_MASK_THREADS");
  for (RequestId id = 1; id <= 24; ++id) {
    auto r = std::make_shared<Request>();
    r->prompt = {3, 4, 5, static_cast<int32_t>(id % 7)};
    r->max_tokens = 40;
    r->n = id % 5 == 0 ? 3 : 1;
    r->stop.eos_token_id = 0;
    r->constraint = constraints[static_cast<size_t>(id) % constraints.size()];
    EXPECT_TRUE(sched.add_request(id, r).is_ok());
  }
  std::map<SeqId, Outcome> out;
  auto take = [&out](const SequenceEvent& e) {
    Outcome& o = out[e.seq_id];
    for (const SampledToken& t : e.new_tokens) o.tokens.push_back(t.token);
    if (e.finished) {
      o.reason = e.reason;
      o.error = e.error;
    }
  };
  for (int guard = 0; guard < 100000; ++guard) {
    for (const SequenceEvent& e : sched.advance_deferred_masks()) take(e);
    StepPlan plan = sched.schedule();
    if (plan.seqs.empty()) {
      if (!sched.has_work()) break;
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // the warmer is at work
      continue;
    }
    StepResult result;
    result.step_id = plan.step_id;
    for (const SeqStep& s : plan.seqs) {
      if (!s.sample) continue;
      const size_t done = out[s.seq_id].tokens.size();
      for (int32_t row = 0; row <= s.num_draft; ++row) {
        const int32_t token = pick_allowed(s.row_mask(row), s.seq_id, done + static_cast<size_t>(row));
        result.tokens.push_back(SampledToken{s.seq_id, token, 0.0f, {}});
        if (row == s.num_draft || token != s.tokens[s.tokens.size() - static_cast<size_t>(s.num_draft - row)]) break;
      }
    }
    for (const SequenceEvent& e : sched.on_step_result(plan, result)) take(e);
  }
  if (spec != nullptr) {
    spec->proposed = sched.stats().spec.num_draft_tokens;
    spec->accepted = sched.stats().spec.num_accepted_tokens;
  }
  return out;
}

TEST(SchedulerStructured, ParallelMasksGiveTheSerialEvents) {
  auto vocab = std::make_shared<const TokenVocabulary>(scheduler_tokens());
  using json = nlohmann::ordered_json;
  const std::vector<std::pair<ConstraintKind, json>> specs = {
      {ConstraintKind::kJsonObject, nullptr},
      {ConstraintKind::kJsonSchema, json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"},
          "b": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}}, "required": ["a", "b"]})")},
      {ConstraintKind::kRegex, "(ab|x)+[12]"},
      {ConstraintKind::kChoice, json{"true", "false", "null"}},
      {ConstraintKind::kRegex, "az"},  // a dead end for this vocabulary after "a"
  };
  std::vector<std::shared_ptr<const TokenConstraint>> serial_constraints, parallel_constraints;
  for (const auto& [kind, value] : specs) {
    serial_constraints.push_back(std::make_shared<const TokenConstraint>(structured::compile_constraint(kind, value).value(), vocab));
    parallel_constraints.push_back(std::make_shared<const TokenConstraint>(structured::compile_constraint(kind, value).value(), vocab));
  }
  const std::map<SeqId, Outcome> serial = run_batch(serial_constraints, "1");
  const std::map<SeqId, Outcome> parallel = run_batch(parallel_constraints, "4");
  ASSERT_EQ(serial.size(), parallel.size());
  // With a budget every first mask goes to the warmer (fresh grammars), and the rest whenever
  // they outrun it: the same events, only spread over other steps.
  std::vector<std::shared_ptr<const TokenConstraint>> deferred_constraints;
  for (const auto& [kind, value] : specs)
    deferred_constraints.push_back(std::make_shared<const TokenConstraint>(structured::compile_constraint(kind, value).value(), vocab));
  EXPECT_EQ(run_batch(deferred_constraints, "4", false, 1), serial);
  int stopped = 0, dead_ends = 0;
  for (const auto& [id, o] : serial) {
    ASSERT_TRUE(parallel.count(id)) << "sequence " << id;
    EXPECT_EQ(parallel.at(id), o) << "sequence " << id;
    ASSERT_NE(o.reason, FinishReason::kNone) << "sequence " << id << " never finished";
    const TokenConstraint& c = *serial_constraints[static_cast<size_t>(request_of(id)) % serial_constraints.size()];
    if (o.reason == FinishReason::kStop) {
      ++stopped;
      std::string text;
      for (int32_t t : o.tokens) text += vocab->bytes(t);
      EXPECT_TRUE(c.matches(text)) << "sequence " << id << " stopped on " << json(text).dump();
    } else if (o.reason == FinishReason::kError) {
      ++dead_ends;
      EXPECT_NE(o.error.find("no token of the vocabulary can continue"), std::string::npos) << o.error;
    }
  }
  EXPECT_GT(stopped, 10);
  EXPECT_EQ(dead_ends, 5) << "requests 4, 9, 14, 19 and 24 ask for \"az\"";
}

// With speculative decoding on, constrained sequences carry proposals cut where their grammar
// stops them, each checked row under the mask after the proposals before it: the same events.
TEST(SchedulerStructured, ProposalsUnderAGrammarGiveThePlainEvents) {
  auto vocab = std::make_shared<const TokenVocabulary>(scheduler_tokens());
  std::vector<std::shared_ptr<const TokenConstraint>> plain, spec;
  for (auto* list : {&plain, &spec}) {
    list->push_back(std::make_shared<const TokenConstraint>(
        structured::compile_constraint(ConstraintKind::kRegex, "(ab|x)+[12]").value(), vocab));
    list->push_back(std::make_shared<const TokenConstraint>(
        structured::compile_constraint(ConstraintKind::kJsonObject, nullptr).value(), vocab));
  }
  SpecCounts counts;
  EXPECT_EQ(run_batch(spec, "1", /*speculative=*/true, 0, &counts), run_batch(plain, "1"));
  EXPECT_GT(counts.accepted, 0u) << counts.proposed << " proposals";
  EXPECT_LT(counts.accepted, counts.proposed) << "some proposals must be rejected for the test to mean anything";
}

}  // namespace
}  // namespace tessera
