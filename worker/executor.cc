#include "worker/executor.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <set>
#include <span>
#include <unordered_map>

#include "worker/ragged_batch.h"
#include "worker/sampler.h"
#include "worker/speculative_sampling.h"

namespace tessera {

namespace {

// A row greedy sampling takes as it is: temperature 0, and nothing that adjusts or reads the
// whole row (adjusts_logits, a grammar mask, top logprobs). Its first row is the one the
// min_tokens mask would reach: the rows after it count further.
bool plain_greedy(const SeqView& v) {
  const SamplingParams& p = v.state->sampling;
  return p.temperature <= 0.0f && p.logprobs <= 0 && !adjusts_logits(p, v.num_generated()) &&
         v.step->allowed_tokens.empty();
}

// Executor::sample_verifying for plain greedy rows whose tokens and logprobs the backend
// picked (Backend::greedy_rows): a proposal is kept while the pick equals it.
std::vector<SampledToken> greedy_verifying(const SeqView& v, const int32_t* ids, const float* logprobs) {
  const SeqStep& s = *v.step;
  const int32_t* proposals = s.tokens.data() + s.tokens.size() - s.num_draft;
  std::vector<SampledToken> out;
  for (int32_t i = 0; i <= s.num_draft; ++i) {
    SampledToken& t = out.emplace_back();
    t.seq_id = s.seq_id;
    t.token = ids[i];
    t.logprob = logprobs[i];
    if (i == s.num_draft || t.token != proposals[i]) break;
  }
  return out;
}

}  // namespace

Executor::Executor(Transformer& model, Backend& backend, int block_size, int num_blocks, DType kv_dtype,
                   Transformer* draft, double draft_min_probability)
    : model_(model),
      backend_(backend),
      cache_(model.cache_config(), block_size, num_blocks, kv_dtype, backend),
      sequences_(block_size, num_blocks),
      loras_(backend) {
  if (draft != nullptr)
    draft_ = std::make_unique<DraftModel>(*draft, backend, block_size, num_blocks, kv_dtype, draft_min_probability);
}

Status Executor::validate(const StepPlan& plan) const {
  const int64_t vocab = model_.config().vocab;
  const int block_size = cache_.block_size();
  // With a window on every layer the scheduler frees the blocks wholly before the first new
  // token's window (no query of the step reads them); released entries anywhere else would
  // be read.
  const int32_t window = model_.config().kv_window();
  for (const SeqStep& s : plan.seqs) {
    const std::string who = "step " + std::to_string(plan.step_id) + ", sequence " + std::to_string(s.seq_id);
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= vocab) return invalid_argument(who + ": token " + std::to_string(t) + " outside the vocabulary");
    }
    if (s.start) {
      if (!s.start->lora.empty() && loras_.find(s.start->lora) == nullptr)
        return invalid_argument(who + ": LoRA adapter \"" + s.start->lora + "\" is not loaded here");
      const SamplingParams& sp = s.start->sampling;
      for (const auto& [t, bias] : sp.logit_bias) {
        if (t < 0 || t >= vocab) return invalid_argument(who + ": logit_bias token " + std::to_string(t) + " outside the vocabulary");
      }
      for (int32_t t : sp.min_tokens_stop_ids) {
        if (t < 0 || t >= vocab) return invalid_argument(who + ": min_tokens stop id " + std::to_string(t) + " outside the vocabulary");
      }
      for (int32_t t : s.start->prompt) {
        if (t < 0 || t >= vocab) return invalid_argument(who + ": prompt token " + std::to_string(t) + " outside the vocabulary");
      }
    }
    const int64_t first_read = window > 0 ? std::max<int64_t>(0, s.num_computed - window + 1) / block_size : 0;
    if (s.num_released > first_read) {
      return invalid_argument(who + ": table entry " + std::to_string(first_read) +
                              " was released (-1), but the step reads from it (" + std::to_string(s.num_released) +
                              " leading entries released)");
    }
    if (s.propose == 0) continue;
    if (!draft_) return invalid_argument(who + ": asks for proposals, but this executor has no draft model");
    if (s.propose < 0 || s.propose > SeqStep::kMaxDraft || !s.sample || s.tokens.empty())
      return invalid_argument(who + ": " + std::to_string(s.propose) + " proposals asked of a step " +
                              (s.sample && !s.tokens.empty() ? "" : "that does not feed tokens and sample ") + "(at most " +
                              std::to_string(SeqStep::kMaxDraft) + ")");
    const int64_t table = s.table_from + static_cast<int64_t>(s.new_blocks.size());
    // The sampled token's K/V and its first propose - 1 proposals', after the fed tokens.
    const int64_t scratch_end = s.num_computed + static_cast<int64_t>(s.tokens.size()) + s.propose;
    if (table * block_size < scratch_end)
      return invalid_argument(who + ": a block table of " + std::to_string(table) + " blocks cannot hold the " +
                              std::to_string(scratch_end) + " positions its proposals need");
  }
  for (const auto& [src, dst] : plan.block_copies) {
    if (src < 0 || src >= cache_.num_blocks() || dst < 0 || dst >= cache_.num_blocks()) {
      return invalid_argument("step " + std::to_string(plan.step_id) + ": block copy outside the pool");
    }
  }
  return Status::ok();
}

