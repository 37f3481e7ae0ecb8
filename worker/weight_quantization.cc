#include "worker/weight_quantization.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "common/dtype.h"
#include "common/gguf/ggml_dequant_blocks.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_tensor_rows.h"
#include "common/logging.h"
#include "common/gguf/ggml_block_element.h"
#include "common/tensor_arena.h"
#include "common/tokenizer/regex.h"
#include "kernels/coded_bf16.h"
#include "kernels/cpu/linear_int4.h"
#include "kernels/cpu/linear_int8.h"
#include "kernels/cpu/linear_int8_panels.h"
#include "worker/arch_spec.h"

namespace tessera {
namespace {

// Tensor-name endings of quantized checkpoint formats: GPTQ / AWQ (qweight, qzeros, scales,
// g_idx), bitsandbytes (SCB, weight_format, quant_state), compressed-tensors
// (weight_packed, weight_scale, weight_zero_point).
constexpr const char* kQuantizedSuffixes[] = {".qweight", ".qzeros", ".scales", ".g_idx", ".SCB", ".weight_format",
                                              ".weight_packed", ".weight_scale", ".weight_zero_point", ".absmax",
                                              ".quant_map", ".quant_state"};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// What a linear weight becomes by default (q resolved), rules aside. Under auto on a GGUF file
// (as_stored) the file's own choice: a matrix stored in quantized blocks is computed from them,
// one stored in floats (llama-quantize's fallback for a shape its type cannot block, or a
// --tensor-type override) stays in the compute dtype. Elsewhere the column- and row-parallel
// matrices take the kind, and an untied LM head is int8 under int4 (its rounding moves every
// logit, so it keeps 8 bits, as llama.cpp's 4-bit files keep their output matrix in 6; in
// bf16 it is ~20% of a 4-bit ~1.1B step's bytes) and in the compute dtype under int8 (int8's
// error stays in the layers).
WeightQuantization default_kind(const QuantizationOptions& q, bool lm_head, bool stored_in_blocks) {
  if (q.as_stored) return stored_in_blocks ? q.kind : WeightQuantization::kNone;
  if (!lm_head) return q.kind;
  return q.kind == WeightQuantization::kInt4 ? WeightQuantization::kInt8 : WeightQuantization::kNone;
}

}  // namespace

// (Named: WeightQuantizer, declared in the header, holds a selector.)
namespace quantization_internal {

// One linear weight of the loaded shard and the checkpoint tensors its rows came from.
struct QuantCandidate {
  LinearWeights* weights;
  std::vector<std::string> sources;
  TpRole structural_role;  // what the built-in policy gives it (used when there is no plan)
};

class QuantSelector {
 public:
  QuantSelector(const ModelConfig& c, const Checkpoint& ckpt, const QuantizationOptions& q, const TpPlan* plan)
      : c_(c), ckpt_(ckpt), q_(q), plan_(plan), rule_used_(q.rules.size(), false) {}

  // The first alternative of an "a|b" pattern the checkpoint has.
  std::string resolve(TensorRole role, int layer, int expert = -1) const {
    const std::string& pattern = c_.arch->name_of(role);
    if (pattern.empty()) return {};
    const std::vector<std::string> alts = name_alternatives(tensor_name(pattern, layer, expert));
    for (const std::string& n : alts) {
      if (ckpt_.find(n) != nullptr) return n;
    }
    return alts[0];
  }

  TpRole role(const std::string& name, TpRole structural) const {
    return plan_ != nullptr ? plan_->role_of(name) : structural;
  }

  // The first rule whose regex is found in `name`; -1 when none.
  int rule_for(const std::string& name) {
    for (size_t i = 0; i < q_.rules.size(); ++i) {
      const auto& re = q_.rules[i].regex;
      if (re != nullptr && re->search(name)) {
        rule_used_[i] = true;
        return static_cast<int>(i);
      }
    }
    return -1;
  }

  std::string rule_text(int i) const {
    return "model.quantization_rules[" + std::to_string(i) + "] (match '" + q_.rules[static_cast<size_t>(i)].match +
           "')";
  }

