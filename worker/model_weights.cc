#include "worker/model_weights.h"

#include <cstring>

namespace tessera {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Reads tensors by name, checking each against the shape config.json implies, so a
// mismatched checkpoint fails with the tensor's name rather than garbage output.
class WeightReader {
 public:
  WeightReader(const Checkpoint& ckpt, DType dtype) : ckpt_(ckpt), dtype_(dtype) {}

  StatusOr<Tensor> load(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorInfo* info = ckpt_.find(name);
    if (info == nullptr) return not_found("checkpoint has no tensor \"" + name + "\"");
    // load() first: it rejects unsupported dtypes by name before the shape is compared.
    TESSERA_ASSIGN_OR_RETURN(Tensor t, ckpt_.load(name, dtype_));
    if (info->shape != shape) {
      return invalid_argument("tensor \"" + name + "\" has shape " + shape_str(info->shape) +
                              " but config.json implies " + shape_str(shape));
    }
    // A converted copy no longer needs the mapped pages: drop them to keep peak RSS low.
    if (info->dtype != dtype_) ckpt_.release(name);
    total_bytes_ += static_cast<int64_t>(t.nbytes());
    return t;
  }

  // Optional tensors (biases): empty when the checkpoint lacks them.
  StatusOr<Tensor> load_optional(const std::string& name, const std::vector<int64_t>& shape) {
    if (ckpt_.find(name) == nullptr) return Tensor();
    return load(name, shape);
  }

  StatusOr<LinearWeights> linear(const std::string& weight_name, int64_t out, int64_t in) {
    LinearWeights l;
    TESSERA_ASSIGN_OR_RETURN(l.w, load(weight_name, {out, in}));
    TESSERA_ASSIGN_OR_RETURN(l.b, load_optional(bias_name(weight_name), {out}));
    return l;
  }

  // After a tensor was copied (packed, reordered), its mapped pages can go.
  void release_linear(const std::string& weight_name) {
    ckpt_.release(weight_name);
    if (ckpt_.find(bias_name(weight_name)) != nullptr) ckpt_.release(bias_name(weight_name));
  }

  int64_t total_bytes() const { return total_bytes_; }
  DType dtype() const { return dtype_; }

 private:
  const Checkpoint& ckpt_;
  DType dtype_;
  int64_t total_bytes_ = 0;
};

// Stacks 2-D weights (same column count) into one [sum rows, cols] tensor; biases likewise
// (all present or all absent).
LinearWeights pack(const std::vector<const LinearWeights*>& parts) {
  int64_t rows = 0;
  const int64_t cols = parts[0]->w.dim(1);
  for (const auto* p : parts) rows += p->w.dim(0);
  LinearWeights packed;
  packed.w = Tensor::zeros({rows, cols}, parts[0]->w.dtype());
  char* dst = packed.w.data<char>();
  for (const auto* p : parts) {
    std::memcpy(dst, p->w.data<char>(), p->w.nbytes());
    dst += p->w.nbytes();
  }
  if (!parts[0]->b.empty()) {
    packed.b = Tensor::zeros({rows}, parts[0]->b.dtype());
    char* bdst = packed.b.data<char>();
    for (const auto* p : parts) {
      std::memcpy(bdst, p->b.data<char>(), p->b.nbytes());
      bdst += p->b.nbytes();
    }
  }
  return packed;
}

// Rows of a tensor as a Tensor sharing its owner.
Tensor row_view(const Tensor& t, int64_t begin, int64_t count) {
  return Tensor::borrowed(t.view().rows(begin, count), std::make_shared<Tensor>(t));
}

LinearWeights row_slice(const LinearWeights& l, int64_t begin, int64_t count) {
  LinearWeights out;
  out.w = row_view(l.w, begin, count);
  if (!l.b.empty()) out.b = row_view(l.b, begin, count);
  return out;
}

// BLOOM stores QKV rows as [head, (q|k|v), head_dim]; reorder to [(q|k|v), head, head_dim].
Tensor reorder_per_head_qkv(const Tensor& t, int64_t heads, int64_t head_dim) {
  const int64_t row_bytes = t.ndim() == 2 ? t.dim(1) * static_cast<int64_t>(dtype_size(t.dtype()))
                                          : static_cast<int64_t>(dtype_size(t.dtype()));
  Tensor out = Tensor::zeros(t.view().dims(), t.dtype());
  const char* src = t.data<char>();
  char* dst = out.data<char>();
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t c = 0; c < 3; ++c) {
      const int64_t src_row = (h * 3 + c) * head_dim;
      const int64_t dst_row = (c * heads + h) * head_dim;
      std::memcpy(dst + dst_row * row_bytes, src + src_row * row_bytes, head_dim * row_bytes);
    }
  }
  return out;
}

