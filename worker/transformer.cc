#include "worker/transformer.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "common/logging.h"
#include "kernels/cpu/cpu_backend.h"
#include "worker/checkpoint_backing.h"
#include "worker/model_checkpoint.h"
#include "worker/weight_cache.h"
#include "worker/weight_quantization.h"
#include "worker/weight_spill.h"

namespace tessera {
namespace {

// model.bf16_coding made definite (common/quantization.h): auto codes where the CPU backend
// decodes coded weights on its fast kernel, for bfloat16 weights that all stay resident (under
// a budget the streamed layers come from the checkpoint as stored where they can, which coded
// layers cannot); on is refused where it cannot apply rather than ignored.
StatusOr<Bf16Coding> resolve_bf16_coding(const ModelLoadOptions& options, const Backend& backend) {
  const Bf16Coding asked = options.quant.bf16_coding;
  if (asked == Bf16Coding::kOff) return Bf16Coding::kOff;
  const bool streamed = !options.residency.budget.all();
  if (asked == Bf16Coding::kOn) {
    if (options.dtype != DType::kBF16) {
      return invalid_argument(std::string("model.bf16_coding on codes bfloat16 weights, but model.dtype is ") +
                              dtype_name(options.dtype) + "; set model.dtype bfloat16 or model.bf16_coding off");
    }
    if (streamed && (backend.kind() != BackendKind::kCpu || options.residency.device_slots)) {
      return invalid_argument(
          "model.bf16_coding on: coded weights are streamed on the CPU backend only (from its spill file), not into "
          "device buffers; set model.weights_memory_budget all or model.bf16_coding off");
    }
    return Bf16Coding::kOn;
  }
  const auto* cpu = dynamic_cast<const CpuBackend*>(&backend);
  const bool fast = cpu != nullptr && cpu->codes_bf16_fast();
  return options.dtype == DType::kBF16 && fast && !streamed ? Bf16Coding::kOn : Bf16Coding::kOff;
}

}  // namespace

std::vector<float> alibi_slopes(int64_t heads) {
  // As transformers' build_alibi_tensor: slopes of the closest power of two, then every
  // other slope of the next power of two for the remaining heads.
  const int64_t closest = int64_t{1} << static_cast<int>(std::floor(std::log2(static_cast<double>(heads))));
  const double base = std::pow(2.0, -std::pow(2.0, -(std::log2(static_cast<double>(closest)) - 3)));
  std::vector<float> slopes;
  for (int64_t i = 1; i <= closest; ++i) slopes.push_back(static_cast<float>(std::pow(base, static_cast<double>(i))));
  if (closest != heads) {
    const double extra_base = std::pow(2.0, -std::pow(2.0, -(std::log2(static_cast<double>(2 * closest)) - 3)));
    const int64_t remaining = std::min(closest, heads - closest);
    for (int64_t i = 0; i < remaining; ++i) {
      slopes.push_back(static_cast<float>(std::pow(extra_base, static_cast<double>(1 + 2 * i))));
    }
  }
  return slopes;
}

StatusOr<std::unique_ptr<Transformer>> Transformer::load(const std::string& path,
                                                         const ModelLoadOptions& options, Backend& backend) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, open_model_checkpoint(path));
  TESSERA_ASSIGN_OR_RETURN(ModelConfig config,
                           parse_model_config(ckpt->config(), ckpt->config_source()));
  config.served_context = options.max_context;
  if (config.rope_scaling.kind == RopeScaling::Kind::kLongRope) {
    TESSERA_LOG_INFO("rope: LongRoPE, the {} factors (serving {} tokens, original context {}), attention factor {}",
                     rope_uses_long_factors(config) ? "long" : "short",
                     config.served_context > 0 ? config.served_context : config.max_positions,
                     config.rope_scaling.original_max_positions, config.rope_scaling.attention_factor);
  }
  if (options.dtype != DType::kF32 && options.dtype != DType::kF16 && options.dtype != DType::kBF16) {
    return invalid_argument(std::string("unsupported weight dtype ") + dtype_name(options.dtype) +
                            " (expected float32, float16 or bfloat16)");
  }
  std::unique_ptr<Communicator> owned;
  Communicator* comm = options.comm;
  if (comm == nullptr) {
    owned = make_loopback_communicator();
    comm = owned.get();
  }
  auto shard = ShardSpec::make(config, comm->rank(), comm->world_size());
  if (!shard.is_ok()) return shard.status().with_context(path);
  WeightLoadOptions wo;
  wo.dtype = options.dtype;
  wo.kernel_inject = options.kernel_inject;
  wo.shard = shard.value();
  wo.plan = options.plan;
  wo.quant = options.quant;
  TESSERA_ASSIGN_OR_RETURN(wo.quant.bf16_coding, resolve_bf16_coding(options, backend));
  wo.own_copies = backend.kind() == BackendKind::kCpu;
  wo.check_finite = options.check_weights.value_or(ckpt->total_bytes() <= kCheckWeightsAutoBytes);
  wo.lm_head = options.lm_head;
  const auto* cpu_backend = dynamic_cast<const CpuBackend*>(&backend);
  wo.int8_layout =
      cpu_backend != nullptr && cpu_backend->prefers_int8_panels() ? Int8WeightLayout::kCpuPanels : Int8WeightLayout::kRows;
  std::shared_ptr<WeightSpill> spill;
  nlohmann::json cache_identity;  // names the cache file of streamed weights (model.weights_cache_dir)
  const nlohmann::json* identity = nullptr;  // &cache_identity when there is one
  // A device streams from host memory into slots of its own (worker/staged_weights.h); the
  // CPU from a spill file (worker/weight_residency.h).
  const bool staged = !options.residency.budget.all() &&
                      (backend.kind() != BackendKind::kCpu || options.residency.device_slots);
  if (!options.residency.budget.all() && !staged) {
    // Decided layer by layer as they load, so that loading holds only what stays and one layer.
    // A share is of the weights as they will be stored (quantized ones at their own size).
    const int world = comm->world_size();
    const auto elem = static_cast<int64_t>(dtype_size(options.dtype));
    const auto stored = static_cast<int64_t>(estimated_weight_bytes(*ckpt, config, wo.quant, options.dtype));
    const int64_t head_bytes = config.vocab * config.hidden * elem / world;  // the LM head, which stays first
    if (!options.residency.cache_dir.empty()) {
      cache_identity = weight_cache_identity(*ckpt, wo, options.residency.streaming);
      identity = &cache_identity;
    }
    TESSERA_ASSIGN_OR_RETURN(spill, begin_weight_spill(options.residency, stored / world, head_bytes, identity));
    if (spill && spill->reused()) {
      // The cache file decided every layer; the streamed ones come from it, not the checkpoint.
      wo.layer_restored = [&spill](int l, LayerWeights& lw) { return spill->restore_layer(l, &lw); };
    }
    // Streamed layers mapped or read from the checkpoint where they are stored as the kernels
    // read them (worker/checkpoint_backing.h): loaded as stored, and not written to the spill
    // file.
    const bool layers_from_checkpoint =
        spill && !spill->reused() && streams_layers_from_checkpoint(options.residency, *ckpt);
    if (layers_from_checkpoint && load_layers_as_stored(*ckpt, wo)) {
      spill->layer_bytes = (stored / world - head_bytes) / std::max<int64_t>(config.layers, 1);
      wo.layer_as_stored = [&spill](int) { return spill_streams_next_layer(*spill); };
    }
    if (spill) {
      // After each layer, the checkpoint's pages read so far leave the process too (a tensor
      // still borrowing them reads them again from the page cache), or the file would end up
      // resident whole.
      const Checkpoint* backing = layers_from_checkpoint ? ckpt.get() : nullptr;
      wo.layer_loaded = [&spill, &ckpt, backing](int l, LayerWeights& lw) {
        TESSERA_RETURN_IF_ERROR(spill_loaded_layer(*spill, l, lw, backing));
        ckpt->release_all();
        return Status::ok();
      };
    }
  }
  // The weights' memory comes on 4 KiB pages, moved onto 2 MiB ones once written.
  std::optional<HugePageDeferral> deferral;
  if (options.huge_pages == WeightHugePages::kAfterStart && backend.kind() == BackendKind::kCpu) {
    deferral.emplace();
  } else if (options.huge_pages == WeightHugePages::kAfterStart) {
    TESSERA_LOG_INFO("{}: model.weights_huge_pages after_start has nothing to move: the weights go to device memory",
                     options.log_prefix);
  }
  auto weights = load_model_weights(*ckpt, config, wo);
  if (!weights.is_ok()) return weights.status().with_context(path);
  std::vector<DeferredRange> deferred;  // (the streaming buffers made below are not the weights')
  if (deferral) deferred = deferral->take();
  deferral.reset();
  std::unique_ptr<StagedWeights> staged_weights;
  if (staged) {
    if (backend.kind() != BackendKind::kCpu) TESSERA_RETURN_IF_ERROR(check_device_streaming_options(options.residency));
    // Before placing: the streamed units go to the stager's host memory, not the device.
    TESSERA_ASSIGN_OR_RETURN(staged_weights, StagedWeights::make(weights.value(), options.residency, backend));
  }
  // From here on the weights live where the backend keeps them (CUDA: device memory).
  if (staged_weights) {
    place_model_weights(weights.value(), backend,
                        [&](const Tensor& t) { return staged_weights->in_host_memory(t); });
  } else {
    place_model_weights(weights.value(), backend);
  }
  std::unique_ptr<WeightResidency> residency;
  if (!options.residency.budget.all() && !staged) {
    TESSERA_ASSIGN_OR_RETURN(residency,
                             WeightResidency::make(weights.value(), options.residency, std::move(spill), identity,
                                                   ckpt.get()));
    if (residency) ckpt->release_all();  // pages the spill read
  }
  std::unique_ptr<Transformer> t(new Transformer(std::move(config), std::move(weights).value(), ckpt->config_dir(),
                                                 options.kernel_inject, options.dtype, shard.value(), std::move(owned),
                                                 comm, backend));
  t->residency_ = std::move(residency);
  if (!deferred.empty()) t->huge_page_mover_ = std::make_unique<HugePageMover>(std::move(deferred), options.log_prefix);
  if (staged_weights) {
    staged_weights->bind(t->weights_);
    t->staged_ = std::move(staged_weights);
  }
  return t;
}

