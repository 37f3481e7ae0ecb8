#include "worker/generator.h"

#include <chrono>
#include <random>

namespace tessera {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct SeqState {
  size_t request = 0;
  std::vector<int32_t> blocks;
  int32_t context_len = 0;  // tokens already in the cache
  int32_t next_token = -1;  // sampled, not yet fed
  bool done = false;
  std::mt19937_64 rng;
};

}  // namespace

Status Generator::validate(const GenerationRequest& r, size_t index) const {
  const ModelConfig& c = model_.config();
  const std::string who = "request " + std::to_string(index);
  if (r.prompt.empty()) return invalid_argument(who + ": the prompt is empty");
  if (r.max_new_tokens < 1) return invalid_argument(who + ": max_new_tokens must be at least 1");
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= c.vocab) {
      return invalid_argument(who + ": prompt id " + std::to_string(r.prompt[i]) + " at position " +
                              std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(c.vocab) + ")");
    }
  }
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
  if (c.max_positions > 0 && c.arch->position == PositionKind::kRotary && total > c.max_positions) {
    return invalid_argument(who + ": prompt (" + std::to_string(r.prompt.size()) + ") + max_new_tokens (" +
                            std::to_string(r.max_new_tokens) + ") exceeds the model's context of " +
                            std::to_string(c.max_positions) + " tokens");
  }
  return Status::ok();
}

StatusOr<std::vector<GenerationResult>> Generator::generate(const std::vector<GenerationRequest>& requests,
                                                            bool keep_logits, GenerationTimings* timings) {
  for (size_t i = 0; i < requests.size(); ++i) TESSERA_RETURN_IF_ERROR(validate(requests[i], i));
  const int64_t vocab = model_.config().vocab;

  // Give every sequence the blocks it can ever need, up front.
  std::vector<SeqState> seqs(requests.size());
  int32_t next_block = 0;
  int max_blocks = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const int64_t total = static_cast<int64_t>(requests[i].prompt.size()) + requests[i].max_new_tokens;
    const int n = static_cast<int>((total + block_size_ - 1) / block_size_);
    for (int b = 0; b < n; ++b) seqs[i].blocks.push_back(next_block++);
    max_blocks = std::max(max_blocks, n);
    seqs[i].request = i;
    seqs[i].rng.seed(requests[i].sampling.seed.value_or(0) + i);
  }
  KvCache cache(model_.config(), block_size_, std::max(next_block, 1), backend_);
  std::vector<GenerationResult> results(requests.size());
  GenerationTimings local_timings;

  bool first_step = true;
  while (true) {
    // Build the ragged batch: prompts on the first step, then one token per live sequence.
    std::vector<int32_t> tokens, logit_rows;
    std::vector<SeqState*> live;
    AttentionBatch batch;
    batch.query_start.push_back(0);
    batch.max_blocks_per_seq = max_blocks;
    for (SeqState& s : seqs) {
      if (s.done) continue;
      const std::vector<int32_t> step_tokens =
          first_step ? requests[s.request].prompt : std::vector<int32_t>{s.next_token};
      for (int32_t tok : step_tokens) {
        const int32_t pos = s.context_len++;
        batch.slot_mapping.push_back(s.blocks[pos / block_size_] * block_size_ + pos % block_size_);
        tokens.push_back(tok);
      }
      batch.query_start.push_back(static_cast<int32_t>(tokens.size()));
      batch.context_lens.push_back(s.context_len);
      for (int b = 0; b < max_blocks; ++b) {
        batch.block_tables.push_back(b < static_cast<int>(s.blocks.size()) ? s.blocks[b] : -1);
      }
      logit_rows.push_back(static_cast<int32_t>(tokens.size()) - 1);
      live.push_back(&s);
    }
    if (live.empty()) break;

    const auto start = std::chrono::steady_clock::now();
    Tensor logits = backend_.alloc({static_cast<int64_t>(live.size()), vocab}, DType::kF32);
    model_.forward(tokens, batch, cache, logit_rows, logits.view());
    std::vector<float> host(logits.numel());
    backend_.copy_to_host(logits.view(), host.data());
    const double elapsed = seconds_since(start);
    if (first_step) {
      local_timings.prefill_seconds += elapsed;
      local_timings.prefill_tokens += static_cast<int64_t>(tokens.size());
    } else {
      local_timings.decode_seconds += elapsed;
      local_timings.decode_tokens += static_cast<int64_t>(live.size());
      local_timings.decode_steps += 1;
    }

    for (size_t i = 0; i < live.size(); ++i) {
      SeqState& s = *live[i];
      const GenerationRequest& req = requests[s.request];
      GenerationResult& res = results[s.request];
      const float* row = host.data() + i * vocab;
      if (keep_logits) res.logits.insert(res.logits.end(), row, row + vocab);
      s.next_token = sample_token(row, vocab, req.sampling, s.rng);
      res.output.push_back(s.next_token);
      const bool eos = req.stop_at_eos && s.next_token == model_.config().eos_id;
      if (eos || static_cast<int>(res.output.size()) >= req.max_new_tokens) s.done = true;
    }
    first_step = false;
  }
  if (timings != nullptr) *timings = local_timings;
  return results;
}

}  // namespace tessera