StatusOr<StepResult> Executor::execute(const StepPlan& plan, std::vector<float>* logits_out) {
  // Adapters changed at run time, before the step's sequences (which may name a loaded one).
  for (const std::string& name : plan.lora_unloads) loras_.remove(name);
  for (const auto& [name, dir] : plan.lora_loads) {
    if (!lora_loader_) return invalid_argument("step " + std::to_string(plan.step_id) + ": loads LoRA adapter \"" + name +
                                               "\", but this executor cannot load adapters");
    TESSERA_ASSIGN_OR_RETURN(LoraWeights adapter, lora_loader_(name, dir));
    add_lora(std::move(adapter));
  }
  TESSERA_RETURN_IF_ERROR(validate(plan));
  // The logits handed back are one row per sampled token; a step checking proposals samples
  // several rows per sequence, kept or not as the draws go, so it hands back none.
  const bool has_draft = std::any_of(plan.seqs.begin(), plan.seqs.end(), [](const SeqStep& s) { return s.num_draft > 0; });
  if (has_draft && (logits_out != nullptr || plan.return_logits))
    return invalid_argument("step " + std::to_string(plan.step_id) + ": proposals (num_draft) in a step whose logits are asked for");
  const auto started = std::chrono::steady_clock::now();
  StatusOr<std::vector<SeqView>> applied = sequences_.apply(plan);
  if (!applied.is_ok()) return applied.status();
  const std::vector<SeqView>& views = applied.value();
  if (draft_) {
    // Held proposals answer the sequence's next step only.
    for (SeqId id : plan.dropped) draft_->forget(id);
    for (const SeqStep& s : plan.seqs)
      if (s.start) draft_->forget(s.seq_id);
  }
  StepResult result;
  result.step_id = plan.step_id;
  int32_t highest_block = -1;  // the KV this step writes
  for (const auto& [src, dst] : plan.block_copies) highest_block = std::max(highest_block, dst);
  for (const SeqStep& s : plan.seqs)
    for (const int32_t b : s.new_blocks) highest_block = std::max(highest_block, b);
  cache_.in_use_below(highest_block + 1);
  for (const auto& [src, dst] : plan.block_copies) cache_.copy_block(src, dst, backend_);
  if (draft_) {
    draft_->in_use_below(highest_block + 1);
    for (const auto& [src, dst] : plan.block_copies) draft_->copy_block(src, dst);
  }
  if (plan.seqs.empty()) return result;

  // The adapters the step's sequences name, resident before the forward reads them.
  std::set<std::string> step_loras;
  for (const SeqView& v : views)
    if (!v.step->tokens.empty() && !v.state->lora.empty()) step_loras.insert(v.state->lora);
  if (Status st = loras_.make_resident(step_loras); !st.is_ok())
    return invalid_argument("step " + std::to_string(plan.step_id) + ": " + st.message());

  std::vector<int32_t> tokens, logit_rows;
  // Rows whose logits score a prompt token (sequences asking prompt logprobs only), after the
  // sampled rows in logit_rows: (row in the batch, sequence view, position of the token scored).
  struct PromptRow {
    const SeqView* view;
    int32_t position;
  };
  std::vector<PromptRow> prompt_rows;
  std::vector<int32_t> prompt_row_ids;
  int max_blocks = 0;
  for (const SeqView& v : views) max_blocks = std::max(max_blocks, static_cast<int>(v.state->block_table.size()));
  RaggedBatchBuilder batch(cache_.block_size(), max_blocks);
  // Row of the logits each sampled sequence reads: its own last token's, or for a forked
  // choice's first step its parent's (which comes earlier in the plan).
  std::unordered_map<SeqId, size_t> row_of;
  std::vector<size_t> sample_rows;
  // Embedding sequences: the rows their pooling takes (hidden_rows), `count` of them from `first`.
  struct PoolTake {
    SeqId seq_id;
    size_t first;
    int32_t count;
  };
  std::vector<PoolTake> pool_takes;
  std::vector<int32_t> hidden_rows;
  std::vector<const LoraWeights*> seq_adapters;  // per sequence of the batch
  bool any_adapter = false;
  for (const SeqView& v : views) {
    const SeqStep& s = *v.step;
    if (s.tokens.empty()) {  // SequenceStates let it through: it samples from its parent's row
      sample_rows.push_back(row_of.at(v.sample_from()));
      continue;
    }
    batch.add(v.state->block_table, s.num_computed, static_cast<int32_t>(s.tokens.size()));
    const LoraWeights* adapter = nullptr;
    if (!v.state->lora.empty()) {
      adapter = loras_.find(v.state->lora);  // resident: make_resident checked it is held
      any_adapter = true;
    }
    seq_adapters.push_back(adapter);
    // The row of the token at `pos` predicts the one at pos + 1: a prompt token when it is one.
    if (v.state->sampling.prompt_logprobs >= 0) {
      for (int32_t i = 0; i < static_cast<int32_t>(s.tokens.size()); ++i) {
        const int32_t pos = s.num_computed + i;
        if (pos + 1 >= v.state->prompt_len) break;
        prompt_row_ids.push_back(static_cast<int32_t>(tokens.size()) + i);
        prompt_rows.push_back(PromptRow{&v, pos + 1});
      }
    }
    if (v.state->pooling != Pooling::kNone) {
      // Mean takes every fed row, CLS the row of position 0, last the step's last row (the
      // scheduler keeps the share of the step that ends the prompt).
      const auto first = static_cast<int32_t>(tokens.size());
      const auto fed = static_cast<int32_t>(s.tokens.size());
      PoolTake take{s.seq_id, hidden_rows.size(), 0};
      if (v.state->pooling == Pooling::kMean) {
        for (int32_t i = 0; i < fed; ++i) hidden_rows.push_back(first + i);
        take.count = fed;
      } else if (v.state->pooling == Pooling::kLast || s.num_computed == 0) {
        hidden_rows.push_back(v.state->pooling == Pooling::kLast ? first + fed - 1 : first);
        take.count = 1;
      }
      if (take.count > 0) pool_takes.push_back(take);
    }
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
    if (s.sample) {
      // Its last token's row, and with proposals the rows before them too: row i scores
      // proposal i + 1 (num_draft + 1 rows in all, consecutive).
      row_of[s.seq_id] = logit_rows.size();
      sample_rows.push_back(logit_rows.size());
      for (int32_t i = s.num_draft; i >= 0; --i) logit_rows.push_back(static_cast<int32_t>(tokens.size()) - 1 - i);
    }
  }

  const int64_t vocab = model_.config().vocab;
  const size_t num_sampled = logit_rows.size();
  logit_rows.insert(logit_rows.end(), prompt_row_ids.begin(), prompt_row_ids.end());
  Tensor logits = backend_.alloc({static_cast<int64_t>(logit_rows.size()), vocab}, DType::kF32);
  if (!any_adapter) seq_adapters.clear();
  if (hidden_rows.empty()) {
    TESSERA_RETURN_IF_ERROR(
        model_.forward(tokens, batch.batch(), cache_, logit_rows, logits.view(), {}, nullptr, seq_adapters));
  } else {
    const int64_t hidden_size = model_.config().hidden;
    Tensor hidden = backend_.alloc({static_cast<int64_t>(hidden_rows.size()), hidden_size}, DType::kF32);
    TESSERA_RETURN_IF_ERROR(
        model_.forward(tokens, batch.batch(), cache_, logit_rows, logits.view(), hidden_rows, &hidden.view(), seq_adapters));
    std::vector<float> rows(static_cast<size_t>(hidden.numel()));
    backend_.copy_to_host(hidden.view(), rows.data());
    for (const PoolTake& take : pool_takes) {
      PooledHidden& p = result.pooled.emplace_back();
      p.seq_id = take.seq_id;
      p.rows = take.count;
      std::vector<double> sum(static_cast<size_t>(hidden_size), 0.0);  // a long prompt's mean keeps its digits
      for (int32_t r = 0; r < take.count; ++r) {
        const float* row = rows.data() + (take.first + static_cast<size_t>(r)) * static_cast<size_t>(hidden_size);
        for (int64_t k = 0; k < hidden_size; ++k) sum[static_cast<size_t>(k)] += row[k];
      }
      p.sum.assign(sum.begin(), sum.end());
    }
  }
  const auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<float>(std::chrono::steady_clock::now() - t).count();
  };
  if (logit_rows.empty()) {
    result.target_seconds = seconds_since(started);
    TESSERA_RETURN_IF_ERROR(run_draft(views, {}, result));
    return result;
  }
  std::vector<const SeqView*> sampling;
  for (const SeqView& v : views) {
    if (v.step->sample) sampling.push_back(&v);
  }
  const auto num_sampling = static_cast<int64_t>(sampling.size());
  // Each sampling sequence's tokens: one, or with proposals the accepted ones and the next.
  std::vector<std::vector<SampledToken>> per_seq(sampling.size());
  const bool device_greedy = logits_out == nullptr && !plan.return_logits && prompt_rows.empty() &&
                             std::all_of(sampling.begin(), sampling.end(), [](const SeqView* v) { return plain_greedy(*v); });
  if (device_greedy) {
    // Every row is plain greedy and nothing else is wanted of the logits: the backend picks
    // each row's token and logprob where the logits are, and two numbers per row come back.
    const auto rows = static_cast<int64_t>(logit_rows.size());
    Tensor ids = backend_.alloc({rows}, DType::kI32);
    Tensor logprobs = backend_.alloc({rows}, DType::kF32);
    backend_.greedy_rows(logits.view(), ids.view(), logprobs.view());
    std::vector<int32_t> host_ids(static_cast<size_t>(rows));
    std::vector<float> host_logprobs(static_cast<size_t>(rows));
    backend_.copy_to_host(ids.view(), host_ids.data());
    backend_.copy_to_host(logprobs.view(), host_logprobs.data());
    for (int64_t row = 0; row < num_sampling; ++row)
      per_seq[row] = greedy_verifying(*sampling[row], host_ids.data() + sample_rows[row],
                                      host_logprobs.data() + sample_rows[row]);
  } else {
    // Reused across steps: a fresh [rows, vocab] vector per step page-faulted megabytes.
    std::vector<float>& host = host_logits_;
    host.resize(static_cast<size_t>(logits.numel()));
    backend_.copy_to_host(logits.view(), host.data());
    // The prompt-scoring rows follow the sampled ones in `host`; each sampling sequence reads
    // from its row in sample_rows (a forked choice its parent's). Logits asked for: one row per
    // sampled token, in plan order (no proposals here: refused above).
    if (logits_out != nullptr || plan.return_logits) {
      std::vector<float> rows(sample_rows.size() * static_cast<size_t>(vocab));
      for (size_t k = 0; k < sample_rows.size(); ++k)
        std::copy_n(host.begin() + static_cast<std::ptrdiff_t>(sample_rows[k] * vocab), vocab,
                    rows.begin() + static_cast<std::ptrdiff_t>(k * vocab));
      if (logits_out != nullptr) *logits_out = rows;
      if (plan.return_logits) result.logits = std::move(rows);
    }
    // Rows are independent and each costs a pass over the vocabulary (log-softmax, maybe a
    // top-k sort), so they are spread over the cores: done serially they left the other cores
    // idle for ~20% of a batch-32 decode step (perf, ~100M model, 2 cores).
    const auto num_prompt_rows = static_cast<int64_t>(prompt_rows.size());
    result.prompt_logprobs.resize(prompt_rows.size());
#pragma omp parallel for schedule(dynamic, 1) if (num_prompt_rows > 1)
    for (int64_t i = 0; i < num_prompt_rows; ++i) {
      const HeldSequence& st = *prompt_rows[i].view->state;
      PromptLogprob& lp = result.prompt_logprobs[i];
      lp.seq_id = prompt_rows[i].view->step->seq_id;
      lp.position = prompt_rows[i].position;
      lp.token = st.prompt[static_cast<size_t>(lp.position)];
      lp.logprob = raw_logprobs(host.data() + (num_sampled + i) * vocab, vocab, lp.token, st.sampling.prompt_logprobs,
                                &lp.top_logprobs);
    }

#pragma omp parallel for schedule(dynamic, 1) if (num_sampling > 1)
    for (int64_t row = 0; row < num_sampling; ++row) {
      per_seq[row] = sample_verifying(*sampling[row], host.data() + sample_rows[row] * vocab, vocab);
    }
  }
  std::unordered_map<SeqId, SampledRun> sampled;
  for (int64_t row = 0; row < num_sampling; ++row) {
    const SeqStep& s = *sampling[row]->step;
    sampled[s.seq_id] = SampledRun{sampling[row]->num_generated(), static_cast<int32_t>(per_seq[row].size()),
                                   per_seq[row].back().token};
    const auto accepted = static_cast<int32_t>(per_seq[row].size()) - 1;
    if (accepted < s.num_draft) sequences_.rewind(s.seq_id, s.num_draft - accepted);
    result.tokens.insert(result.tokens.end(), per_seq[row].begin(), per_seq[row].end());
  }
  result.target_seconds = seconds_since(started);
  TESSERA_RETURN_IF_ERROR(run_draft(views, sampled, result));
  return result;
}