std::string Transformer::streaming_plan() const {
  if (residency_) return residency_->plan();
  return staged_ ? staged_->plan() : "";
}

Transformer::Transformer(ModelConfig config, ModelWeights weights, std::string config_dir,
                         bool kernel_inject, DType dtype, ShardSpec shard, std::unique_ptr<Communicator> owned_comm,
                         Communicator* comm, Backend& backend)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      config_dir_(std::move(config_dir)),
      kernel_inject_(kernel_inject),
      dtype_(dtype),
      shard_(shard),
      owned_comm_(std::move(owned_comm)),
      comm_(comm),
      backend_(backend) {
  const bool split = !weights_.layers.empty() && weights_.layers[0].attn_split;
  q_heads_ = split ? shard_.q_heads : config_.heads;
  kv_heads_ = split ? shard_.kv_heads : config_.kv_heads;
  gqa_.group = config_.heads / config_.kv_heads;
  gqa_.q_head_offset = split ? shard_.q_head_offset : 0;
  gqa_.kv_head_offset = split ? shard_.kv_head_offset : 0;
  if (config_.arch->position == PositionKind::kAlibi) {
    // Slopes belong to global heads: a rank's head h is global head q_head_offset + h.
    const std::vector<float> all = alibi_slopes(config_.heads);
    const int64_t first = split ? shard_.q_head_offset : 0;
    Tensor slopes = Tensor::zeros({q_heads_}, DType::kF32);
    std::copy_n(all.data() + first, q_heads_, slopes.data<float>());
    alibi_slopes_ = backend_.place_weight(slopes);
  }
  if (config_.arch->position == PositionKind::kRotary) {
    // One table per distinct set of frequencies, on the backend, computed once.
    std::vector<std::vector<float>> distinct;
    for (int l = 0; l < config_.layers; ++l) {
      const std::vector<float> f = rope_inv_freq(config_, l);
      auto it = std::find(distinct.begin(), distinct.end(), f);
      layer_rope_.push_back(static_cast<int>(it - distinct.begin()));
      layer_rope_magnitude_.push_back(rope_magnitude(config_, l));
      if (it == distinct.end()) distinct.push_back(f);
    }
    for (const std::vector<float>& f : distinct) {
      Tensor t = Tensor::zeros({static_cast<int64_t>(f.size())}, DType::kF32);
      std::copy(f.begin(), f.end(), t.data<float>());
      rope_tables_.push_back(backend_.place_weight(t));  // a parameter like any weight
    }
  }
  if (config_.embed_scale != 1.0f) {
    // Gemma: transformers multiplies by torch.tensor(sqrt(hidden), dtype=model dtype).
    uint16_t rounded = 0;
    embed_scale_ = config_.embed_scale;
    if (config_.embed_scale_in_dtype && dtype_ != DType::kF32) {
      convert_elements(&embed_scale_, DType::kF32, &rounded, dtype_, 1);
      convert_elements(&rounded, dtype_, &embed_scale_, DType::kF32, 1);
    }
  }
}