  // What `cand` becomes (none, int8 or int4); an error when a rule asks for quantization
  // where it cannot be.
  StatusOr<WeightQuantization> kind_for(const QuantCandidate& cand) {
    std::optional<WeightQuantization> decided;
    std::string first;
    bool ruled = false;
    for (const std::string& name : cand.sources) {
      const TpRole r = role(name, cand.structural_role);
      const int rule = rule_for(name);
      WeightQuantization kind = WeightQuantization::kNone;
      if (r == TpRole::kColumn || r == TpRole::kRow || r == TpRole::kVocab) {
        const TensorInfo* info = ckpt_.find(name);
        kind = default_kind(q_, r == TpRole::kVocab, info != nullptr && stored_in_ggml_blocks(*info));
      }
      if (rule >= 0) kind = q_.rules[static_cast<size_t>(rule)].quantize;
      ruled |= rule >= 0;
      if (kind != WeightQuantization::kNone && r == TpRole::kKeep) {
        return invalid_argument(rule_text(rule) + ": \"" + name + "\" is kept whole by the TP plan (role keep); " +
                                weight_quantization_name(kind) +
                                " applies only to column- and row-parallel linears and the LM head");
      }
      // A GGUF file's gate in blocks packed with an up it stores in floats (a llama-quantize
      // --tensor-type override): the loader decoded the packed matrix, so it stays decoded.
      if (decided && *decided != kind && q_.as_stored && !ruled) return WeightQuantization::kNone;
      if (decided && *decided != kind) {
        return invalid_argument("model.quantization_rules: \"" + first + "\" and \"" + name +
                                "\" are packed into one matrix (kernel_inject) and must be quantized alike");
      }
      decided = kind;
      if (first.empty()) first = name;
    }
    return decided.value_or(WeightQuantization::kNone);
  }

  // Rules quantizing the embedding (a lookup table), and rules that matched nothing.
  Status check_rules(const std::string& embed_name, bool tied) {
    const int rule = rule_for(embed_name);
    if (rule >= 0 && q_.rules[static_cast<size_t>(rule)].quantize != WeightQuantization::kNone) {
      return invalid_argument(rule_text(rule) + ": \"" + embed_name + "\" is the embedding, a lookup table" +
                              (tied ? " that the LM head shares (tie_word_embeddings)" : "") +
                              "; it stays in the compute dtype");
    }
    for (size_t i = 0; i < rule_used_.size(); ++i) {
      if (!rule_used_[i]) return invalid_argument(rule_text(static_cast<int>(i)) + " matches no linear weight of this model");
    }
    return Status::ok();
  }