Status load_norm(WeightReader& r, const std::string& weight_name, const ModelConfig& c, Tensor* w,
                 Tensor* b) {
  TESSERA_ASSIGN_OR_RETURN(*w, r.load(weight_name, {c.hidden}));
  if (c.arch->norm == NormKind::kLayerNorm) {
    TESSERA_ASSIGN_OR_RETURN(*b, r.load(bias_name(weight_name), {c.hidden}));
  }
  return Status::ok();
}

Status load_attention(WeightReader& r, const ModelConfig& c, int layer, bool inject, LayerWeights* lw) {
  const ArchSpec& a = *c.arch;
  const int64_t q_rows = c.heads * c.head_dim, kv_rows = c.kv_heads * c.head_dim;
  if (a.qkv == QkvLayout::kFusedPerHead) {
    const std::string name = tensor_name(a.name_of(TensorRole::kQkv), layer);
    TESSERA_ASSIGN_OR_RETURN(LinearWeights raw, r.linear(name, q_rows + 2 * kv_rows, c.hidden));
    lw->qkv.w = reorder_per_head_qkv(raw.w, c.heads, c.head_dim);
    if (!raw.b.empty()) lw->qkv.b = reorder_per_head_qkv(raw.b, c.heads, c.head_dim);
    raw = {};
    r.release_linear(name);
    if (!inject) {
      lw->q = row_slice(lw->qkv, 0, q_rows);
      lw->k = row_slice(lw->qkv, q_rows, kv_rows);
      lw->v = row_slice(lw->qkv, q_rows + kv_rows, kv_rows);
      lw->qkv = {};
    }
  } else {
    const std::string qn = tensor_name(a.name_of(TensorRole::kQ), layer);
    const std::string kn = tensor_name(a.name_of(TensorRole::kK), layer);
    const std::string vn = tensor_name(a.name_of(TensorRole::kV), layer);
    TESSERA_ASSIGN_OR_RETURN(lw->q, r.linear(qn, q_rows, c.hidden));
    TESSERA_ASSIGN_OR_RETURN(lw->k, r.linear(kn, kv_rows, c.hidden));
    TESSERA_ASSIGN_OR_RETURN(lw->v, r.linear(vn, kv_rows, c.hidden));
    if (inject) {
      lw->qkv = pack({&lw->q, &lw->k, &lw->v});
      lw->q = lw->k = lw->v = {};
      for (const std::string* n : {&qn, &kn, &vn}) r.release_linear(*n);
    }
  }
  TESSERA_ASSIGN_OR_RETURN(lw->o, r.linear(tensor_name(a.name_of(TensorRole::kO), layer), c.hidden, q_rows));
  return Status::ok();
}

// A SwiGLU MLP (dense or one expert): gate/up [ffn, hidden], down [hidden, ffn].
Status load_swiglu(WeightReader& r, const ModelConfig& c, int layer, int expert, bool inject,
                   LinearWeights* gate, LinearWeights* up, LinearWeights* gate_up, LinearWeights* down) {
  const ArchSpec& a = *c.arch;
  const std::string gate_name = tensor_name(a.name_of(TensorRole::kGate), layer, expert);
  const std::string up_name = tensor_name(a.name_of(TensorRole::kUp), layer, expert);
  TESSERA_ASSIGN_OR_RETURN(*gate, r.linear(gate_name, c.ffn, c.hidden));
  TESSERA_ASSIGN_OR_RETURN(*up, r.linear(up_name, c.ffn, c.hidden));
  TESSERA_ASSIGN_OR_RETURN(*down, r.linear(tensor_name(a.name_of(TensorRole::kDown), layer, expert), c.hidden, c.ffn));
  if (inject) {
    *gate_up = pack({gate, up});
    *gate = *up = {};
    r.release_linear(gate_name);
    r.release_linear(up_name);
  }
  return Status::ok();
}

