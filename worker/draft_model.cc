#include "worker/draft_model.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "worker/model_checkpoint.h"
#include "worker/model_weights.h"
#include "worker/ragged_batch.h"
#include "worker/speculative_sampling.h"

namespace tessera {

DraftModel::DraftModel(Transformer& model, Backend& backend, int block_size, int num_blocks, DType kv_dtype,
                       double min_probability)
    : model_(model),
      backend_(backend),
      cache_(model.cache_config(), block_size, num_blocks, kv_dtype, backend),
      min_probability_(min_probability) {}

const DraftModel::Held* DraftModel::held(SeqId id) const {
  auto it = held_.find(id);
  return it == held_.end() ? nullptr : &it->second;
}

std::optional<int32_t> DraftModel::choose(const Feed& f, const float* logits, int32_t j, Held& held,
                                          bool* last) const {
  *last = false;
  SampleRequest req;
  req.logits = logits;
  req.vocab = model_.config().vocab;
  req.params = &f.state->sampling;
  req.seed = speculative_stream_seed(f.seed, SpeculativeStream::kDraft);
  req.token_index = f.token_index + j;  // min_tokens masks by it, as the target will
  // (No penalty history: q may be any distribution the proposal is really drawn from.)
  int32_t token = 0;
  if (f.state->sampling.temperature <= 0.0f) {
    token = greedy_token(req);
    // (The draft's probability of it: the softmax of its raw logits.)
    if (min_probability_ > 0 && std::exp(raw_logprobs(logits, req.vocab, token, 0, nullptr)) < min_probability_)
      return std::nullopt;
  } else {
    TokenDistribution q = token_distribution(req);
    token = q.draw(counter_uniform(req.seed, static_cast<uint64_t>(req.token_index)));
    // An unlikely draw is still proposed, and ends the proposals after it: leaving it out would
    // make whether this position is checked by the rule depend on the draw itself, and the
    // output would lean away from tokens the draft rarely draws (q = (0.95, 0.05), p = (0.5,
    // 0.5), threshold 0.1: 0.525 / 0.475 instead of 0.5 / 0.5). Later positions may depend on
    // it: they are only checked once it has been accepted.
    *last = q.prob(token) < min_probability_;
    held.q.push_back(std::move(q));
  }
  held.tokens.push_back(token);
  return token;
}

StatusOr<std::vector<Proposal>> DraftModel::run(const std::vector<Feed>& feeds) {
  const int64_t vocab = model_.config().vocab;
  const int block_size = cache_.block_size();
  size_t max_table = 0;
  for (const Feed& f : feeds) max_table = std::max(max_table, f.state->block_table.size());

  // Step 1: every feed's tokens; the proposing ones' last rows give their first proposals.
  std::vector<const Feed*> proposing;
  std::vector<int32_t> tokens, logit_rows;
  RaggedBatchBuilder first(block_size, static_cast<int>(max_table));
  for (const Feed& f : feeds) {
    if (f.tokens.empty()) continue;
    first.add(f.state->block_table, f.position, static_cast<int32_t>(f.tokens.size()));
    tokens.insert(tokens.end(), f.tokens.begin(), f.tokens.end());
    if (f.propose > 0) {
      proposing.push_back(&f);
      logit_rows.push_back(first.num_rows() - 1);
      held_[f.seq_id] = Held{};
    }
  }
  std::vector<Proposal> out(proposing.size());
  last_forwards_ = 0;
  if (tokens.empty()) return out;
  auto forward = [&](const std::vector<int32_t>& toks, const AttentionBatch& batch) -> Status {
    Tensor logits = backend_.alloc({static_cast<int64_t>(logit_rows.size()), vocab}, DType::kF32);
    TESSERA_RETURN_IF_ERROR(model_.forward(toks, batch, cache_, logit_rows, logits.view()));
    ++last_forwards_;
    if (logit_rows.empty()) return Status::ok();
    host_logits_.resize(static_cast<size_t>(logits.numel()));
    backend_.copy_to_host(logits.view(), host_logits_.data());
    return Status::ok();
  };
  // Proposal j of proposing feed i from logits row `row` of the last forward; a feed stops
  // proposing at the first token its draft is less sure of than min_probability (greedy:
  // before it; sampled: after it, see choose).
  std::vector<bool> stopped(proposing.size(), false);
  auto take = [&](size_t i, size_t row, int32_t j) {
    bool last = false;
    const std::optional<int32_t> t =
        choose(*proposing[i], host_logits_.data() + row * vocab, j, held_[out[i].seq_id], &last);
    if (t) out[i].tokens.push_back(*t);
    stopped[i] = !t.has_value() || last;
  };
  TESSERA_RETURN_IF_ERROR(forward(tokens, first.batch()));
  for (size_t i = 0; i < proposing.size(); ++i) {
    out[i].seq_id = proposing[i]->seq_id;
    take(i, i, 0);
  }

  // Steps 2..: each proposal still wanted is fed to give the next (its K/V is scratch past
  // the committed tokens: the target's check decides what stays).
  for (int32_t j = 1;; ++j) {
    std::vector<size_t> more;
    for (size_t i = 0; i < proposing.size(); ++i)
      if (proposing[i]->propose > j && !stopped[i]) more.push_back(i);
    if (more.empty()) break;
    RaggedBatchBuilder next(block_size, static_cast<int>(max_table));
    tokens.clear();
    logit_rows.clear();
    for (size_t i : more) {
      const Feed& f = *proposing[i];
      next.add(f.state->block_table, f.position + static_cast<int32_t>(f.tokens.size()) + j - 1, 1);
      tokens.push_back(out[i].tokens.back());
      logit_rows.push_back(next.num_rows() - 1);
    }
    TESSERA_RETURN_IF_ERROR(forward(tokens, next.batch()));
    for (size_t r = 0; r < more.size(); ++r) take(more[r], r, j);
  }
  return out;
}

StatusOr<ModelConfig> check_draft_model(const std::string& path, const ModelConfig& target, int64_t max_model_len) {
  auto fail = [&](const std::string& why) { return invalid_argument("speculative.draft_model " + path + ": " + why); };
  StatusOr<std::unique_ptr<Checkpoint>> ckpt = open_model_checkpoint(path);
  if (!ckpt.is_ok()) return fail(ckpt.status().message());
  StatusOr<ModelConfig> parsed = parse_model_config((*ckpt)->config(), (*ckpt)->config_source());
  if (!parsed.is_ok()) return fail(parsed.status().message());
  const ModelConfig& draft = *parsed;
  if (draft.vocab != target.vocab)
    return fail("its vocabulary has " + std::to_string(draft.vocab) + " ids, the target's " +
                std::to_string(target.vocab) + "; a draft must share the target's vocabulary");
  if (draft.max_positions > 0 && draft.max_positions < max_model_len)
    return fail("it reads " + std::to_string(draft.max_positions) + " positions, fewer than the " +
                std::to_string(max_model_len) + " of scheduler.max_model_len (lower that to the draft's)");
  const int32_t window = target.kv_window();
  if (window > 0 && (draft.kv_window() == 0 || draft.kv_window() > window))
    return fail("the target's sliding window of " + std::to_string(window) +
                " tokens gives back the KV blocks before it, which the draft (" +
                (draft.kv_window() == 0 ? std::string("full attention") :
                                          "a window of " + std::to_string(draft.kv_window())) +
                ") would read");
  return draft;
}

bool draft_splits(const ModelConfig& draft, int world) { return world > 1 && ShardSpec::make(draft, 0, world).is_ok(); }

StatusOr<std::unique_ptr<Transformer>> load_draft_model(const std::string& path, ModelLoadOptions options,
                                                        Backend& backend) {
  // The draft is small and runs k times a step: all of it stays resident.
  options.residency = WeightResidencyOptions{};
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, open_model_checkpoint(path));
  TESSERA_ASSIGN_OR_RETURN(ModelConfig mc, parse_model_config(ckpt->config(), ckpt->config_source()));
  ckpt.reset();
  const int world = options.comm != nullptr ? options.comm->world_size() : 1;
  options.plan = nullptr;  // the target's plan names the target's tensors
  options.quant.rules.clear();
  if (!draft_splits(mc, world)) options.comm = nullptr;
  return Transformer::load(path, options, backend);
}

int64_t draft_kv_bytes_per_block(const ModelConfig& draft, int world, int block_size, DType dtype) {
  ModelConfig local = draft;
  if (world > 1)
    if (StatusOr<ShardSpec> shard = ShardSpec::make(draft, 0, world); shard.is_ok()) local.kv_heads = shard->kv_heads;
  return KvCache::bytes_per_block(local, block_size, dtype);
}

}  // namespace tessera