 private:
  const ModelConfig& c_;
  const Checkpoint& ckpt_;
  const QuantizationOptions& q_;
  const TpPlan* plan_;
  std::vector<bool> rule_used_;
};

}  // namespace quantization_internal

namespace {

using quantization_internal::QuantCandidate;
using quantization_internal::QuantSelector;

// The linear weights of layers [begin, end).
std::vector<QuantCandidate> candidates(ModelWeights& mw, const ModelConfig& c, QuantSelector& s, int begin, int end) {
  std::vector<QuantCandidate> out;
  auto add = [&](LinearWeights& l, std::vector<std::string> sources, TpRole structural) {
    if (!l.w.empty()) out.push_back({&l, std::move(sources), structural});
  };
  const bool fused_qkv = !c.arch->name_of(TensorRole::kQkv).empty() && c.qkv != QkvLayout::kSeparate;
  for (int layer = begin; layer < end; ++layer) {
    LayerWeights& lw = mw.layers[static_cast<size_t>(layer)];
    const std::string qkv = fused_qkv ? s.resolve(TensorRole::kQkv, layer) : std::string();
    auto attn_name = [&](TensorRole r) { return fused_qkv ? qkv : s.resolve(r, layer); };
    std::vector<std::string> all_qkv = fused_qkv ? std::vector<std::string>{qkv}
                                                 : std::vector<std::string>{attn_name(TensorRole::kQ),
                                                                            attn_name(TensorRole::kK),
                                                                            attn_name(TensorRole::kV)};
    add(lw.qkv, all_qkv, TpRole::kColumn);
    add(lw.q, {attn_name(TensorRole::kQ)}, TpRole::kColumn);
    add(lw.k, {attn_name(TensorRole::kK)}, TpRole::kColumn);
    add(lw.v, {attn_name(TensorRole::kV)}, TpRole::kColumn);
    add(lw.o, {s.resolve(TensorRole::kO, layer)}, TpRole::kRow);
    auto add_mlp = [&](MlpWeights& m, TensorRole gate, TensorRole up, TensorRole gate_up, TensorRole down, int e) {
      const std::string g = s.resolve(gate, layer, e), u = s.resolve(up, layer, e);
      const std::string gu = gate_up == TensorRole::kCount ? std::string() : s.resolve(gate_up, layer, e);
      // Phi-3 stores gate|up as one tensor (the row has a gate_up name); the others two.
      const bool has_gate_up = !gu.empty();
      add(m.gate_up, has_gate_up ? std::vector<std::string>{gu} : std::vector<std::string>{g, u}, TpRole::kColumn);
      add(m.gate, {has_gate_up ? gu : g}, TpRole::kColumn);
      add(m.up, {has_gate_up ? gu : u}, TpRole::kColumn);
      add(m.down, {s.resolve(down, layer, e)}, TpRole::kRow);
    };
    add_mlp(lw.mlp, TensorRole::kGate, TensorRole::kUp, TensorRole::kGateUp, TensorRole::kDown, -1);
    for (size_t e = 0; e < lw.experts.size(); ++e) {
      add_mlp(lw.experts[e], TensorRole::kExpertGate, TensorRole::kExpertUp, TensorRole::kCount, TensorRole::kExpertDown,
              static_cast<int>(e));
    }
    add_mlp(lw.shared, TensorRole::kSharedGate, TensorRole::kSharedUp, TensorRole::kCount, TensorRole::kSharedDown, -1);
    add(lw.router, {s.resolve(TensorRole::kRouter, layer)}, TpRole::kKeep);
    add(lw.shared_gate, {s.resolve(TensorRole::kSharedExpertGate, layer)}, TpRole::kKeep);
  }
  return out;
}

std::string divisors_hint(int64_t k) {
  std::string hint;
  for (int g = kMinQuantGroup; g <= kMaxQuantGroup; g += 32) {
    if (k % g == 0) hint += (hint.empty() ? "" : ", ") + std::to_string(g);
  }
  return hint.empty() ? "no group size in 32..256 divides it; leave this tensor in the compute dtype with a "
                        "model.quantization_rules entry"
                      : "groups that divide it: " + hint;
}

int64_t bytes(const Tensor& t) { return t.empty() ? 0 : static_cast<int64_t>(t.nbytes()); }

}  // namespace

Status check_not_prequantized(const Checkpoint& checkpoint) {
  const nlohmann::json& cfg = checkpoint.config();
  if (cfg.is_object() && cfg.contains("quantization_config")) {
    const nlohmann::json& qc = cfg["quantization_config"];
    std::string method = "unnamed";
    if (qc.is_object() && qc.contains("quant_method") && qc["quant_method"].is_string())
      method = qc["quant_method"].get<std::string>();
    return unimplemented(checkpoint.config_dir() + "/config.json: the checkpoint is already quantized "
                         "(quantization_config, quant_method " + method + "); Tessera reads f32/f16/bf16 checkpoints "
                         "and quantizes them itself (model.quantization: int8)");
  }
  for (const std::string& name : checkpoint.tensor_names()) {
    for (const char* suffix : kQuantizedSuffixes) {
      if (ends_with(name, suffix)) {
        return unimplemented(checkpoint.path() + ": tensor \"" + name + "\" belongs to a quantized checkpoint format "
                             "(GPTQ/AWQ/bitsandbytes), which Tessera does not compute; give it the f32/f16/bf16 "
                             "checkpoint and set model.quantization: int8");
      }
    }
  }
  return Status::ok();
}

std::optional<Int4Scheme> panel_scheme_of_blocks(GgmlType type, bool auto_kind) {
  switch (type) {
    case GgmlType::kQ4_0:
      return Int4Scheme::kSymmetric;
    case GgmlType::kQ4_1:
      return Int4Scheme::kAsymmetric;
    case GgmlType::kQ4_K:
      return Int4Scheme::kSuperBlock;
    default:
      break;
  }
  if (!auto_kind) return std::nullopt;  // `int4` asks for 4 bits
  switch (type) {
    case GgmlType::kQ5_0:
      return Int4Scheme::kSymmetric5;
    case GgmlType::kQ5_1:
      return Int4Scheme::kAsymmetric5;
    case GgmlType::kQ5_K:
      return Int4Scheme::kSuperBlock5;
    case GgmlType::kQ6_K:
      return Int4Scheme::kSixBit;
    default:
      return std::nullopt;
  }
}

bool kept_as_blocks(GgmlType type, bool auto_kind) {
  return panel_scheme_of_blocks(type, auto_kind).has_value() || (auto_kind && type == GgmlType::kQ8_0);
}

double panel_bytes_per_weight(Int4Scheme scheme) {
  const double scale_bytes = static_cast<double>(int4_record_stride(scheme, kInt4SuperBlock)) /
                             static_cast<double>(kInt4PanelColumns * kInt4SuperBlock);
  return static_cast<double>(int4_step_bytes(scheme)) / (4.0 * kInt4PanelColumns) + scale_bytes;
}

QuantizationOptions resolve_quantization(const QuantizationOptions& options, const Checkpoint& checkpoint) {
  if (options.kind != WeightQuantization::kAuto) return options;
  QuantizationOptions q = options;
  q.kind = WeightQuantization::kNone;
  std::set<std::string> block_types;
  for (const std::string& name : checkpoint.tensor_names()) {
    const TensorInfo* info = checkpoint.find(name);
    if (!stored_in_ggml_blocks(*info) || info->shape.size() != 2) continue;
    block_types.insert(info->stored_dtype);
    const auto type = static_cast<GgmlType>(info->ggml_type);
    q.keep_blocks |= kept_as_blocks(type, /*auto_kind=*/true);
  }
  if (block_types.empty()) return q;
  q.kind = WeightQuantization::kInt8;
  q.as_stored = true;
  // int8 weights made from blocks of 32 (q8_0, q5_0 ...) or of 16 (q6_K's sub-blocks) keep
  // a scale per 32 inputs: 128 would fold four of the file's scales into one.
  if (q.group == kAutoQuantGroup) q.group = kInt4Group;
  std::string types;
  for (const std::string& t : block_types) types += (types.empty() ? "" : ", ") + t;
  TESSERA_LOG_INFO("model.quantization auto: {} stores its matrices as {} blocks, each computed from as stored "
                   "(q4_*, q5_* and q6_K in panels of their bits, q8_0 as int8 with its own scales; a matrix whose "
                   "tensor-parallel slice cuts its blocks as int8, or in model.dtype where no group of 32 fits the slice; "
                   "those it stores in floats in model.dtype); "
                   "model.quantization: none decodes them all to model.dtype instead",
                   checkpoint.path(), types);
  return q;
}

namespace {

// A matrix of ggml blocks (LinearWeights::ggml_blocks) decoded to `dtype`, in place.
Status decode_blocks(LinearWeights& l, DType dtype) {
  TESSERA_ASSIGN_OR_RETURN(l.w, decode_ggml_block_rows(l.w, l.ggml_blocks, dtype));
  l.ggml_blocks = -1;
  return Status::ok();
}

// l as panels (kernels/int4_layout.h): ggml blocks value for value, anything else as 4-bit
// by q4_0's rule from its floats. `names` for the error of an input width that
// is not a multiple of 32. Returns the panels' scheme.
StatusOr<Int4Scheme> make_int4(LinearWeights& l, TensorArena& arena, const std::string& names) {
  const int64_t N = l.w.dim(0);
  const bool blocks = l.ggml_blocks >= 0;
  const Int4Scheme scheme = blocks ? panel_scheme_of_blocks(static_cast<GgmlType>(l.ggml_blocks), true).value()
                                   : Int4Scheme::kSymmetric;
  int64_t K = l.w.dim(1);
  if (blocks) {
    const GgmlTypeTraits* traits = ggml_type_traits(static_cast<uint32_t>(l.ggml_blocks));
    K = l.w.dim(1) / traits->block_bytes * traits->block_elems;
  } else if (K % kInt4Group != 0) {
    return invalid_argument("model.quantization int4: the input dimension " + std::to_string(K) + " of " + names +
                            " (this rank's matrix is [" + std::to_string(N) + ", " + std::to_string(K) +
                            "]) is not a multiple of 32, the 4-bit group; leave it in the compute dtype or int8 with "
                            "a model.quantization_rules entry");
  }
  const int64_t P = int4_panel_count(N);
  Tensor nibbles = arena.zeros({P, K / 4, int4_step_bytes(scheme)}, DType::kU8);
  Tensor scales =
      arena.zeros({P, K / int4_k_multiple(scheme), int4_record_elements(scheme)}, int4_scales_dtype(scheme));
  if (blocks) {
    cpu::pack_int4_from_blocks(scheme, l.w.data<uint8_t>(), l.w.dim(1), N, K, nibbles.data<uint8_t>(),
                               static_cast<uint8_t*>(scales.view().data));
  } else {
    std::vector<float> w(static_cast<size_t>(N * K));
    convert_elements(l.w.view().data, l.w.dtype(), w.data(), DType::kF32, w.size());
    cpu::quantize_int4(w.data(), N, K, nibbles.data<uint8_t>(), scales.data<uint8_t>());
  }
  l.w = std::move(nibbles);
  l.scales = std::move(scales);
  l.ggml_blocks = -1;
  return scheme;
}

// Row-major int8 weights and their scales ([N, K], [N, K / group]) stored in l in `layout`.
void store_int8(LinearWeights& l, TensorArena& arena, const std::vector<int8_t>& rows,
                const std::vector<float>& row_scales, int64_t N, int64_t K, int64_t group, Int8WeightLayout layout) {
  if (layout == Int8WeightLayout::kCpuPanels) {
    const int64_t panels = cpu::int8_panel_count(N);
    l.w = arena.zeros({panels, K / 2, 2 * cpu::kInt8PanelColumns}, DType::kI8);
    l.scales = arena.zeros({panels, K / group, cpu::kInt8PanelColumns}, DType::kF32);
    cpu::pack_int8_panels(rows.data(), row_scales.data(), N, K, group, l.w.data<int8_t>(), l.scales.data<float>());
  } else {
    l.w = arena.zeros({N, K}, DType::kI8);
    l.scales = arena.zeros({N, K / group}, DType::kF32);
    std::memcpy(l.w.data<int8_t>(), rows.data(), rows.size());
    std::memcpy(l.scales.data<float>(), row_scales.data(), row_scales.size() * sizeof(float));
  }
}

// l as int8 in `layout` with groups of `group` (checked by the caller). Quantized row-major
// into a scratch copy first: only one matrix's rows are ever held twice.
void make_int8(LinearWeights& l, TensorArena& arena, int64_t group, Int8WeightLayout layout) {
  const int64_t N = l.w.dim(0), K = l.w.dim(1);
  std::vector<int8_t> rows(static_cast<size_t>(N * K));
  std::vector<float> row_scales(static_cast<size_t>(N * (K / group)));
  cpu::quantize_int8(l.w.view().data, l.w.dtype(), N, K, group, rows.data(), row_scales.data());
  store_int8(l, arena, rows, row_scales, N, K, group, layout);
}

// l, kept as q8_0 blocks, as int8 with the blocks' own values and scales (groups of 32):
// q8_0 is int8 with an f16 scale per 32 inputs, so nothing is rounded again.
void make_int8_from_q8_0(LinearWeights& l, TensorArena& arena, Int8WeightLayout layout) {
  const int64_t N = l.w.dim(0), row_bytes = l.w.dim(1);
  const int64_t blocks = row_bytes / static_cast<int64_t>(sizeof(BlockQ8_0)), K = blocks * kGgmlQK;
  std::vector<int8_t> rows(static_cast<size_t>(N * K));
  std::vector<float> row_scales(static_cast<size_t>(N * blocks));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t b = 0; b < blocks; ++b) {
      const auto block = load_ggml_block<BlockQ8_0>(l.w.data<uint8_t>() + n * row_bytes, b);
      std::memcpy(rows.data() + n * K + b * kGgmlQK, block.qs, kGgmlQK);
      row_scales[static_cast<size_t>(n * blocks + b)] = f16_to_f32(block.d);
    }
  }
  l.ggml_blocks = -1;
  store_int8(l, arena, rows, row_scales, N, K, kGgmlQK, layout);
}