Status Executor::run_draft(const std::vector<SeqView>& views, const std::unordered_map<SeqId, SampledRun>& sampled,
                           StepResult& result) {
  if (!draft_) return Status::ok();
  std::vector<DraftModel::Feed> feeds;
  for (const SeqView& v : views) {
    const SeqStep& s = *v.step;
    if (s.tokens.empty()) continue;  // a forked choice's first step: its parent's tokens
    if (v.state->pooling != Pooling::kNone) continue;  // an embedding: nothing follows it
    auto run = sampled.find(s.seq_id);
    // The committed tokens: those fed less the proposals the target rejected.
    const int32_t accepted = run != sampled.end() && s.num_draft > 0 ? run->second.count - 1 : 0;
    DraftModel::Feed& f = feeds.emplace_back();
    f.seq_id = s.seq_id;
    f.state = v.state;
    f.position = s.num_computed;
    f.tokens.assign(s.tokens.begin(), s.tokens.end() - s.num_draft + accepted);
    if (s.propose > 0 && run != sampled.end()) {
      f.tokens.push_back(run->second.last);
      f.propose = s.propose;
      f.token_index = run->second.first_index + run->second.count;
      f.seed = v.state->sampling.seed.value_or(s.seq_id);
    } else {
      draft_->forget(s.seq_id);
    }
  }
  const auto started = std::chrono::steady_clock::now();
  TESSERA_ASSIGN_OR_RETURN(result.proposals, draft_->run(feeds));
  result.draft_seconds = std::chrono::duration<float>(std::chrono::steady_clock::now() - started).count();
  result.draft_forwards = draft_->last_forwards();
  return Status::ok();
}

