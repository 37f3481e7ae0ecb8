#include "worker/model_weights.h"

#include <algorithm>
#include <cstring>

namespace tessera {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// A part of a tensor: rows (axis 0) or columns (axis 1) [begin, begin + count); axis -1 is
// the whole tensor.
struct Slice {
  int axis = -1;
  int64_t begin = 0;
  int64_t count = 0;
};
Slice rows(int64_t begin, int64_t count) { return {0, begin, count}; }
Slice cols(int64_t begin, int64_t count) { return {1, begin, count}; }

// Reads tensors (or this rank's slice of them) by name, checking each against the shape
// config.json implies, so a mismatched checkpoint fails with the tensor's name rather than
// garbage output.
class WeightReader {
 public:
  WeightReader(const Checkpoint& ckpt, DType dtype) : ckpt_(ckpt), dtype_(dtype) {}

  StatusOr<Tensor> load(const std::string& name, const std::vector<int64_t>& shape, Slice slice = {}) {
    const TensorInfo* info = ckpt_.find(name);
    if (info == nullptr) return not_found("checkpoint has no tensor \"" + name + "\"");
    // An unsupported dtype is reported by name before the shape is compared.
    if (!info->dtype_supported) return ckpt_.load(name, dtype_).status();
    if (info->shape != shape) {
      return invalid_argument("tensor \"" + name + "\" has shape " + shape_str(info->shape) +
                              " but config.json implies " + shape_str(shape));
    }
    StatusOr<Tensor> t = slice.axis < 0 ? ckpt_.load(name, dtype_)
                                        : ckpt_.load_slice(name, dtype_, slice.axis, slice.begin, slice.count);
    if (!t.is_ok()) return t.status();
    // A converted or sliced copy no longer needs the mapped pages: drop them to keep peak
    // RSS near this rank's share.
    if (info->dtype != dtype_ || slice.axis == 1) ckpt_.release(name);
    total_bytes_ += static_cast<int64_t>(t->nbytes());
    return t;
  }

  // Optional tensors (biases): empty when the checkpoint lacks them.
  StatusOr<Tensor> load_optional(const std::string& name, const std::vector<int64_t>& shape, Slice slice = {}) {
    if (ckpt_.find(name) == nullptr) return Tensor();
    return load(name, shape, slice);
  }