// A bfloat16 matrix left unquantized becomes coded bf16 under model.bf16_coding on, when its
// input width is a multiple of the coded block (kernels/coded_bf16_layout.h); true if it did.
bool code_bf16_matrix(LinearWeights& l, TensorArena& arena) {
  if (!bf16_matrix_codable(l.w.dtype(), l.w.view().dims()) || !l.w.view().contiguous()) return false;
  CodedBf16Matrix coded = encode_coded_bf16(l.w.data<uint16_t>(), l.w.dim(0), l.w.dim(1), &arena);
  l.w = std::move(coded.body);
  l.scales = std::move(coded.side);
  return true;
}

std::string quoted_names(const std::vector<std::string>& sources) {
  std::string names;
  for (const std::string& n : sources) names += (names.empty() ? "\"" : " + \"") + n + "\"";
  return names;
}

}  // namespace

StatusOr<int64_t> quantize_model_weights(ModelWeights& mw, const ModelConfig& c, const Checkpoint& checkpoint,
                                         const QuantizationOptions& options, const TpPlan* plan,
                                         Int8WeightLayout layout, DType dtype) {
  WeightQuantizer quantizer(c, checkpoint, options, plan, layout, dtype);
  TESSERA_RETURN_IF_ERROR(quantizer.validity());
  return quantizer.finish(mw);
}

