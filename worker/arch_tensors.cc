#include "worker/arch_tensors.h"

#include <algorithm>

namespace tessera {
namespace {

using Kind = ExpectedTensor::Kind;

class TensorList {
 public:
  explicit TensorList(const ModelConfig& c) : c_(c), a_(*c.arch) {}

  // A linear weight [out, in] (and its bias when the family has one).
  void matrix(TensorRole role, int layer, int64_t out, int64_t in, int expert = -1) {
    const std::string name = name_of(role, layer, expert);
    const bool embedding = role == TensorRole::kEmbed || role == TensorRole::kPosEmbed || role == TensorRole::kLmHead;
    std::vector<int64_t> shape = {out, in};
    if (a_.conv1d_weights && !embedding) shape = {in, out};
    list_.push_back({name, shape, Kind::kMatrix, role});
    if (std::find(a_.biases.begin(), a_.biases.end(), role) != a_.biases.end()) {
      list_.push_back({bias_name(name), {out}, Kind::kBias, role});
    }
  }

  void norm(TensorRole role, int layer, int64_t size) {
    const std::string name = name_of(role, layer, -1);
    list_.push_back({name, {size}, Kind::kNorm, role});
    // q/k norms are RMSNorms in every family that has them.
    const bool head_norm = role == TensorRole::kQNorm || role == TensorRole::kKNorm;
    if (a_.norm == NormKind::kLayerNorm && !head_norm) list_.push_back({bias_name(name), {size}, Kind::kBias, role});
  }

  std::vector<ExpectedTensor> take() { return std::move(list_); }

 private:
  std::string name_of(TensorRole role, int layer, int expert) const {
    return tensor_name(layout_alternative(a_.name_of(role), c_), layer, expert);
  }

  const ModelConfig& c_;
  const ArchSpec& a_;
  std::vector<ExpectedTensor> list_;
};

}  // namespace

std::string layout_alternative(const std::string& pattern, const ModelConfig& c) {
  const std::vector<std::string> alts = name_alternatives(pattern);
  const bool last = c.block == BlockKind::kParallel && c.mlp_norm;
  return last ? alts.back() : alts.front();
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  const ArchSpec& a = *c.arch;
  const int64_t H = c.hidden, D = c.head_dim, Q = c.heads * D, KV = c.kv_heads * D;
  TensorList t(c);
  t.matrix(TensorRole::kEmbed, -1, c.vocab, H);
  if (a.position == PositionKind::kLearned) t.matrix(TensorRole::kPosEmbed, -1, c.max_positions, H);
  if (a.embedding_norm) t.norm(TensorRole::kEmbedNorm, -1, H);
  for (int l = 0; l < c.layers; ++l) {
    t.norm(TensorRole::kAttnNorm, l, H);
    if (c.qkv == QkvLayout::kSeparate) {
      t.matrix(TensorRole::kQ, l, Q, H);
      t.matrix(TensorRole::kK, l, KV, H);
      t.matrix(TensorRole::kV, l, KV, H);
    } else {
      t.matrix(TensorRole::kQkv, l, Q + 2 * KV, H);
    }
    if (a.qk_norm) {
      t.norm(TensorRole::kQNorm, l, D);
      t.norm(TensorRole::kKNorm, l, D);
    }
    t.matrix(TensorRole::kO, l, H, Q);
    if (a.post_norms) t.norm(TensorRole::kPostAttnNorm, l, H);
    if (c.mlp_norm) t.norm(TensorRole::kMlpNorm, l, H);
    if (c.layer[l].moe) {
      t.matrix(TensorRole::kRouter, l, c.num_experts, H);
      for (int e = 0; e < c.num_experts; ++e) {
        t.matrix(TensorRole::kExpertGate, l, c.moe_ffn, H, e);
        t.matrix(TensorRole::kExpertUp, l, c.moe_ffn, H, e);
        t.matrix(TensorRole::kExpertDown, l, H, c.moe_ffn, e);
      }
      if (c.shared_ffn > 0) {
        t.matrix(TensorRole::kSharedGate, l, c.shared_ffn, H);
        t.matrix(TensorRole::kSharedUp, l, c.shared_ffn, H);
        t.matrix(TensorRole::kSharedDown, l, H, c.shared_ffn);
        t.matrix(TensorRole::kSharedExpertGate, l, 1, H);
      }
    } else if (a.mlp == MlpKind::kGated && !a.name_of(TensorRole::kGateUp).empty()) {
      t.matrix(TensorRole::kGateUp, l, 2 * c.ffn, H);
      t.matrix(TensorRole::kDown, l, H, c.ffn);
    } else {
      if (a.mlp == MlpKind::kGated) t.matrix(TensorRole::kGate, l, c.ffn, H);
      t.matrix(TensorRole::kUp, l, c.ffn, H);
      t.matrix(TensorRole::kDown, l, H, c.ffn);
    }
    if (a.post_norms) t.norm(TensorRole::kPostMlpNorm, l, H);
  }
  t.norm(TensorRole::kFinalNorm, -1, H);
  if (!c.tie_embeddings) t.matrix(TensorRole::kLmHead, -1, c.vocab, H);
  return t.take();
}

}  // namespace tessera