ModelConfig Transformer::cache_config() const {
  ModelConfig c = config_;
  c.heads = q_heads_;
  c.kv_heads = kv_heads_;
  return c;
}

void Transformer::all_reduce(const TensorView& partial) {
  if (comm_->world_size() == 1 || !comm_error_.is_ok()) return;
  // A failed collective means a peer is gone: the group cannot continue in lock-step. The
  // rest of this forward pass computes garbage that forward() then refuses to return.
  Status st = comm_->all_reduce_sum(partial.data, partial.numel(), partial.dtype);
  if (!st.is_ok()) comm_error_ = st;
}

void Transformer::add_and_norm(const TensorView& residual, const TensorView* delta, const Tensor& w,
                               const Tensor& b, const TensorView& out) {
  const bool rms = config_.arch->norm == NormKind::kRmsNorm;
  if (delta != nullptr && kernel_inject_) {
    backend_.residual_add_norm(residual, *delta, w, b, config_.norm_eps, rms, out);
    return;
  }
  if (delta != nullptr) backend_.add(residual, *delta, residual);
  if (rms) {
    backend_.rms_norm(residual, w, config_.norm_eps, out);
  } else {
    backend_.layer_norm(residual, w, b, config_.norm_eps, out);
  }
}

Status Transformer::forward(const std::vector<int32_t>& tokens, const AttentionBatch& batch, KvCache& cache,
                            const std::vector<int32_t>& logit_rows, const TensorView& logits,
                            const std::vector<int32_t>& hidden_rows, const TensorView* hidden,
                            const std::vector<const LoraWeights*>& seq_adapters) {
  if (!comm_error_.is_ok()) return comm_error_;
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t H = config_.hidden;
  TESSERA_CHECK_EQ(batch.query_start.back(), T);
  token_adapters_.clear();
  if (std::any_of(seq_adapters.begin(), seq_adapters.end(), [](const LoraWeights* a) { return a != nullptr; })) {
    TESSERA_CHECK_EQ(static_cast<int>(seq_adapters.size()), batch.num_seqs());
    token_adapters_.resize(static_cast<size_t>(T));
    for (int s = 0; s < batch.num_seqs(); ++s) {
      TESSERA_CHECK(seq_adapters[s] == nullptr || seq_adapters[s]->sites.size() == static_cast<size_t>(weights_.lora_sites))
          << "adapter " << seq_adapters[s]->name << " was laid out for another model";
      std::fill(token_adapters_.begin() + batch.query_start[s], token_adapters_.begin() + batch.query_start[s + 1],
                seq_adapters[s]);
    }
  }
  token_runs_ = lora_runs();

  std::vector<int32_t> positions(T);
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const int32_t begin = batch.query_start[s], end = batch.query_start[s + 1];
    for (int32_t t = begin; t < end; ++t) positions[t] = batch.context_lens[s] - (end - begin) + (t - begin);
  }

  Tensor ids = backend_.alloc({T}, DType::kI32);
  backend_.copy_from_host(tokens.data(), ids.view());
  Tensor x = backend_.alloc({T, H}, DType::kF32);       // residual stream
  Tensor h = backend_.alloc({T, H}, DType::kF32);       // normalised input of a sub-block
  Tensor delta = backend_.alloc({T, H}, DType::kF32);   // output of a sub-block
  Tensor delta2 = backend_.alloc({T, H}, DType::kF32);  // the MLP branch of a parallel block

  if (residency_) residency_->before_embedding(T);
  if (staged_) staged_->before_embedding();
  // Each rank of a vocabulary split looks up the ids in its rows (zeros elsewhere); the sum
  // over ranks is the full embedding.
  const int64_t row_offset = weights_.vocab_split ? shard_.vocab_offset : -1;
  if (!weights_.embed_side.empty()) {
    backend_.embedding_coded_bf16(ids.view(), weights_.embed.view(), weights_.embed_side.view(), x.view(), row_offset);
  } else if (weights_.embed_blocks >= 0) {
    backend_.embedding_ggml(ids.view(), weights_.embed.view(), static_cast<uint32_t>(weights_.embed_blocks), x.view(),
                            row_offset);
  } else if (weights_.vocab_split) {
    backend_.embedding(ids.view(), weights_.embed.view(), x.view(), row_offset);
  } else {
    backend_.embedding(ids.view(), weights_.embed.view(), x.view());
  }
  if (weights_.vocab_split) all_reduce(x.view());
  if (residency_) residency_->after_embedding();
  if (staged_) staged_->after_embedding();
  if (config_.arch->position == PositionKind::kLearned) {
    Tensor pos = backend_.alloc({T}, DType::kI32);
    backend_.copy_from_host(positions.data(), pos.view());
    backend_.embedding(pos.view(), weights_.pos_embed.view(), h.view());
    backend_.add(x.view(), h.view(), x.view());
  }
  if (embed_scale_ != 1.0f) backend_.scale(x.view(), embed_scale_);
  if (config_.arch->embedding_norm) {
    backend_.layer_norm(x.view(), weights_.embed_norm_w, weights_.embed_norm_b, config_.norm_eps, x.view());
  }
  const TensorView* pending = nullptr;  // the previous layer's output, not yet added
  for (int l = 0; l < config_.layers; ++l) {
    if (residency_) residency_->before_layer(l);
    if (staged_) staged_->before_layer(l);
    layer_forward(l, x.view(), pending, h.view(), delta.view(), delta2.view(), positions, batch, cache);
    if (residency_) residency_->after_layer(l);
    if (staged_) staged_->after_layer(l);
    pending = &delta.view();
  }

  // Only the rows whose logits or hidden states are wanted go through the final norm.
  const int64_t R = static_cast<int64_t>(logit_rows.size());
  // No logits wanted (a prefill chunk, a draft model catching up): no norm, no LM head, and
  // no all-gather — every rank of the group gets the same plan, so all skip it alike.
  if (R == 0 && hidden_rows.empty()) return comm_error_;
  if (pending != nullptr) backend_.add(x.view(), *pending, x.view());
  if (!hidden_rows.empty()) {
    TESSERA_CHECK(hidden != nullptr);
    Tensor picked = backend_.alloc({static_cast<int64_t>(hidden_rows.size()), H}, DType::kF32);
    backend_.gather_rows(x.view(), hidden_rows, picked.view());
    add_and_norm(picked.view(), nullptr, weights_.final_norm_w, weights_.final_norm_b, *hidden);
  }
  if (R == 0) return comm_error_;
  if (weights_.lm_head.w.empty())
    return invalid_argument("logits asked of a model loaded without its LM head (server.task embed)");
  Tensor picked = backend_.alloc({R, H}, DType::kF32);
  Tensor normed = backend_.alloc({R, H}, DType::kF32);
  backend_.gather_rows(x.view(), logit_rows, picked.view());
  add_and_norm(picked.view(), nullptr, weights_.final_norm_w, weights_.final_norm_b, normed.view());
  if (residency_) residency_->before_lm_head();
  if (staged_) staged_->before_lm_head();
  lm_head(normed.view(), logits);
  if (residency_) residency_->after_lm_head();
  if (staged_) staged_->after_lm_head();
  if (config_.logit_scale != 1.0f) backend_.scale(logits, 1.0f / config_.logit_scale);
  if (config_.final_softcap > 0) backend_.softcap(logits, config_.final_softcap);
  return comm_error_;
}