Status load_mlp(WeightReader& r, const ModelConfig& c, int layer, bool inject, LayerWeights* lw) {
  const ArchSpec& a = *c.arch;
  switch (a.mlp) {
    case MlpKind::kGeluDense: {
      TESSERA_ASSIGN_OR_RETURN(lw->up, r.linear(tensor_name(a.name_of(TensorRole::kUp), layer), c.ffn, c.hidden));
      TESSERA_ASSIGN_OR_RETURN(lw->down, r.linear(tensor_name(a.name_of(TensorRole::kDown), layer), c.hidden, c.ffn));
      return Status::ok();
    }
    case MlpKind::kSwiGlu:
      return load_swiglu(r, c, layer, -1, inject, &lw->gate, &lw->up, &lw->gate_up, &lw->down);
    case MlpKind::kMoeSwiGlu: {
      TESSERA_ASSIGN_OR_RETURN(lw->router, r.linear(tensor_name(a.name_of(TensorRole::kRouter), layer),
                                                    c.num_experts, c.hidden));
      lw->experts.resize(c.num_experts);
      for (int e = 0; e < c.num_experts; ++e) {
        ExpertWeights& ew = lw->experts[e];
        TESSERA_RETURN_IF_ERROR(load_swiglu(r, c, layer, e, inject, &ew.gate, &ew.up, &ew.gate_up, &ew.down));
      }
      return Status::ok();
    }
  }
  return internal_error("unknown MLP kind");
}

int64_t bytes_of(const LinearWeights& l) {
  return static_cast<int64_t>((l.w.empty() ? 0 : l.w.nbytes()) + (l.b.empty() ? 0 : l.b.nbytes()));
}

int64_t layer_decode_bytes(const LayerWeights& lw, const ModelConfig& c) {
  int64_t bytes = bytes_of(lw.q) + bytes_of(lw.k) + bytes_of(lw.v) + bytes_of(lw.qkv) + bytes_of(lw.o) +
                  bytes_of(lw.gate) + bytes_of(lw.up) + bytes_of(lw.gate_up) + bytes_of(lw.down) +
                  bytes_of(lw.router);
  for (const ExpertWeights& e : lw.experts) {
    // Batch 1 reads top_k of num_experts experts per token.
    bytes += (bytes_of(e.gate) + bytes_of(e.up) + bytes_of(e.gate_up) + bytes_of(e.down)) * c.top_k / c.num_experts;
  }
  for (const Tensor* t : {&lw.attn_norm_w, &lw.attn_norm_b, &lw.mlp_norm_w, &lw.mlp_norm_b}) {
    if (!t->empty()) bytes += static_cast<int64_t>(t->nbytes());
  }
  return bytes;
}

}  // namespace

StatusOr<ModelWeights> load_model_weights(const Checkpoint& checkpoint, const ModelConfig& c,
                                          const WeightLoadOptions& options) {
  WeightReader r(checkpoint, options.dtype);
  const ArchSpec& a = *c.arch;
  ModelWeights mw;
  TESSERA_ASSIGN_OR_RETURN(mw.embed, r.load(a.name_of(TensorRole::kEmbed), {c.vocab, c.hidden}));
  if (a.embedding_norm) {
    TESSERA_RETURN_IF_ERROR(load_norm(r, a.name_of(TensorRole::kEmbedNorm), c, &mw.embed_norm_w, &mw.embed_norm_b));
  }
  mw.layers.resize(c.layers);
  for (int l = 0; l < c.layers; ++l) {
    LayerWeights& lw = mw.layers[l];
    TESSERA_RETURN_IF_ERROR(load_norm(r, tensor_name(a.name_of(TensorRole::kAttnNorm), l), c,
                                      &lw.attn_norm_w, &lw.attn_norm_b));
    TESSERA_RETURN_IF_ERROR(load_attention(r, c, l, options.kernel_inject, &lw));
    TESSERA_RETURN_IF_ERROR(load_norm(r, tensor_name(a.name_of(TensorRole::kMlpNorm), l), c,
                                      &lw.mlp_norm_w, &lw.mlp_norm_b));
    TESSERA_RETURN_IF_ERROR(load_mlp(r, c, l, options.kernel_inject, &lw));
  }
  TESSERA_RETURN_IF_ERROR(load_norm(r, a.name_of(TensorRole::kFinalNorm), c, &mw.final_norm_w, &mw.final_norm_b));
  const std::string& head_name = a.name_of(TensorRole::kLmHead);
  if (c.tie_embeddings || checkpoint.find(head_name) == nullptr) {
    if (!c.tie_embeddings) {
      return not_found("checkpoint has no tensor \"" + head_name +
                       "\" and config.json does not set tie_word_embeddings");
    }
    mw.lm_head.w = mw.embed;  // shares the buffer
  } else {
    TESSERA_ASSIGN_OR_RETURN(mw.lm_head, r.linear(head_name, c.vocab, c.hidden));
  }
  mw.total_bytes = r.total_bytes();
  int64_t decode = bytes_of(mw.lm_head) + static_cast<int64_t>(mw.final_norm_w.nbytes());
  for (const LayerWeights& lw : mw.layers) decode += layer_decode_bytes(lw, c);
  mw.decode_bytes_per_token = decode;
  return mw;
}

}  // namespace tessera