WeightQuantizer::WeightQuantizer(const ModelConfig& config, const Checkpoint& checkpoint,
                                 const QuantizationOptions& options, const TpPlan* plan, Int8WeightLayout layout,
                                 DType dtype)
    : config_(config),
      checkpoint_(checkpoint),
      options_(resolve_quantization(options, checkpoint)),
      layout_(layout),
      dtype_(dtype),
      selector_(std::make_unique<QuantSelector>(config, checkpoint, options_, plan)) {}

WeightQuantizer::~WeightQuantizer() = default;

Status WeightQuantizer::validity() const {
  const QuantizationOptions& q = options_;
  if (q.group != kAutoQuantGroup && !valid_quant_group(q.group)) {
    return invalid_argument("model.quantization_group: expected auto or a multiple of 32 in [32, 256], got " +
                            std::to_string(q.group));
  }
  if (q.kind == WeightQuantization::kInt4 && q.group != kAutoQuantGroup && q.group != kInt4Group) {
    return invalid_argument("model.quantization_group " + std::to_string(q.group) +
                            " with model.quantization int4: 4-bit weights have a scale per 32 inputs; set the group "
                            "to auto or 32 (it sets int8 weights' groups)");
  }
  return Status::ok();
}

Status WeightQuantizer::quantize_layer(ModelWeights& mw, int layer) {
  done_.resize(mw.layers.size(), false);
  if (layer < 0 || layer >= static_cast<int>(mw.layers.size()) || done_[static_cast<size_t>(layer)])
    return internal_error("WeightQuantizer: layer " + std::to_string(layer) + " is not one to quantize");
  done_[static_cast<size_t>(layer)] = true;
  std::vector<QuantCandidate> list = candidates(mw, config_, *selector_, layer, layer + 1);
  return quantize(list);
}

