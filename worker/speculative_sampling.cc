#include "worker/speculative_sampling.h"

#include <vector>

#include "common/splitmix64.h"

namespace tessera {

uint64_t speculative_stream_seed(uint64_t seed, SpeculativeStream stream) {
  return splitmix64(seed ^ splitmix64(0x5bec0000ULL + static_cast<uint64_t>(stream)));
}

namespace {

// The 53-bit integer of a counter-based uniform (u = n / 2^53, as counter_uniform makes it).
int64_t uniform_bits(uint64_t seed, SpeculativeStream stream, uint64_t index) {
  return static_cast<int64_t>(counter_uniform(speculative_stream_seed(seed, stream), index) * 0x1.0p53);
}

// d's probabilities at their ids in `row`, a dense row of the vocabulary (zero elsewhere).
void scatter(const TokenDistribution& d, float* row) {
  for (const TokenDistribution::Candidate& c : d.candidates()) row[c.id] = static_cast<float>(c.weight / d.total());
}

}  // namespace

std::vector<ProposalVerdict> verify_proposals(Backend& backend, std::span<const SampleRequest> targets,
                                              std::span<const int32_t> proposals,
                                              std::span<const TokenDistribution> q) {
  const auto rows = static_cast<int64_t>(targets.size());
  std::vector<ProposalVerdict> verdicts(targets.size());
  if (rows == 0) return verdicts;
  const int64_t vocab = targets[0].vocab;
  Tensor p_host = Tensor::zeros({rows, vocab}, DType::kF32), q_host = Tensor::zeros({rows, vocab}, DType::kF32);
  Tensor chosen = Tensor::zeros({rows}, DType::kI32), uniforms = Tensor::zeros({rows, 2}, DType::kI64);
  for (int64_t r = 0; r < rows; ++r) {
    const SampleRequest& t = targets[static_cast<size_t>(r)];
    scatter(token_distribution(t), p_host.data<float>() + r * vocab);
    scatter(q[static_cast<size_t>(r)], q_host.data<float>() + r * vocab);
    chosen.data<int32_t>()[r] = proposals[static_cast<size_t>(r)];
    const auto index = static_cast<uint64_t>(t.token_index);
    uniforms.data<int64_t>()[2 * r] = uniform_bits(t.seed, SpeculativeStream::kAccept, index);
    uniforms.data<int64_t>()[2 * r + 1] = uniform_bits(t.seed, SpeculativeStream::kResidual, index);
  }
  // To the backend's memory (on the CPU backend that is where they are).
  const bool on_host = backend.device() == DeviceKind::kCpu;
  auto placed = [&](Tensor host) {
    if (on_host) return host;
    Tensor d = backend.alloc(host.view().dims(), host.dtype());
    backend.copy_from_host(host.data<void>(), d.view());
    return d;
  };
  Tensor p_rows = placed(std::move(p_host)), q_rows = placed(std::move(q_host)), proposal_ids = placed(std::move(chosen));
  Tensor tokens = on_host ? Tensor::zeros({rows}, DType::kI32) : backend.alloc({rows}, DType::kI32);
  Tensor kept = on_host ? Tensor::zeros({rows}, DType::kI32) : backend.alloc({rows}, DType::kI32);
  backend.rejection_sample_rows(p_rows, q_rows, proposal_ids, uniforms, tokens, kept);
  std::vector<int32_t> token_ids(static_cast<size_t>(rows)), accepted(static_cast<size_t>(rows));
  backend.copy_to_host(tokens.view(), token_ids.data());
  backend.copy_to_host(kept.view(), accepted.data());
  for (size_t r = 0; r < verdicts.size(); ++r) verdicts[r] = {token_ids[r], accepted[r] == 1};
  return verdicts;
}

}  // namespace tessera