  // A linear layer [out, in]. Column-parallel: `slice` takes rows, and the bias the same
  // rows. Row-parallel: `slice` takes columns; the bias is added once, by the rank with
  // `add_bias`, before the partial sums are all-reduced.
  StatusOr<LinearWeights> linear(const std::string& weight_name, int64_t out, int64_t in, Slice slice = {},
                                 bool add_bias = true) {
    LinearWeights l;
    TESSERA_ASSIGN_OR_RETURN(l.w, load(weight_name, {out, in}, slice));
    if (add_bias) {
      const Slice bias_slice = slice.axis == 0 ? slice : Slice{};
      TESSERA_ASSIGN_OR_RETURN(l.b, load_optional(bias_name(weight_name), {out}, bias_slice));
    }
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

// What the TP plan says about one group of linears: split (inputs column-parallel, output
// row-parallel) or kept whole. Anything else cannot be computed and is rejected by name.
StatusOr<bool> group_is_split(const WeightLoadOptions& o, const std::vector<std::string>& inputs,
                              const std::string& output) {
  if (o.shard.world == 1) return false;
  if (o.plan == nullptr) return true;
  const TpRole out_role = o.plan->role_of(output);
  // A kept output keeps its whole group (its inputs are then loaded whole too, whatever
  // their own role says): that is what keeping a row-parallel linear means.
  if (out_role == TpRole::kKeep) return false;
  if (out_role != TpRole::kRow) {
    return invalid_argument("TP plan: \"" + output + "\" must be row-parallel or kept whole, not " +
                            tp_role_name(out_role));
  }
  for (const std::string& in : inputs) {
    if (o.plan->role_of(in) != TpRole::kColumn) {
      return invalid_argument("TP plan: \"" + output + "\" is row-parallel, so \"" + in +
                              "\" must be column-parallel, not " + tp_role_name(o.plan->role_of(in)));
    }
  }
  return true;
}

Status load_attention(WeightReader& r, const ModelConfig& c, int layer, const WeightLoadOptions& o,
                      LayerWeights* lw) {
  const ArchSpec& a = *c.arch;
  const bool inject = o.kernel_inject;
  const int64_t D = c.head_dim;
  const std::string o_name = tensor_name(a.name_of(TensorRole::kO), layer);
  std::vector<std::string> inputs;
  if (a.qkv == QkvLayout::kFusedPerHead) {
    inputs = {tensor_name(a.name_of(TensorRole::kQkv), layer)};
  } else {
    for (TensorRole role : {TensorRole::kQ, TensorRole::kK, TensorRole::kV}) {
      inputs.push_back(tensor_name(a.name_of(role), layer));
    }
  }
  TESSERA_ASSIGN_OR_RETURN(lw->attn_split, group_is_split(o, inputs, o_name));
  const ShardSpec& sh = o.shard;
  // Heads this rank computes (all of them when the attention is kept whole).
  const int64_t q_heads = lw->attn_split ? sh.q_heads : c.heads;
  const int64_t q_off = lw->attn_split ? sh.q_head_offset : 0;
  const int64_t kv_heads = lw->attn_split ? sh.kv_heads : c.kv_heads;
  const int64_t kv_off = lw->attn_split ? sh.kv_head_offset : 0;
  const int64_t q_rows = q_heads * D, kv_rows = kv_heads * D;
  const Slice whole;

  if (a.qkv == QkvLayout::kFusedPerHead) {
    // Rows are [head, (q|k|v), D]: a head range is one contiguous row range.
    const std::string& name = inputs[0];
    const Slice s = lw->attn_split ? rows(q_off * 3 * D, q_heads * 3 * D) : whole;
    TESSERA_ASSIGN_OR_RETURN(LinearWeights raw, r.linear(name, 3 * c.heads * D, c.hidden, s));
    lw->qkv.w = reorder_per_head_qkv(raw.w, q_heads, D);
    if (!raw.b.empty()) lw->qkv.b = reorder_per_head_qkv(raw.b, q_heads, D);
    raw = {};
    r.release_linear(name);
    if (!inject) {
      lw->q = row_slice(lw->qkv, 0, q_rows);
      lw->k = row_slice(lw->qkv, q_rows, kv_rows);
      lw->v = row_slice(lw->qkv, q_rows + kv_rows, kv_rows);
      lw->qkv = {};
    }
  } else {
    const bool split = lw->attn_split;
    TESSERA_ASSIGN_OR_RETURN(lw->q, r.linear(inputs[0], c.heads * D, c.hidden, split ? rows(q_off * D, q_rows) : whole));
    TESSERA_ASSIGN_OR_RETURN(lw->k, r.linear(inputs[1], c.kv_heads * D, c.hidden, split ? rows(kv_off * D, kv_rows) : whole));
    TESSERA_ASSIGN_OR_RETURN(lw->v, r.linear(inputs[2], c.kv_heads * D, c.hidden, split ? rows(kv_off * D, kv_rows) : whole));
    if (inject) {
      lw->qkv = pack({&lw->q, &lw->k, &lw->v});
      lw->q = lw->k = lw->v = {};
      for (const std::string& n : inputs) r.release_linear(n);
    }
  }
  const bool split = lw->attn_split;
  TESSERA_ASSIGN_OR_RETURN(lw->o, r.linear(o_name, c.hidden, c.heads * D, split ? cols(q_off * D, q_rows) : whole,
                                           /*add_bias=*/!split || sh.rank == 0));
  return Status::ok();
}

// A SwiGLU MLP (dense or one expert): gate/up [ffn, hidden], down [hidden, ffn].
Status load_swiglu(WeightReader& r, const ModelConfig& c, int layer, int expert, const WeightLoadOptions& o,
                   bool* split, LinearWeights* gate, LinearWeights* up, LinearWeights* gate_up, LinearWeights* down) {
  const ArchSpec& a = *c.arch;
  const std::string gate_name = tensor_name(a.name_of(TensorRole::kGate), layer, expert);
  const std::string up_name = tensor_name(a.name_of(TensorRole::kUp), layer, expert);
  const std::string down_name = tensor_name(a.name_of(TensorRole::kDown), layer, expert);
  TESSERA_ASSIGN_OR_RETURN(*split, group_is_split(o, {gate_name, up_name}, down_name));
  const Slice in_slice = *split ? rows(o.shard.ffn_offset, o.shard.ffn) : Slice{};
  const Slice out_slice = *split ? cols(o.shard.ffn_offset, o.shard.ffn) : Slice{};
  TESSERA_ASSIGN_OR_RETURN(*gate, r.linear(gate_name, c.ffn, c.hidden, in_slice));
  TESSERA_ASSIGN_OR_RETURN(*up, r.linear(up_name, c.ffn, c.hidden, in_slice));
  TESSERA_ASSIGN_OR_RETURN(*down, r.linear(down_name, c.hidden, c.ffn, out_slice, !*split || o.shard.rank == 0));
  if (o.kernel_inject) {
    *gate_up = pack({gate, up});
    *gate = *up = {};
    r.release_linear(gate_name);
    r.release_linear(up_name);
  }
  return Status::ok();
}

Status load_mlp(WeightReader& r, const ModelConfig& c, int layer, const WeightLoadOptions& o, LayerWeights* lw) {
  const ArchSpec& a = *c.arch;
  switch (a.mlp) {
    case MlpKind::kGeluDense: {
      const std::string up_name = tensor_name(a.name_of(TensorRole::kUp), layer);
      const std::string down_name = tensor_name(a.name_of(TensorRole::kDown), layer);
      TESSERA_ASSIGN_OR_RETURN(lw->mlp_split, group_is_split(o, {up_name}, down_name));
      const bool split = lw->mlp_split;
      TESSERA_ASSIGN_OR_RETURN(lw->up, r.linear(up_name, c.ffn, c.hidden,
                                                split ? rows(o.shard.ffn_offset, o.shard.ffn) : Slice{}));
      TESSERA_ASSIGN_OR_RETURN(lw->down, r.linear(down_name, c.hidden, c.ffn,
                                                  split ? cols(o.shard.ffn_offset, o.shard.ffn) : Slice{},
                                                  !split || o.shard.rank == 0));
      return Status::ok();
    }
    case MlpKind::kSwiGlu: {
      bool split = false;
      TESSERA_RETURN_IF_ERROR(load_swiglu(r, c, layer, -1, o, &split, &lw->gate, &lw->up, &lw->gate_up, &lw->down));
      lw->mlp_split = split;
      return Status::ok();
    }
    case MlpKind::kMoeSwiGlu: {
      // The router is always whole: every rank must route every token the same way.
      TESSERA_ASSIGN_OR_RETURN(lw->router, r.linear(tensor_name(a.name_of(TensorRole::kRouter), layer),
                                                    c.num_experts, c.hidden));
      lw->experts.resize(c.num_experts);
      lw->expert_split.assign(c.num_experts, false);
      for (int e = 0; e < c.num_experts; ++e) {
        ExpertWeights& ew = lw->experts[e];
        bool split = false;
        TESSERA_RETURN_IF_ERROR(load_swiglu(r, c, layer, e, o, &split, &ew.gate, &ew.up, &ew.gate_up, &ew.down));
        lw->expert_split[e] = split;
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

StatusOr<ShardSpec> ShardSpec::make(const ModelConfig& c, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) {
    return invalid_argument("rank " + std::to_string(rank) + " outside a tensor-parallel world of " + std::to_string(world));
  }
  ShardSpec s;
  s.rank = rank;
  s.world = world;
  auto uneven = [&](const std::string& what, int64_t n) {
    return invalid_argument("tensor parallelism " + std::to_string(world) + " does not divide the " + what + " (" +
                            std::to_string(n) + ")");
  };
  if (c.heads % world != 0) return uneven("attention heads", c.heads);
  s.q_heads = c.heads / world;
  s.q_head_offset = rank * s.q_heads;
  if (c.heads % c.kv_heads != 0) return uneven("query heads into key/value groups", c.heads);
  const KvHeadRange kv = kv_heads_for_rank(c.heads, c.kv_heads, rank, world);
  s.kv_heads = kv.count;
  s.kv_head_offset = kv.first;
  if (c.ffn % world != 0) return uneven("MLP intermediate size", c.ffn);
  s.ffn = c.ffn / world;
  s.ffn_offset = rank * s.ffn;
  s.vocab = (c.vocab + world - 1) / world;
  s.vocab_offset = rank * s.vocab;
  s.vocab_rows = std::min(s.vocab, c.vocab - s.vocab_offset);
  if (s.vocab_rows <= 0) return uneven("vocabulary into non-empty parts", c.vocab);
  return s;
}

StatusOr<ModelWeights> load_model_weights(const Checkpoint& checkpoint, const ModelConfig& c,
                                          const WeightLoadOptions& options) {
  WeightReader r(checkpoint, options.dtype);
  const ArchSpec& a = *c.arch;
  const ShardSpec& sh = options.shard;
  ModelWeights mw;
  const std::string& embed_name = a.name_of(TensorRole::kEmbed);
  const std::string& head_name = a.name_of(TensorRole::kLmHead);
  mw.vocab_split = sh.world > 1 && (options.plan == nullptr || options.plan->role_of(embed_name) == TpRole::kVocab);
  const Slice vocab_rows = mw.vocab_split ? rows(sh.vocab_offset, sh.vocab_rows) : Slice{};
  TESSERA_ASSIGN_OR_RETURN(mw.embed, r.load(embed_name, {c.vocab, c.hidden}, vocab_rows));
  if (a.embedding_norm) {
    TESSERA_RETURN_IF_ERROR(load_norm(r, a.name_of(TensorRole::kEmbedNorm), c, &mw.embed_norm_w, &mw.embed_norm_b));
  }
  mw.layers.resize(c.layers);
  for (int l = 0; l < c.layers; ++l) {
    LayerWeights& lw = mw.layers[l];
    TESSERA_RETURN_IF_ERROR(load_norm(r, tensor_name(a.name_of(TensorRole::kAttnNorm), l), c,
                                      &lw.attn_norm_w, &lw.attn_norm_b));
    TESSERA_RETURN_IF_ERROR(load_attention(r, c, l, options, &lw));
    if (lw.attn_split != mw.layers[0].attn_split) {
      // The KV cache is laid out once for all layers.
      return invalid_argument("TP plan: attention must be split in every layer or in none (layer " +
                              std::to_string(l) + " differs from layer 0)");
    }
    TESSERA_RETURN_IF_ERROR(load_norm(r, tensor_name(a.name_of(TensorRole::kMlpNorm), l), c,
                                      &lw.mlp_norm_w, &lw.mlp_norm_b));
    TESSERA_RETURN_IF_ERROR(load_mlp(r, c, l, options, &lw));
  }
  TESSERA_RETURN_IF_ERROR(load_norm(r, a.name_of(TensorRole::kFinalNorm), c, &mw.final_norm_w, &mw.final_norm_b));
  if (c.tie_embeddings || checkpoint.find(head_name) == nullptr) {
    if (!c.tie_embeddings) {
      return not_found("checkpoint has no tensor \"" + head_name +
                       "\" and config.json does not set tie_word_embeddings");
    }
    mw.lm_head.w = mw.embed;  // shares the buffer (and the vocabulary split)
  } else {
    TESSERA_ASSIGN_OR_RETURN(mw.lm_head, r.linear(head_name, c.vocab, c.hidden, vocab_rows));
  }
  mw.total_bytes = r.total_bytes();
  int64_t decode = bytes_of(mw.lm_head) + static_cast<int64_t>(mw.final_norm_w.nbytes());
  for (const LayerWeights& lw : mw.layers) decode += layer_decode_bytes(lw, c);
  mw.decode_bytes_per_token = decode;
  return mw;
}

}  // namespace tessera