Status WeightQuantizer::restored_layer(ModelWeights& mw, int layer) {
  done_.resize(mw.layers.size(), false);
  if (layer < 0 || layer >= static_cast<int>(mw.layers.size()) || done_[static_cast<size_t>(layer)])
    return internal_error("WeightQuantizer: layer " + std::to_string(layer) + " is not one restored");
  done_[static_cast<size_t>(layer)] = true;
  ++restored_layers_;
  if (!options_.enabled()) return Status::ok();
  for (const QuantCandidate& cand : candidates(mw, config_, *selector_, layer, layer + 1)) {
    TESSERA_RETURN_IF_ERROR(selector_->kind_for(cand).status());
  }
  return Status::ok();
}

StatusOr<int64_t> WeightQuantizer::finish(ModelWeights& mw) {
  done_.resize(mw.layers.size(), false);
  std::vector<QuantCandidate> list;
  for (int layer = 0; layer < static_cast<int>(mw.layers.size()); ++layer) {
    if (done_[static_cast<size_t>(layer)]) continue;
    std::vector<QuantCandidate> more = candidates(mw, config_, *selector_, layer, layer + 1);
    list.insert(list.end(), more.begin(), more.end());
  }
  // The LM head (default_kind); never when it is the embedding itself.
  const std::string embed = selector_->resolve(TensorRole::kEmbed, -1);
  const bool tied = mw.lm_head.w.view().data == mw.embed.view().data;
  if (!tied && !mw.lm_head.w.empty())
    list.push_back({&mw.lm_head, {selector_->resolve(TensorRole::kLmHead, -1)}, TpRole::kVocab});
  TESSERA_RETURN_IF_ERROR(quantize(list));
  // A tied LM head is the embedding table: coded, the table is looked up from the codes
  // (Backend::embedding_coded_bf16) and the head multiplies them, one buffer for both.
  bool tied_coded = false;
  if (tied && !mw.lm_head.w.empty() && options_.bf16_coding == Bf16Coding::kOn) {
    LinearWeights head;
    head.w = mw.embed;
    const int64_t before = bytes(mw.embed);
    TensorArena arena;
    if (code_bf16(head, arena)) {
      mw.embed = head.w;
      mw.embed_side = head.scales;
      mw.lm_head.w = head.w;
      mw.lm_head.scales = head.scales;
      delta_ += bytes(head.w) + bytes(head.scales) - before;
      tied_coded = true;
      checkpoint_.release(embed);
    }
  }
  if (options_.enabled()) TESSERA_RETURN_IF_ERROR(selector_->check_rules(embed, tied));
  if (options_.enabled() || options_.bf16_coding == Bf16Coding::kOn) {
    std::string counts;
    for (const auto& [made, n] : made_counts_) counts += (counts.empty() ? "" : ", ") + std::to_string(n) + " " + made;
    const std::string restored =
        restored_layers_ > 0 ? " (and " + std::to_string(restored_layers_) + " layers read back from the weight cache)" : "";
    const std::string head = tied ? (tied_coded ? "is the embedding (tied), both coded bf16"
                                                : "is the embedding (tied), in the compute dtype")
                                  : (lm_head_made_.empty() ? "none" : lm_head_made_);
    TESSERA_LOG_INFO("model.quantization {}{}: the layers' linear weights {}{}; the LM head {}",
                     options_.keep_blocks ? "auto" : weight_quantization_name(options_.kind),
                     options_.bf16_coding == Bf16Coding::kOn ? ", model.bf16_coding on" : "",
                     counts.empty() ? "none" : counts, restored, head);
  }
  return delta_;
}

