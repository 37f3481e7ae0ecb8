#include "worker/model_weights.h"

#include <algorithm>

#include "worker/weight_quantization.h"
#include "worker/weight_reader.h"
#include "worker/weight_units.h"

namespace tessera {
namespace {

using namespace weight_loading;  // NOLINT: the loader below is written in its reader

// Rows of a tensor as a Tensor sharing its owner.
Tensor row_view(const Tensor& t, int64_t begin, int64_t count) {
  return Tensor::borrowed(t.view().rows(begin, count), std::make_shared<Tensor>(t));
}

// The sources of rows [begin, begin + count) of a linear made of `rows`.
std::vector<LinearSource::Rows> source_rows(const std::vector<LinearSource::Rows>& rows, int64_t begin, int64_t count) {
  std::vector<LinearSource::Rows> out;
  int64_t at = 0;  // the first output row of `r`
  for (const LinearSource::Rows& r : rows) {
    const int64_t lo = std::max(begin, at), hi = std::min(begin + count, at + r.count);
    if (lo < hi) out.push_back({r.weight, r.begin + (lo - at), hi - lo});
    at += r.count;
  }
  return out;
}

LinearWeights row_slice(const LinearWeights& l, int64_t begin, int64_t count) {
  LinearWeights out;
  out.w = row_view(l.w, begin, count);
  if (!l.b.empty()) out.b = row_view(l.b, begin, count);
  out.source.rows = source_rows(l.source.rows, begin, count);
  out.source.in_begin = l.source.in_begin;
  out.source.in_count = l.source.in_count;
  out.ggml_blocks = l.ggml_blocks;  // rows of blocks are whole rows: each view packs as its own matrix
  return out;
}

Status load_norm(WeightReader& r, const ModelConfig& c, TensorRole role, int layer, Tensor* w, Tensor* b,
                 int64_t size = 0) {
  const ArchSpec& a = *c.arch;
  return r.norm(tensor_name(a.name_of(role), layer), size > 0 ? size : c.hidden, a.norm, a.norm_weight_offset, w, b);
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

// Where this rank's q, k and v rows lie in the checkpoint, for any QKV layout.
struct QkvSegments {
  std::vector<RowSegment> q, k, v;
};

QkvSegments qkv_segments(const ModelConfig& c, int layer, int64_t q_off, int64_t q_heads, int64_t kv_off,
                         int64_t kv_heads) {
  const ArchSpec& a = *c.arch;
  const int64_t D = c.head_dim, H = c.heads, KV = c.kv_heads;
  QkvSegments s;
  switch (c.qkv) {
    case QkvLayout::kSeparate:
      add_segment(s.q, tensor_name(a.name_of(TensorRole::kQ), layer), H * D, q_off * D, q_heads * D);
      add_segment(s.k, tensor_name(a.name_of(TensorRole::kK), layer), KV * D, kv_off * D, kv_heads * D);
      add_segment(s.v, tensor_name(a.name_of(TensorRole::kV), layer), KV * D, kv_off * D, kv_heads * D);
      break;
    case QkvLayout::kConcat: {
      const std::string name = tensor_name(a.name_of(TensorRole::kQkv), layer);
      const int64_t total = (H + 2 * KV) * D;
      add_segment(s.q, name, total, q_off * D, q_heads * D);
      add_segment(s.k, name, total, (H + kv_off) * D, kv_heads * D);
      add_segment(s.v, name, total, (H + KV + kv_off) * D, kv_heads * D);
      break;
    }
    case QkvLayout::kGrouped: {
      // Rows per KV group g: [q heads g*qpg .. (g+1)*qpg - 1, k_g, v_g], D rows each.
      const std::string name = tensor_name(a.name_of(TensorRole::kQkv), layer);
      const int64_t qpg = H / KV, group_rows = (qpg + 2) * D, total = KV * group_rows;
      for (int64_t h = q_off; h < q_off + q_heads; ++h) {
        add_segment(s.q, name, total, (h / qpg) * group_rows + (h % qpg) * D, D);
      }
      for (int64_t g = kv_off; g < kv_off + kv_heads; ++g) {
        add_segment(s.k, name, total, g * group_rows + qpg * D, D);
        add_segment(s.v, name, total, g * group_rows + (qpg + 1) * D, D);
      }
      break;
    }
  }
  return s;
}

Status load_attention(WeightReader& r, const ModelConfig& c, int layer, const WeightLoadOptions& o,
                      LayerWeights* lw) {
  const ArchSpec& a = *c.arch;
  const int64_t D = c.head_dim;
  const std::string o_name = tensor_name(a.name_of(TensorRole::kO), layer);
  std::vector<std::string> inputs;
  for (TensorRole role : {TensorRole::kQ, TensorRole::kK, TensorRole::kV, TensorRole::kQkv}) {
    if (!a.name_of(role).empty()) inputs.push_back(tensor_name(a.name_of(role), layer));
  }
  TESSERA_ASSIGN_OR_RETURN(lw->attn_split, group_is_split(o, inputs, o_name));
  const ShardSpec& sh = o.shard;
  const bool split = lw->attn_split;
  // Heads this rank computes (all of them when the attention is kept whole).
  const int64_t q_heads = split ? sh.q_heads : c.heads;
  const int64_t q_off = split ? sh.q_head_offset : 0;
  const int64_t kv_heads = split ? sh.kv_heads : c.kv_heads;
  const int64_t kv_off = split ? sh.kv_head_offset : 0;
  const QkvSegments segs = qkv_segments(c, layer, q_off, q_heads, kv_off, kv_heads);
  std::vector<RowSegment> all = segs.q;  // [q | k | v] rows of this rank, in that order
  for (const RowSegment& s : segs.k) add_segment(all, s.name, s.out, s.begin, s.count);
  for (const RowSegment& s : segs.v) add_segment(all, s.name, s.out, s.begin, s.count);
  // Separate q, k, v of different block types stay three matrices (the transformer projects
  // them one by one) rather than being decoded into one.
  const bool separate_types = c.qkv == QkvLayout::kSeparate && r.mixed_blocks(all);
  if (o.kernel_inject && !separate_types) {
    TESSERA_ASSIGN_OR_RETURN(lw->qkv, r.gather(all, c.hidden));
  } else if (c.qkv == QkvLayout::kSeparate) {
    TESSERA_ASSIGN_OR_RETURN(lw->q, r.gather(segs.q, c.hidden));
    TESSERA_ASSIGN_OR_RETURN(lw->k, r.gather(segs.k, c.hidden));
    TESSERA_ASSIGN_OR_RETURN(lw->v, r.gather(segs.v, c.hidden));
  } else {
    // One fused source: gather this rank's rows once, then q, k, v are row views of it.
    TESSERA_ASSIGN_OR_RETURN(LinearWeights packed, r.gather(all, c.hidden));
    lw->q = row_slice(packed, 0, q_heads * D);
    lw->k = row_slice(packed, q_heads * D, kv_heads * D);
    lw->v = row_slice(packed, (q_heads + kv_heads) * D, kv_heads * D);
  }
  if (a.qk_norm) {
    Tensor unused;
    TESSERA_RETURN_IF_ERROR(load_norm(r, c, TensorRole::kQNorm, layer, &lw->q_norm, &unused, D));
    TESSERA_RETURN_IF_ERROR(load_norm(r, c, TensorRole::kKNorm, layer, &lw->k_norm, &unused, D));
  }
  TESSERA_ASSIGN_OR_RETURN(lw->o, r.linear(o_name, c.hidden, c.heads * D, split ? cols(q_off * D, q_heads * D) : Slice{},
                                           /*add_bias=*/!split || sh.rank == 0));
  return Status::ok();
}

// One MLP (dense, one expert, or the shared expert) of intermediate width `ffn`. Gated:
// gate and up are separate tensors or the halves of a fused gate_up (Phi-3).
struct MlpNames {
  std::string gate, up, gate_up, down;  // gate/gate_up empty when not used
};

Status load_mlp_inputs(WeightReader& r, const ModelConfig& c, const MlpNames& n, int64_t ffn, int64_t f, int64_t off,
                       bool gated, bool inject, MlpWeights* w);

Status load_mlp_group(WeightReader& r, const ModelConfig& c, const MlpNames& n, int64_t ffn, bool gated,
                      const WeightLoadOptions& o, bool* split, MlpWeights* w) {
  std::vector<std::string> inputs;
  for (const std::string* in : {&n.gate, &n.up, &n.gate_up}) {
    if (!in->empty()) inputs.push_back(*in);
  }
  TESSERA_ASSIGN_OR_RETURN(*split, group_is_split(o, inputs, n.down));
  const int64_t f = *split ? o.shard.share(ffn) : ffn;
  const int64_t off = *split ? o.shard.share_offset(ffn) : 0;
  TESSERA_RETURN_IF_ERROR(load_mlp_inputs(r, c, n, ffn, f, off, gated, o.kernel_inject, w));
  TESSERA_ASSIGN_OR_RETURN(w->down, r.linear(n.down, c.hidden, ffn, *split ? cols(off, f) : Slice{},
                                             !*split || o.shard.rank == 0));
  return Status::ok();
}

// The input projections of one MLP: this rank's rows [off, off + f) of each (f = ffn when whole).
Status load_mlp_inputs(WeightReader& r, const ModelConfig& c, const MlpNames& n, int64_t ffn, int64_t f, int64_t off,
                       bool gated, bool inject, MlpWeights* w) {
  if (!gated) {
    TESSERA_ASSIGN_OR_RETURN(w->up, r.linear(n.up, ffn, c.hidden, f == ffn ? Slice{} : rows(off, f)));
    return Status::ok();
  }
  std::vector<RowSegment> gate, up;
  if (!n.gate_up.empty()) {
    add_segment(gate, n.gate_up, 2 * ffn, off, f);
    add_segment(up, n.gate_up, 2 * ffn, ffn + off, f);
  } else {
    add_segment(gate, n.gate, ffn, off, f);
    add_segment(up, n.up, ffn, off, f);
  }
  std::vector<RowSegment> both = gate;  // [gate | up] rows of this rank
  add_segment(both, up[0].name, up[0].out, up[0].begin, up[0].count);
  if (inject) {
    TESSERA_ASSIGN_OR_RETURN(w->gate_up, r.gather(both, c.hidden));
  } else if (!n.gate_up.empty()) {
    TESSERA_ASSIGN_OR_RETURN(LinearWeights packed, r.gather(both, c.hidden));
    w->gate = row_slice(packed, 0, f);
    w->up = row_slice(packed, f, f);
  } else {
    TESSERA_ASSIGN_OR_RETURN(w->gate, r.gather(gate, c.hidden));
    TESSERA_ASSIGN_OR_RETURN(w->up, r.gather(up, c.hidden));
  }
  return Status::ok();
}

MlpNames mlp_names(const ArchSpec& a, TensorRole gate, TensorRole up, TensorRole gate_up, TensorRole down, int layer,
                   int expert = -1) {
  auto name = [&](TensorRole role) {
    return a.name_of(role).empty() ? std::string() : tensor_name(a.name_of(role), layer, expert);
  };
  return {name(gate), name(up), gate_up == TensorRole::kCount ? std::string() : name(gate_up), name(down)};
}

Status load_mlp(WeightReader& r, const ModelConfig& c, int layer, const WeightLoadOptions& o, LayerWeights* lw) {
  const ArchSpec& a = *c.arch;
  const bool gated = a.mlp == MlpKind::kGated;
  if (!c.layer[layer].moe) {
    const MlpNames n = mlp_names(a, TensorRole::kGate, TensorRole::kUp, TensorRole::kGateUp, TensorRole::kDown, layer);
    return load_mlp_group(r, c, n, c.ffn, gated, o, &lw->mlp_split, &lw->mlp);
  }
  // The router (and the shared expert's gate) are always whole: every rank must route
  // every token the same way.
  TESSERA_ASSIGN_OR_RETURN(lw->router, r.linear(tensor_name(a.name_of(TensorRole::kRouter), layer), c.num_experts,
                                                c.hidden));
  lw->experts.resize(c.num_experts);
  lw->expert_split.assign(c.num_experts, false);
  for (int e = 0; e < c.num_experts; ++e) {
    const MlpNames n = mlp_names(a, TensorRole::kExpertGate, TensorRole::kExpertUp, TensorRole::kCount,
                                 TensorRole::kExpertDown, layer, e);
    bool split = false;
    TESSERA_RETURN_IF_ERROR(load_mlp_group(r, c, n, c.moe_ffn, /*gated=*/true, o, &split, &lw->experts[e]));
    lw->expert_split[e] = split;
  }
  if (c.shared_ffn > 0) {
    const MlpNames n = mlp_names(a, TensorRole::kSharedGate, TensorRole::kSharedUp, TensorRole::kCount,
                                 TensorRole::kSharedDown, layer);
    TESSERA_RETURN_IF_ERROR(load_mlp_group(r, c, n, c.shared_ffn, /*gated=*/true, o, &lw->shared_split, &lw->shared));
    TESSERA_ASSIGN_OR_RETURN(lw->shared_gate,
                             r.linear(tensor_name(a.name_of(TensorRole::kSharedExpertGate), layer), 1, c.hidden));
  }
  return Status::ok();
}

int64_t bytes_of(const LinearWeights& l) {
  return static_cast<int64_t>((l.w.empty() ? 0 : l.w.nbytes()) + (l.b.empty() ? 0 : l.b.nbytes()) +
                              (l.scales.empty() ? 0 : l.scales.nbytes()));
}

int64_t bytes_of(const MlpWeights& e) {
  return bytes_of(e.gate) + bytes_of(e.up) + bytes_of(e.gate_up) + bytes_of(e.down);
}

int64_t layer_decode_bytes(const LayerWeights& lw, const ModelConfig& c) {
  int64_t bytes = bytes_of(lw.q) + bytes_of(lw.k) + bytes_of(lw.v) + bytes_of(lw.qkv) + bytes_of(lw.o) +
                  bytes_of(lw.mlp) + bytes_of(lw.router) + bytes_of(lw.shared) + bytes_of(lw.shared_gate);
  for (const MlpWeights& e : lw.experts) {
    // Batch 1 reads top_k of num_experts experts per token.
    bytes += bytes_of(e) * c.top_k / c.num_experts;
  }
  for (const Tensor* t : {&lw.attn_norm_w, &lw.attn_norm_b, &lw.mlp_norm_w, &lw.mlp_norm_b, &lw.post_attn_norm_w,
                          &lw.post_attn_norm_b, &lw.post_mlp_norm_w, &lw.post_mlp_norm_b, &lw.q_norm, &lw.k_norm}) {
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
  bool dense_layers = !c.has_moe();
  for (const LayerSpec& l : c.layer) dense_layers |= !l.moe;
  if (dense_layers && c.ffn % world != 0) return uneven("MLP intermediate size", c.ffn);
  if (c.has_moe() && c.moe_ffn % world != 0) return uneven("experts' intermediate size", c.moe_ffn);
  if (c.shared_ffn > 0 && c.shared_ffn % world != 0) return uneven("shared expert's intermediate size", c.shared_ffn);
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
  const ArchSpec& a = *c.arch;
  // GPTQ/AWQ tensors would otherwise surface as a missing ".weight" tensor.
  TESSERA_RETURN_IF_ERROR(check_not_prequantized(checkpoint));
  // GGUF files hold every linear weight [out, in]: llama.cpp's converter transposed GPT-2's.
  // Resolved once here: the reader keeps quantized matrices as blocks when panels are to be
  // made of them (panel_scheme_of_blocks).
  const QuantizationOptions quant = resolve_quantization(options.quant, checkpoint);
  const KeptBlocks kept_blocks = quant.kind == WeightQuantization::kInt4 ? KeptBlocks::kAlways
                             : quant.keep_blocks              ? KeptBlocks::kWhereAligned
                                                                   : KeptBlocks::kNo;
  // Under model.bf16_coding on with nothing quantized, every bf16 linear is coded as its layer
  // loads (an untied LM head at the end).
  const bool codes_bf16 = quant.bf16_coding == Bf16Coding::kOn && !quant.enabled() && !quant.keep_blocks;
  WeightReader r(checkpoint, options.dtype, a.conv1d_weights && !checkpoint.from_gguf(), options.own_copies,
                 kept_blocks, options.check_finite, codes_bf16);
  const ShardSpec& sh = options.shard;
  ModelWeights mw;
  const std::string& embed_name = a.name_of(TensorRole::kEmbed);
  const std::string& head_name = a.name_of(TensorRole::kLmHead);
  mw.vocab_split = sh.world > 1 && (options.plan == nullptr || options.plan->role_of(embed_name) == TpRole::kVocab);
  const Slice vocab_rows = mw.vocab_split ? rows(sh.vocab_offset, sh.vocab_rows) : Slice{};
  // Tied to the LM head, the table is read whole every step; otherwise a row per token.
  TESSERA_ASSIGN_OR_RETURN(mw.embed, c.tie_embeddings
                                         ? r.load(embed_name, {c.vocab, c.hidden}, vocab_rows)
                                         : r.sparse_table(embed_name, c.vocab, c.hidden, vocab_rows, &mw.embed_blocks));
  if (a.position == PositionKind::kLearned) {
    TESSERA_ASSIGN_OR_RETURN(mw.pos_embed, r.load_sparsely_read(a.name_of(TensorRole::kPosEmbed), {c.max_positions, c.hidden}));
  }
  if (a.embedding_norm) {
    TESSERA_RETURN_IF_ERROR(load_norm(r, c, TensorRole::kEmbedNorm, -1, &mw.embed_norm_w, &mw.embed_norm_b));
  }
  // Each layer is quantized as soon as it is loaded: a layer hook (weights moved to the spill
  // file as they load) sees its final form, and only one layer's unquantized copies (stacked
  // q|k|v and gate|up, converted dtypes) are held at a time; the LM head at the end.
  WeightQuantizer quantizer(c, checkpoint, quant, options.plan, options.int8_layout, options.dtype);
  TESSERA_RETURN_IF_ERROR(quantizer.validity());
  mw.layers.resize(c.layers);
  int64_t restored_bytes = 0;
  for (int l = 0; l < c.layers; ++l) {
    LayerWeights& lw = mw.layers[l];
    if (options.layer_restored) {
      TESSERA_ASSIGN_OR_RETURN(const bool restored, options.layer_restored(l, lw));
      if (restored) {
        TESSERA_RETURN_IF_ERROR(quantizer.restored_layer(mw, l));
        restored_bytes += distinct_bytes(layer_tensors(lw));
        continue;
      }
    }
    // A layer to be streamed from the checkpoint as stored: its matrices neither packed
    // (q|k|v, gate|up) nor copied (worker/checkpoint_backing.h).
    const bool as_stored = options.layer_as_stored && options.layer_as_stored(l);
    WeightReader::AsStored keep_mapped(&r, as_stored);
    WeightLoadOptions unpacked;
    if (as_stored) {
      unpacked = options;
      unpacked.kernel_inject = false;
    }
    const WeightLoadOptions& layer_options = as_stored ? unpacked : options;
    TESSERA_RETURN_IF_ERROR(load_norm(r, c, TensorRole::kAttnNorm, l, &lw.attn_norm_w, &lw.attn_norm_b));
    TESSERA_RETURN_IF_ERROR(load_attention(r, c, l, layer_options, &lw));
    if (lw.attn_split != mw.layers[0].attn_split) {
      // The KV cache is laid out once for all layers.
      return invalid_argument("TP plan: attention must be split in every layer or in none (layer " +
                              std::to_string(l) + " differs from layer 0)");
    }
    if (a.post_norms) {
      TESSERA_RETURN_IF_ERROR(load_norm(r, c, TensorRole::kPostAttnNorm, l, &lw.post_attn_norm_w, &lw.post_attn_norm_b));
      TESSERA_RETURN_IF_ERROR(load_norm(r, c, TensorRole::kPostMlpNorm, l, &lw.post_mlp_norm_w, &lw.post_mlp_norm_b));
    }
    if (c.mlp_norm) {
      TESSERA_RETURN_IF_ERROR(load_norm(r, c, TensorRole::kMlpNorm, l, &lw.mlp_norm_w, &lw.mlp_norm_b));
    }
    TESSERA_RETURN_IF_ERROR(load_mlp(r, c, l, layer_options, &lw));
    TESSERA_RETURN_IF_ERROR(quantizer.quantize_layer(mw, l));
    if (options.layer_loaded) TESSERA_RETURN_IF_ERROR(options.layer_loaded(l, lw));
  }
  TESSERA_RETURN_IF_ERROR(load_norm(r, c, TensorRole::kFinalNorm, -1, &mw.final_norm_w, &mw.final_norm_b));
  if (c.tie_embeddings || !r.has(head_name)) {
    if (!c.tie_embeddings) {
      return not_found("checkpoint has no tensor \"" + head_name +
                       "\" and config.json does not set tie_word_embeddings");
    }
    mw.lm_head.w = mw.embed;  // shares the buffer (and the vocabulary split)
  } else if (options.lm_head) {
    TESSERA_ASSIGN_OR_RETURN(mw.lm_head, r.lm_head(head_name, c.vocab, c.hidden, vocab_rows));
  }
  TESSERA_ASSIGN_OR_RETURN(const int64_t quantized_delta, quantizer.finish(mw));
  // The router and the shared expert's gate have no site: an adapter of them is refused
  // (worker/lora_adapter.h).
  for (LayerWeights& lw : mw.layers) {
    for_each_layer_linear(lw, [&](LinearWeights& l) {
      if (!l.w.empty() && &l != &lw.router && &l != &lw.shared_gate) l.lora_site = mw.lora_sites++;
    });
  }
  mw.total_bytes = r.total_bytes() + quantized_delta + restored_bytes;
  int64_t decode = bytes_of(mw.lm_head) + static_cast<int64_t>(mw.final_norm_w.nbytes());
  for (const LayerWeights& lw : mw.layers) decode += layer_decode_bytes(lw, c);
  mw.decode_bytes_per_token = decode;
  return mw;
}

namespace {

using Stays = std::function<bool(const Tensor&)>;

void place(Tensor& t, Backend& backend, const Stays& stays) {
  if (!t.empty() && !(stays && stays(t))) t = backend.place_weight(t);
}

void place(LinearWeights& l, Backend& backend, const Stays& stays) {
  place(l.w, backend, stays);
  place(l.b, backend, stays);
  place(l.scales, backend, stays);
}

}  // namespace

void place_model_weights(ModelWeights& w, Backend& backend, const Stays& stays) {
  const bool tied = !w.embed.empty() && w.lm_head.w.view().data == w.embed.view().data;
  for (Tensor* t : {&w.embed, &w.embed_side, &w.pos_embed, &w.embed_norm_w, &w.embed_norm_b, &w.final_norm_w,
                    &w.final_norm_b}) {
    place(*t, backend, stays);
  }
  if (tied) {
    w.lm_head.w = w.embed;  // one buffer, placed once
    w.lm_head.scales = w.embed_side;
    place(w.lm_head.b, backend, stays);
  } else {
    place(w.lm_head, backend, stays);
  }
  for (LayerWeights& lw : w.layers) for_each_layer_tensor(lw, [&](Tensor& t) { place(t, backend, stays); });
}

}  // namespace tessera