std::vector<SampledToken> Executor::sample_verifying(const SeqView& v, const float* rows, int64_t vocab) const {
  const SeqStep& s = *v.step;
  // The fed tokens before the proposals: the penalties of row i read those and proposals 1..i.
  const auto fed_before = static_cast<int32_t>(v.penalty_tokens().size()) - s.num_draft;
  const std::span<const int32_t> proposals(s.tokens.data() + s.tokens.size() - s.num_draft, s.num_draft);
  // Proposals this executor's draft drew from q for a sampled request are checked by the
  // speculative-sampling rule; any others (greedy, n-gram) are kept exactly when the target's
  // own draw gives them.
  const DraftModel::Held* held = draft_ ? draft_->held(s.seq_id) : nullptr;
  const bool by_rule = held != nullptr && v.state->sampling.temperature > 0.0f &&
                       held->q.size() >= proposals.size() && held->tokens.size() >= proposals.size() &&
                       std::equal(proposals.begin(), proposals.end(), held->tokens.begin());
  std::vector<SampleRequest> reqs(static_cast<size_t>(s.num_draft) + 1);
  for (int32_t i = 0; i <= s.num_draft; ++i) {
    SampleRequest& req = reqs[static_cast<size_t>(i)];
    req.logits = rows + static_cast<int64_t>(i) * vocab;
    req.vocab = vocab;
    req.params = &v.state->sampling;
    // Unseeded requests still get a reproducible stream per sequence.
    req.seed = v.state->sampling.seed.value_or(s.seq_id);
    // The counter of the token decoded one by one: a proposal is kept exactly when the draw
    // that would have produced it without speculation does, so the tokens do not change.
    req.token_index = v.num_generated() + i;
    req.penalty_tokens = &v.penalty_tokens();
    req.penalty_count = s.num_draft > 0 ? fed_before + i : -1;
    req.penalty_prompt_len = v.state->prompt_len;
    req.allowed_tokens = s.row_mask(i);
  }
  std::vector<SampledToken> out;
  auto emit = [&](int32_t i, int32_t token) {
    SampledToken& t = out.emplace_back();
    t.token = token;
    t.seq_id = s.seq_id;
    fill_logprobs(reqs[static_cast<size_t>(i)], t);
  };
  int32_t i = 0;
  if (by_rule) {
    const std::vector<ProposalVerdict> verdicts =
        verify_proposals(backend_, std::span(reqs).first(static_cast<size_t>(s.num_draft)), proposals,
                         std::span(held->q).first(static_cast<size_t>(s.num_draft)));
    for (; i < s.num_draft; ++i) {
      emit(i, verdicts[static_cast<size_t>(i)].token);
      if (!verdicts[static_cast<size_t>(i)].accepted) return out;
    }
  }
  for (; i <= s.num_draft; ++i) {
    out.push_back(sample_token(reqs[static_cast<size_t>(i)]));
    out.back().seq_id = s.seq_id;
    if (i == s.num_draft || out.back().token != proposals[static_cast<size_t>(i)]) break;
  }
  return out;
}

}  // namespace tessera