bool WeightQuantizer::code_bf16(LinearWeights& l, TensorArena& arena) const {
  return options_.bf16_coding == Bf16Coding::kOn && code_bf16_matrix(l, arena);
}

void WeightQuantizer::count(const quantization_internal::QuantCandidate& cand, const std::string& made) {
  if (cand.structural_role == TpRole::kVocab) {
    lm_head_made_ = made;
  } else {
    ++made_counts_[made];
  }
}

Status WeightQuantizer::quantize(std::vector<quantization_internal::QuantCandidate>& list) {
  const QuantizationOptions& q = options_;
  QuantSelector& s = *selector_;
  const Checkpoint& checkpoint = checkpoint_;
  const DType dtype = dtype_;
  const Int8WeightLayout layout = layout_;
  TensorArena arena;  // most quantized matrices are under a huge page (Tensor::zeros, TensorArena)
  for (const QuantCandidate& cand : list) {
    LinearWeights& l = *cand.weights;
    WeightQuantization kind = WeightQuantization::kNone;
    if (q.enabled()) {
      TESSERA_ASSIGN_OR_RETURN(kind, s.kind_for(cand));
    }
    // auto on a GGUF file: the matrices it quantizes by default are computed as stored: the
    // q4_* / q5_* / q6_K ones as panels of their bits, the q8_0 ones (with the file's groups of
    // 32) as int8 with their own scales. `int4` (or a rule asking it) keeps only 4-bit blocks;
    // others are quantized to 4 bits from their floats.
    const bool kept = l.ggml_blocks >= 0;
    const auto type = static_cast<GgmlType>(l.ggml_blocks);
    const bool as_stored = kept && q.keep_blocks && kind == WeightQuantization::kInt8;
    const int64_t before = bytes(l.w) + bytes(l.scales);
    std::string made = "int8";  // what the matrix becomes, for the summary finish() logs
    if (as_stored && type == GgmlType::kQ8_0 && q.group == kGgmlQK) {
      make_int8_from_q8_0(l, arena, layout);
    } else if ((as_stored && type != GgmlType::kQ8_0) || kind == WeightQuantization::kInt4) {
      if (kind == WeightQuantization::kInt4 && kept && !panel_scheme_of_blocks(type, /*auto_kind=*/false)) {
        TESSERA_RETURN_IF_ERROR(decode_blocks(l, dtype));
      }
      TESSERA_ASSIGN_OR_RETURN(const Int4Scheme scheme, make_int4(l, arena, quoted_names(cand.sources)));
      made = std::to_string(4 + int4_top_bits(scheme)) + "-bit";
    } else {
      // Blocks kept that are not to be computed from after all (a rule, a kept role, a group).
      if (l.ggml_blocks >= 0) TESSERA_RETURN_IF_ERROR(decode_blocks(l, dtype));
      if (kind == WeightQuantization::kNone) {
        const bool coded = code_bf16(l, arena);
        delta_ += bytes(l.w) + bytes(l.scales) - before;
        count(cand, coded ? "coded bf16" : dtype_name(l.w.dtype()));
        // As below: a coded matrix no longer reads the pages it was coded from.
        if (coded) {
          for (const std::string& name : cand.sources) checkpoint.release(name);
        }
        continue;
      }
      const int64_t N = l.w.dim(0), K = l.w.dim(1);
      // The kernels read a tensor's group off its scales' shape (K / columns).
      const int64_t group = q.group == kAutoQuantGroup ? auto_quant_group(K) : q.group;
      if (group == 0 || K % group != 0) {
        if (!q.as_stored) {
          return invalid_argument("model.quantization_group " + quant_group_name(q.group) +
                                  (q.group == kAutoQuantGroup ? " found no group (128, 64 or 32) dividing"
                                                              : " does not divide") +
                                  " the input dimension " + std::to_string(K) + " of " + quoted_names(cand.sources) +
                                  " (this rank's matrix is [" + std::to_string(N) + ", " + std::to_string(K) + "]); " +
                                  divisors_hint(K));
        }
        // Under auto only a matrix decoded from blocks lands here (a tensor-parallel split cut
        // them, or a packed matrix mixes types): int8 cannot group this rank's inputs, so it
        // is computed from the decoded values, as a matrix the file stores in floats.
        if (!narrow_warned_) {
          TESSERA_LOG_WARN("model.quantization auto: {} has {} inputs on this rank, no whole group of {}; it stays "
                           "in {} (so does any other such matrix: the summary counts them)",
                           quoted_names(cand.sources), K, q.group, dtype_name(l.w.dtype()));
          narrow_warned_ = true;
        }
        delta_ += bytes(l.w) + bytes(l.scales) - before;
        count(cand, dtype_name(l.w.dtype()));
        continue;
      }
      make_int8(l, arena, group, layout);
    }
    count(cand, made);
    delta_ += bytes(l.w) + bytes(l.scales) - before;
    // A weight used in place from the mapped checkpoint has no reader left: drop its pages so
    // the rank's memory is its quantized share (a page read again would come back from the file).
    for (const std::string& name : cand.sources) checkpoint.release(name);
  }
  return Status::ok();
}