void Transformer::layer_forward(int l, const TensorView& x, const TensorView* pending, const TensorView& h,
                                const TensorView& delta, const TensorView& delta2,
                                const std::vector<int32_t>& positions, const AttentionBatch& batch, KvCache& cache) {
  const LayerWeights& lw = weights_.layers[l];
  add_and_norm(x, pending, lw.attn_norm_w, lw.attn_norm_b, h);
  if (config_.block == BlockKind::kParallel) {
    // x + attn(norm1(x)) + mlp(norm2(x)): both branches read the same residual, so with
    // both split one all-reduce of their sum replaces two.
    const bool attn_partial = attention_block(l, h, positions, batch, cache, delta, /*defer_reduce=*/true);
    if (!lw.mlp_norm_w.empty()) add_and_norm(x, nullptr, lw.mlp_norm_w, lw.mlp_norm_b, h);
    const bool mlp_partial = mlp_block(l, h, delta2, /*defer_reduce=*/true);
    if (attn_partial && mlp_partial) {
      backend_.add(delta, delta2, delta);
      all_reduce(delta);
    } else {
      if (attn_partial) all_reduce(delta);
      if (mlp_partial) all_reduce(delta2);
      backend_.add(delta, delta2, delta);
    }
    scale_residual(delta);
    return;
  }
  attention_block(l, h, positions, batch, cache, delta, /*defer_reduce=*/false);
  if (!lw.post_attn_norm_w.empty()) add_and_norm(delta, nullptr, lw.post_attn_norm_w, lw.post_attn_norm_b, delta);
  scale_residual(delta);
  add_and_norm(x, &delta, lw.mlp_norm_w, lw.mlp_norm_b, h);
  mlp_block(l, h, delta, /*defer_reduce=*/false);
  if (!lw.post_mlp_norm_w.empty()) add_and_norm(delta, nullptr, lw.post_mlp_norm_w, lw.post_mlp_norm_b, delta);
  scale_residual(delta);
}

