#include "common/sequence_states.h"

#include <algorithm>
#include <string>
#include <unordered_map>

namespace tessera {
namespace {

std::string who(const StepPlan& plan, const SeqStep& s) {
  return "step " + std::to_string(plan.step_id) + ", sequence " + std::to_string(s.seq_id);
}

}  // namespace

Status SequenceStates::check(const StepPlan& plan) const {
  // A plan drops few sequences (those that ended since the last one): a scan beats a set.
  auto is_dropped = [&](SeqId id) {
    return std::find(plan.dropped.begin(), plan.dropped.end(), id) != plan.dropped.end();
  };
  std::unordered_map<SeqId, const SeqStep*> seen;  // the plan's steps so far
  seen.reserve(plan.seqs.size());
  for (const SeqStep& s : plan.seqs) {
    if (!seen.emplace(s.seq_id, &s).second) return invalid_argument(who(plan, s) + ": listed twice");
    const SeqId sample_from = s.start ? s.start->sample_from : 0;
    if (sample_from != 0) {
      // A forked choice's first step: no tokens, the parent's logits row, the parent's KV.
      auto parent = seen.find(sample_from);
      if (!s.tokens.empty() || !s.sample)
        return invalid_argument(who(plan, s) + ": a step sampling from sequence " + std::to_string(sample_from) +
                                " feeds no tokens and samples");
      if (parent == seen.end() || parent->second == &s || !parent->second->sample ||
          parent->second->tokens.empty() || parent->second->num_draft != 0)
        return invalid_argument(who(plan, s) + ": samples from sequence " + std::to_string(sample_from) +
                                ", which is not an earlier step of this plan computing tokens and sampling");
      const int64_t parent_end = int64_t{parent->second->num_computed} + static_cast<int64_t>(parent->second->tokens.size());
      if (s.num_computed != parent_end)
        return invalid_argument(who(plan, s) + ": num_computed " + std::to_string(s.num_computed) + " but sequence " +
                                std::to_string(sample_from) + "'s step ends at " + std::to_string(parent_end));
    } else if (s.tokens.empty()) {
      return invalid_argument(who(plan, s) + ": no tokens");
    }
    if (s.num_computed < 0) return invalid_argument(who(plan, s) + ": negative num_computed");
    if (s.num_draft != 0) {
      if (s.num_draft < 0 || s.num_draft > SeqStep::kMaxDraft ||
          static_cast<size_t>(s.num_draft) >= s.tokens.size())
        return invalid_argument(who(plan, s) + ": " + std::to_string(s.num_draft) + " proposals among " +
                                std::to_string(s.tokens.size()) + " tokens (at most " +
                                std::to_string(SeqStep::kMaxDraft) + ", and fewer than the tokens)");
      if (!s.sample) return invalid_argument(who(plan, s) + ": proposals need a sampling step");
      if (s.allowed_tokens.size() % static_cast<size_t>(s.num_draft + 1) != 0)
        return invalid_argument(who(plan, s) + ": " + std::to_string(s.allowed_tokens.size()) +
                                " mask words do not split into a mask for each of the " +
                                std::to_string(s.num_draft + 1) + " checked rows");
    }
    size_t held_size = 0;
    int32_t held_released = 0;
    Pooling pooling = Pooling::kNone;
    if (s.version == 1) {
      if (!s.start) return invalid_argument(who(plan, s) + ": version 1 starts the sequence but carries no state");
      if (s.table_from != 0) return invalid_argument(who(plan, s) + ": a starting step must send the whole block table");
      const SeqStart& st = *s.start;
      pooling = st.pooling;
      // (A chunked prefill's first chunk may end before the prompt does.)
      if (st.prompt_len < 0) return invalid_argument(who(plan, s) + ": negative prompt_len");
      if (st.sampling.has_penalty() && st.history.size() != static_cast<size_t>(s.num_computed))
        return invalid_argument(who(plan, s) + ": a penalty needs the " + std::to_string(s.num_computed) +
                                " tokens before the step, got " + std::to_string(st.history.size()));
      if (st.sampling.prompt_logprobs >= 0 && st.prompt.size() != static_cast<size_t>(st.prompt_len))
        return invalid_argument(who(plan, s) + ": prompt logprobs need the " + std::to_string(st.prompt_len) +
                                "-token prompt, got " + std::to_string(st.prompt.size()) + " tokens");
    } else {
      if (s.start) return invalid_argument(who(plan, s) + ": only version 1 may carry the starting state");
      auto it = states_.find(s.seq_id);
      if (it == states_.end() || is_dropped(s.seq_id)) {
        return invalid_argument(who(plan, s) + ": version " + std::to_string(s.version) +
                                " continues a sequence this executor does not hold (restarted, or its start was "
                                "never applied); it must be sent in full");
      }
      const HeldSequence& h = it->second;
      if (s.version != h.version + 1) {
        return invalid_argument(who(plan, s) + ": version " + std::to_string(s.version) + " does not follow version " +
                                std::to_string(h.version) + " held here");
      }
      if (s.num_computed != h.num_fed) {
        return invalid_argument(who(plan, s) + ": num_computed " + std::to_string(s.num_computed) + " but " +
                                std::to_string(h.num_fed) + " tokens were fed here");
      }
      held_size = h.block_table.size();
      held_released = h.num_released;
      pooling = h.pooling;
    }
    if (pooling != Pooling::kNone && (s.sample || s.propose != 0 || s.tokens.empty()))
      return invalid_argument(who(plan, s) + ": an embedding sequence only feeds tokens (it never samples)");
    if (s.table_from < 0 || static_cast<size_t>(s.table_from) > held_size)
      return invalid_argument(who(plan, s) + ": table change from entry " + std::to_string(s.table_from) +
                              " of a " + std::to_string(held_size) + "-entry table");
    const int64_t size = int64_t{s.table_from} + static_cast<int64_t>(s.new_blocks.size());
    if (s.num_released < held_released || s.num_released > size)
      return invalid_argument(who(plan, s) + ": " + std::to_string(s.num_released) + " released entries of a " +
                              std::to_string(size) + "-entry table (" + std::to_string(held_released) +
                              " released before)");
    const int64_t end = s.num_computed + static_cast<int64_t>(s.tokens.size());
    if (block_size_ > 0 && size * block_size_ < end)
      return invalid_argument(who(plan, s) + ": block table of " + std::to_string(size) + " blocks cannot hold " +
                              std::to_string(end) + " tokens");
    for (size_t k = 0; k < s.new_blocks.size(); ++k) {
      const int32_t b = s.new_blocks[k];
      const int64_t entry = s.table_from + static_cast<int64_t>(k);
      if (b == -1 && entry < s.num_released) continue;
      if (b < 0 || (num_blocks_ > 0 && b >= num_blocks_)) {
        return invalid_argument(who(plan, s) + ": block " + std::to_string(b) + " (table entry " +
                                std::to_string(entry) + ") outside the pool");
      }
    }
  }
  return Status::ok();
}

StatusOr<std::vector<SeqView>> SequenceStates::apply(const StepPlan& plan) {
  TESSERA_RETURN_IF_ERROR(check(plan));
  for (SeqId id : plan.dropped) states_.erase(id);
  for (const SeqStep& s : plan.seqs) {
    HeldSequence& st = states_[s.seq_id];
    if (s.start) {
      st = HeldSequence{};
      st.sampling = s.start->sampling;
      st.prompt_len = s.start->prompt_len;
      if (st.sampling.has_penalty()) st.history = s.start->history;
      if (st.sampling.prompt_logprobs >= 0) st.prompt = s.start->prompt;
      st.pooling = s.start->pooling;
      st.lora = s.start->lora;
    }
    st.version = s.version;
    st.block_table.resize(static_cast<size_t>(s.table_from));
    st.block_table.insert(st.block_table.end(), s.new_blocks.begin(), s.new_blocks.end());
    for (int32_t k = st.num_released; k < s.num_released; ++k) st.block_table[static_cast<size_t>(k)] = -1;
    st.num_released = s.num_released;
    st.num_fed = s.num_computed + static_cast<int32_t>(s.tokens.size());
    st.num_draft = s.num_draft;
    if (st.sampling.has_penalty()) st.history.insert(st.history.end(), s.tokens.begin(), s.tokens.end());
  }
  std::vector<SeqView> views;
  views.reserve(plan.seqs.size());
  for (const SeqStep& s : plan.seqs) views.push_back(SeqView{&s, &states_.at(s.seq_id)});
  return views;
}

void SequenceStates::rewind(SeqId id, int32_t num_rejected) {
  HeldSequence& st = states_.at(id);
  st.num_fed -= num_rejected;
  st.num_draft = 0;
  if (st.sampling.has_penalty()) st.history.resize(st.history.size() - static_cast<size_t>(num_rejected));
}

const HeldSequence* SequenceStates::find(SeqId id) const {
  auto it = states_.find(id);
  return it == states_.end() ? nullptr : &it->second;
}

}  // namespace tessera