// A checkpoint's weights as loaded, estimated before loading (rules aside): every parameter in
// `dtype`, or where the matrices become quantized (model.quantization int8 or int4, or auto on
// a GGUF file of quantized blocks) the matrices but the embedding and LM head at a byte each
// and a float scale per 32 (int8, and the LM head under int4), or in their panels' bytes
// (4-bit: int4 and auto's q4_0 / q4_1 / q4_K matrices; 5-bit: auto's q5_0 / q5_1 / q5_K ones;
// 6-bit: auto's q6_K ones); under auto an LM head stored in blocks is quantized too.
double estimated_weight_bytes(const Checkpoint& ckpt, const ModelConfig& mc, const QuantizationOptions& options,
                              DType dtype) {
  const QuantizationOptions quant = resolve_quantization(options, ckpt);
  const std::string embed = tensor_name(mc.arch->name_of(TensorRole::kEmbed), 0);
  const std::string head = tensor_name(mc.arch->name_of(TensorRole::kLmHead), 0);
  double bytes = 0;
  for (const std::string& name : ckpt.tensor_names()) {
    const TensorInfo& info = *ckpt.find(name);
    double n = 1;
    for (int64_t d : info.shape) n *= static_cast<double>(d);
    const bool blocks = stored_in_ggml_blocks(info);
    const WeightQuantization kind = default_kind(quant, name == head, blocks);
    const bool matrix = info.shape.size() == 2 && name != embed && kind != WeightQuantization::kNone;
    // keep_blocks is auto's: every kind it keeps, not only int4's.
    const std::optional<Int4Scheme> panels =
        blocks && quant.keep_blocks ? panel_scheme_of_blocks(static_cast<GgmlType>(info.ggml_type), /*auto_kind=*/true)
                                    : std::nullopt;
    double per_weight = static_cast<double>(dtype_size(dtype));
    const bool coded = quant.bf16_coding == Bf16Coding::kOn && name != embed && kind == WeightQuantization::kNone &&
                       !blocks && bf16_matrix_codable(dtype, info.shape);
    // An untied table in blocks stays in them (WeightReader::sparse_table).
    const bool table_blocks = name == embed && !mc.tie_embeddings && blocks && quant.keep_blocks &&
                              ggml_element::decodes(static_cast<uint32_t>(info.ggml_type));
    if (coded) {
      per_weight = 1.5;
    } else if (table_blocks) {
      const auto type = static_cast<uint32_t>(info.ggml_type);
      per_weight = static_cast<double>(ggml_element::block_bytes(type)) / static_cast<double>(ggml_element::block_elems(type));
    } else if (matrix && panels.has_value()) {
      per_weight = panel_bytes_per_weight(*panels);
    } else if (matrix && kind == WeightQuantization::kInt4) {
      per_weight = panel_bytes_per_weight(Int4Scheme::kSymmetric);
    } else if (matrix) {
      per_weight = 1.0 + 4.0 / 32.0;
    }
    bytes += n * per_weight;
  }
  return bytes;
}

}  // namespace tessera