void Transformer::scale_residual(const TensorView& delta) {
  if (config_.residual_scale != 1.0f) backend_.scale(delta, config_.residual_scale);
}

Transformer::LoraRuns Transformer::lora_runs(const std::vector<int32_t>* rows) const {
  LoraRuns runs;
  if (token_adapters_.empty()) return runs;
  const int64_t n = rows != nullptr ? static_cast<int64_t>(rows->size()) : static_cast<int64_t>(token_adapters_.size());
  for (int64_t i = 0; i < n; ++i) {
    const LoraWeights* a = token_adapters_[static_cast<size_t>(rows != nullptr ? (*rows)[static_cast<size_t>(i)] : i)];
    if (a == nullptr) continue;
    if (!runs.empty() && runs.back().adapter == a && runs.back().end == i) {
      ++runs.back().end;
    } else {
      runs.push_back({i, i + 1, a});
    }
  }
  return runs;
}

void Transformer::add_lora(const LinearWeights& w, const TensorView& x, const TensorView& out, const LoraRuns& lora) {
  // One lora_add for the whole projection: the parts of a packed one (q_proj's, k_proj's, ...)
  // are segments of their own column ranges.
  std::vector<LoraSegment> segments;
  for (const LoraRun& run : lora)
    for (const LoraPart& p : run.adapter->sites[static_cast<size_t>(w.lora_site)])
      segments.push_back({run.begin, run.end, p.shrink.view(), p.expand.view(), run.adapter->scale, p.offset});
  if (!segments.empty()) backend_.lora_add(x, segments, out);
}

