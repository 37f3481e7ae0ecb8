#include "worker/executor.h"

#include <algorithm>

#include "worker/sampler.h"

namespace tessera {

Executor::Executor(Transformer& model, Backend& backend, int block_size, int num_blocks, DType kv_dtype)
    : model_(model), backend_(backend), cache_(model.cache_config(), block_size, num_blocks, kv_dtype, backend) {}

Status Executor::validate(const StepPlan& plan) const {
  const int64_t vocab = model_.config().vocab;
  const int block_size = cache_.block_size();
  // With a window on every layer the scheduler frees the blocks wholly before the first new
  // token's window (no query of the step reads them) and leaves -1 in their place.
  const int32_t window = model_.config().kv_window();
  for (const SeqStep& s : plan.seqs) {
    const std::string who = "step " + std::to_string(plan.step_id) + ", sequence " + std::to_string(s.seq_id);
    if (s.tokens.empty()) return invalid_argument(who + ": no tokens");
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= vocab) return invalid_argument(who + ": token " + std::to_string(t) + " outside the vocabulary");
    }
    const int64_t total = s.num_computed + static_cast<int64_t>(s.tokens.size());
    if (static_cast<int64_t>(s.block_table.size()) * block_size < total) {
      return invalid_argument(who + ": block table of " + std::to_string(s.block_table.size()) +
                              " blocks cannot hold " + std::to_string(total) + " tokens");
    }
    const int64_t first_read = window > 0 ? std::max<int64_t>(0, s.num_computed - window + 1) / block_size : 0;
    for (size_t k = 0; k < s.block_table.size(); ++k) {
      const int32_t b = s.block_table[k];
      if (b == -1 && static_cast<int64_t>(k) < first_read) continue;
      if (b < 0 || b >= cache_.num_blocks()) {
        return invalid_argument(who + ": block " + std::to_string(b) + " (table entry " + std::to_string(k) +
                                ") outside the pool");
      }
    }
  }
  for (const auto& [src, dst] : plan.block_copies) {
    if (src < 0 || src >= cache_.num_blocks() || dst < 0 || dst >= cache_.num_blocks()) {
      return invalid_argument("step " + std::to_string(plan.step_id) + ": block copy outside the pool");
    }
  }
  return Status::ok();
}

StatusOr<StepResult> Executor::execute(const StepPlan& plan, std::vector<float>* logits_out) {
  TESSERA_RETURN_IF_ERROR(validate(plan));
  StepResult result;
  result.step_id = plan.step_id;
  for (const auto& [src, dst] : plan.block_copies) cache_.copy_block(src, dst, backend_);
  if (plan.seqs.empty()) return result;

  const int block_size = cache_.block_size();
  std::vector<int32_t> tokens, logit_rows;
  AttentionBatch batch;
  batch.query_start.push_back(0);
  for (const SeqStep& s : plan.seqs) {
    batch.max_blocks_per_seq = std::max(batch.max_blocks_per_seq, static_cast<int>(s.block_table.size()));
  }
  for (const SeqStep& s : plan.seqs) {
    int32_t pos = s.num_computed;
    for (int32_t t : s.tokens) {
      batch.slot_mapping.push_back(s.block_table[pos / block_size] * block_size + pos % block_size);
      tokens.push_back(t);
      ++pos;
    }
    batch.query_start.push_back(static_cast<int32_t>(tokens.size()));
    batch.context_lens.push_back(pos);
    batch.block_tables.insert(batch.block_tables.end(), s.block_table.begin(), s.block_table.end());
    batch.block_tables.insert(batch.block_tables.end(), batch.max_blocks_per_seq - s.block_table.size(), -1);
    if (s.sample) logit_rows.push_back(static_cast<int32_t>(tokens.size()) - 1);
  }

  const int64_t vocab = model_.config().vocab;
  Tensor logits = backend_.alloc({static_cast<int64_t>(logit_rows.size()), vocab}, DType::kF32);
  TESSERA_RETURN_IF_ERROR(model_.forward(tokens, batch, cache_, logit_rows, logits.view()));
  if (logit_rows.empty()) return result;
  std::vector<float> host(logits.numel());
  backend_.copy_to_host(logits.view(), host.data());
  if (logits_out != nullptr) *logits_out = host;
  if (plan.return_logits) result.logits = host;

  size_t row = 0;
  for (const SeqStep& s : plan.seqs) {
    if (!s.sample) continue;
    SampleRequest req;
    req.logits = host.data() + row * vocab;
    req.vocab = vocab;
    req.params = &s.sampling;
    // Unseeded requests still get a reproducible stream per sequence.
    req.seed = s.sampling.seed.value_or(s.seq_id);
    req.token_index = s.num_generated;
    req.penalty_tokens = &s.penalty_tokens;
    req.penalty_prompt_len = s.penalty_prompt_len;
    SampledToken tok = sample_token(req);
    tok.seq_id = s.seq_id;
    result.tokens.push_back(std::move(tok));
    ++row;
  }
  return result;
}

}  // namespace tessera
