#include "worker/generator.h"

#include <chrono>

#include "worker/executor.h"

namespace tessera {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

StatusOr<std::vector<GenerationResult>> Generator::generate(const std::vector<GenerationRequest>& requests,
                                                            bool keep_logits, GenerationTimings* timings) {
  for (size_t i = 0; i < requests.size(); ++i) {
    TESSERA_RETURN_IF_ERROR(check_prompt(requests[i].prompt, requests[i].max_new_tokens, model_.config(),
                                         "request " + std::to_string(i)));
  }

  // Static batch: every sequence gets the blocks it can ever need, up front, and all
  // prompts are prefilled in the first step.
  struct Seq {
    std::vector<int32_t> blocks;
    int32_t num_computed = 0;
    bool done = false;
  };
  std::vector<Seq> seqs(requests.size());
  int32_t next_block = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const int64_t total = static_cast<int64_t>(requests[i].prompt.size()) + requests[i].max_new_tokens;
    const int n = static_cast<int>((total + block_size_ - 1) / block_size_);
    for (int b = 0; b < n; ++b) seqs[i].blocks.push_back(next_block++);
  }
  Executor executor(model_, backend_, block_size_, std::max(next_block, 1), model_.dtype());
  std::vector<GenerationResult> results(requests.size());
  GenerationTimings local;
  const int64_t vocab = model_.config().vocab;

  for (uint64_t step = 0;; ++step) {
    StepPlan plan;
    plan.step_id = step;
    for (size_t i = 0; i < requests.size(); ++i) {
      Seq& s = seqs[i];
      if (s.done) continue;
      SeqStep st;
      st.seq_id = i;
      st.tokens = step == 0 ? requests[i].prompt : std::vector<int32_t>{results[i].output.back()};
      st.num_computed = s.num_computed;
      st.sample = true;
      // The whole table and the sampling state go once, with the prefill (step deltas).
      st.version = static_cast<uint32_t>(step + 1);
      if (step == 0) {
        st.start.emplace().sampling = requests[i].sampling;
        st.start->prompt_len = static_cast<int32_t>(requests[i].prompt.size());
        st.new_blocks = s.blocks;
      } else {
        st.table_from = static_cast<int32_t>(s.blocks.size());
      }
      plan.seqs.push_back(std::move(st));
    }
    if (plan.seqs.empty()) break;

    const auto start = std::chrono::steady_clock::now();
    TESSERA_ASSIGN_OR_RETURN(StepResult result, executor.execute(plan, keep_logits ? &logits_scratch_ : nullptr));
    const double elapsed = seconds_since(start);
    int64_t fed = 0;
    for (const SeqStep& st : plan.seqs) fed += static_cast<int64_t>(st.tokens.size());
    if (step == 0) {
      local.prefill_seconds += elapsed;
      local.prefill_tokens += fed;
    } else {
      local.decode_seconds += elapsed;
      local.decode_tokens += static_cast<int64_t>(plan.seqs.size());
      local.decode_steps += 1;
    }
    for (size_t k = 0; k < plan.seqs.size(); ++k) {
      const size_t i = plan.seqs[k].seq_id;
      Seq& s = seqs[i];
      GenerationResult& res = results[i];
      s.num_computed += static_cast<int32_t>(plan.seqs[k].tokens.size());
      if (keep_logits) {
        res.logits.insert(res.logits.end(), logits_scratch_.begin() + k * vocab,
                          logits_scratch_.begin() + (k + 1) * vocab);
      }
      const int32_t token = result.tokens[k].token;
      res.output.push_back(token);
      const bool eos = requests[i].stop_at_eos && token == model_.config().eos_id;
      if (eos || static_cast<int>(res.output.size()) >= requests[i].max_new_tokens) s.done = true;
    }
  }
  if (timings != nullptr) *timings = local;
  return results;
}

}  // namespace tessera