void Transformer::project(const LinearWeights& w, const TensorView& x, const TensorView& out, Activation act,
                          const LoraRuns& lora) {
  const bool adapted = !lora.empty() && w.lora_site >= 0;
  if (adapted && act != Activation::kNone) {
    // The update joins the linear's output before the activation.
    project(w, x, out, Activation::kNone, lora);
    backend_.activate(out, act);
    return;
  }
  if (w.w.dtype() == DType::kI8) {
    backend_.linear_int8(x, w.w, w.scales, w.b, out, act);
  } else if (is_coded_bf16(w.w.view(), w.scales.view())) {
    backend_.linear_coded_bf16(x, w.w, w.scales, w.b, out, act);
  } else if (w.w.dtype() == DType::kU8) {
    backend_.linear_int4(x, w.w, w.scales, w.b, out, act);
  } else if (act == Activation::kNone) {
    backend_.linear(x, w.w, w.b, out);
  } else {
    backend_.linear_act(x, w.w, w.b, out, act);
  }
  if (adapted) add_lora(w, x, out, lora);
}

void Transformer::lm_head(const TensorView& normed, const TensorView& logits) {
  if (!weights_.vocab_split) {
    project(weights_.lm_head, normed, logits);
    return;
  }
  // Each rank computes its vocabulary columns, padded to the common chunk width so the
  // all-gather moves equal parts; the pieces are assembled into [rows, vocab].
  const int64_t R = normed.dim(0), chunk = shard_.vocab, world = comm_->world_size(), V = config_.vocab;
  Tensor part = backend_.alloc({R, shard_.vocab_rows}, DType::kF32);
  project(weights_.lm_head, normed, part.view());
  std::vector<float> mine(R * chunk, 0.0f);
  for (int64_t r = 0; r < R; ++r) {
    backend_.copy_to_host(part.view().rows(r, 1), mine.data() + r * chunk);
  }
  std::vector<float> g(world * R * chunk), out(R * V);
  if (!comm_error_.is_ok()) return;
  // The collective moves backend memory (device memory for NCCL ranks); the padded rows are
  // assembled on the host, which this small [rows, vocab] result can afford.
  Tensor send = backend_.alloc({R, chunk}, DType::kF32);
  Tensor gathered = backend_.alloc({world * R, chunk}, DType::kF32);
  backend_.copy_from_host(mine.data(), send.view());
  Status st = comm_->all_gather(send.view().data, gathered.view().data, R * chunk, DType::kF32);
  if (!st.is_ok()) {
    comm_error_ = st;
    return;
  }
  backend_.copy_to_host(gathered.view(), g.data());
  for (int64_t w = 0; w < world; ++w) {
    const int64_t cols = std::min(chunk, V - w * chunk);
    for (int64_t r = 0; r < R; ++r) {
      std::copy_n(g.data() + (w * R + r) * chunk, cols, out.data() + r * V + w * chunk);
    }
  }
  backend_.copy_from_host(out.data(), logits);
}

bool Transformer::attention_block(int layer, const TensorView& h, const std::vector<int32_t>& positions,
                                  const AttentionBatch& batch, KvCache& cache, const TensorView& delta,
                                  bool defer_reduce) {
  const LayerWeights& lw = weights_.layers[layer];
  const LayerSpec& spec = config_.layer[layer];
  const int64_t T = h.dim(0);
  const int64_t D = config_.head_dim;
  const int64_t q_width = q_heads_ * D;
  const int64_t kv_width = kv_heads_ * D;

  // q, k, v as [T, heads, D] views: three column slices of one packed buffer (rows strided)
  // on the fused path, three separate buffers on the plain path (and in a fused model's
  // layer whose q, k and v are stored in different formats: worker/model_weights.cc).
  Tensor qkv_buf, q_buf, k_buf, v_buf;
  TensorView q2, k2, v2;  // [T, heads * D]
  if (kernel_inject_ && !lw.qkv.w.empty()) {
    qkv_buf = backend_.alloc({T, q_width + 2 * kv_width}, DType::kF32);
    project(lw.qkv, h, qkv_buf.view(), Activation::kNone, token_runs_);
    q2 = qkv_buf.view().columns(0, q_width);
    k2 = qkv_buf.view().columns(q_width, kv_width);
    v2 = qkv_buf.view().columns(q_width + kv_width, kv_width);
  } else {
    q_buf = backend_.alloc({T, q_width}, DType::kF32);
    k_buf = backend_.alloc({T, kv_width}, DType::kF32);
    v_buf = backend_.alloc({T, kv_width}, DType::kF32);
    project(lw.q, h, q_buf.view(), Activation::kNone, token_runs_);
    project(lw.k, h, k_buf.view(), Activation::kNone, token_runs_);
    project(lw.v, h, v_buf.view(), Activation::kNone, token_runs_);
    q2 = q_buf.view();
    k2 = k_buf.view();
    v2 = v_buf.view();
  }
  const TensorView q = q2.reshape({T, q_heads_, D});
  const TensorView k = k2.reshape({T, kv_heads_, D});
  const TensorView v = v2.reshape({T, kv_heads_, D});
  if (!lw.q_norm.empty()) {
    backend_.head_rms_norm(q, lw.q_norm, config_.norm_eps);
    backend_.head_rms_norm(k, lw.k_norm, config_.norm_eps);
  }
  if (config_.arch->position == PositionKind::kRotary && spec.rope) {
    const TensorView freq = rope_tables_[layer_rope_[layer]].view();
    const TensorView pos(const_cast<int32_t*>(positions.data()), DType::kI32, {T});  // host memory
    backend_.rotary(q, pos, freq, layer_rope_magnitude_[layer]);
    backend_.rotary(k, pos, freq, layer_rope_magnitude_[layer]);
  }
  backend_.write_kv(k, v, batch, cache.k(layer), cache.v(layer));
  Tensor attn = backend_.alloc({T, q_width}, DType::kF32);
  AttentionParams params;
  params.scale = spec.attn_scale;
  params.softcap = config_.attn_softcap;
  params.window = spec.window;
  params.alibi_slopes = alibi_slopes_.view();
  backend_.attention(q, batch, cache.k(layer), cache.v(layer), params, attn.view(), gqa_);
  project(lw.o, attn.view(), delta, Activation::kNone, token_runs_);
  if (!lw.attn_split) return false;
  if (defer_reduce) return true;
  all_reduce(delta);
  return false;
}

void Transformer::mlp(const MlpWeights& w, const TensorView& h, const TensorView& out, const LoraRuns& lora) {
  // This rank's intermediate width: its slice, or all of it when the group is kept whole.
  const int64_t T = h.dim(0), F = linear_in_features(w.down);
  const Activation act = config_.activation;
  Tensor hidden = backend_.alloc({T, F}, DType::kF32);
  const bool gated = !w.gate_up.w.empty() || !w.gate.w.empty();
  if (!gated) {
    if (kernel_inject_) {
      project(w.up, h, hidden.view(), act, lora);
    } else {
      project(w.up, h, hidden.view(), Activation::kNone, lora);
      backend_.activate(hidden.view(), act);
    }
  } else if (kernel_inject_ && !w.gate_up.w.empty()) {
    // (A layer loaded as stored keeps gate and up apart on the fused path too.)
    Tensor gu = backend_.alloc({T, 2 * F}, DType::kF32);
    project(w.gate_up, h, gu.view(), Activation::kNone, lora);
    backend_.gated_act_packed(gu.view(), hidden.view(), act);
  } else {
    Tensor g = backend_.alloc({T, F}, DType::kF32);
    Tensor u = backend_.alloc({T, F}, DType::kF32);
    project(w.gate, h, g.view(), Activation::kNone, lora);
    project(w.up, h, u.view(), Activation::kNone, lora);
    backend_.gated_act(g.view(), u.view(), hidden.view(), act);
  }
  project(w.down, hidden.view(), out, Activation::kNone, lora);
}

bool Transformer::mlp_block(int layer, const TensorView& h, const TensorView& delta, bool defer_reduce) {
  const LayerWeights& lw = weights_.layers[layer];
  if (lw.moe()) {
    moe_block(lw, h, delta);
    return false;
  }
  mlp(lw.mlp, h, delta, token_runs_);
  if (!lw.mlp_split) return false;
  if (defer_reduce) return true;
  all_reduce(delta);
  return false;
}

void Transformer::moe_block(const LayerWeights& lw, const TensorView& h, const TensorView& delta) {
  const int64_t T = h.dim(0), E = config_.num_experts;
  const int top_k = static_cast<int>(config_.top_k);
  Tensor router_logits = backend_.alloc({T, E}, DType::kF32);
  project(lw.router, h, router_logits.view());
  Tensor weights = backend_.alloc({T, top_k}, DType::kF32);
  Tensor ids = backend_.alloc({T, top_k}, DType::kI32);
  backend_.moe_topk(router_logits.view(), top_k, config_.moe_normalize, weights.view(), ids.view());

  // Group token rows by expert (host side: routing decisions are tiny), then run each
  // expert once over all of its tokens.
  std::vector<float> w_host(T * top_k);
  std::vector<int32_t> id_host(T * top_k);
  backend_.copy_to_host(weights.view(), w_host.data());
  backend_.copy_to_host(ids.view(), id_host.data());
  std::vector<std::vector<int32_t>> rows(E);
  std::vector<std::vector<float>> scales(E);
  for (int64_t t = 0; t < T; ++t) {
    for (int k = 0; k < top_k; ++k) {
      rows[id_host[t * top_k + k]].push_back(static_cast<int32_t>(t));
      scales[id_host[t * top_k + k]].push_back(w_host[t * top_k + k]);
    }
  }
  // Split experts produce partial sums (all-reduced once, at the end). Experts the plan
  // keeps whole produce full outputs on every rank: with split ones beside them they go to
  // a second buffer added after the reduction, otherwise straight into delta.
  bool any_split = false;
  for (bool b : lw.expert_split) any_split |= b;
  if (!lw.shared.down.w.empty()) any_split |= lw.shared_split;
  std::vector<float> zeros(delta.numel(), 0.0f);
  backend_.copy_from_host(zeros.data(), delta);
  Tensor whole;
  auto target = [&](bool split) -> TensorView {
    if (split || !any_split) return delta;
    if (whole.empty()) whole = backend_.alloc(delta.dims(), DType::kF32);
    return whole.view();
  };
  for (int64_t e = 0; e < E; ++e) {
    if (rows[e].empty()) continue;
    const int64_t n = static_cast<int64_t>(rows[e].size());
    Tensor xin = backend_.alloc({n, config_.hidden}, DType::kF32);
    Tensor xout = backend_.alloc({n, config_.hidden}, DType::kF32);
    backend_.gather_rows(h, rows[e], xin.view());
    mlp(lw.experts[e], xin.view(), xout.view(), lora_runs(&rows[e]));
    backend_.scatter_add_scaled(xout.view(), rows[e], scales[e], target(lw.expert_split[e]));
  }
  if (!lw.shared.down.w.empty()) {
    // Qwen2-MoE: + sigmoid(shared_expert_gate(x)) * shared_expert(x), per token. The gate
    // is whole on every rank, so scaling a partial sum scales the total.
    Tensor out = backend_.alloc({T, config_.hidden}, DType::kF32);
    mlp(lw.shared, h, out.view(), token_runs_);
    Tensor gate = backend_.alloc({T, 1}, DType::kF32);
    project(lw.shared_gate, h, gate.view());
    std::vector<float> g(T);
    backend_.copy_to_host(gate.view(), g.data());
    std::vector<int32_t> all(T);
    for (int64_t t = 0; t < T; ++t) {
      all[t] = static_cast<int32_t>(t);
      g[t] = 1.0f / (1.0f + std::exp(-g[t]));
    }
    backend_.scatter_add_scaled(out.view(), all, g, target(lw.shared_split));
  }
  if (any_split) all_reduce(delta);
  if (!whole.empty()) backend_.add(delta, whole.view(), delta);
}

}  // namespace tessera
