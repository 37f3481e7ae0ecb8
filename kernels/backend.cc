// Validated fronts of the Backend ops: every shape/dtype rule is checked here once, for
// every device, before the device kernel runs. A failed check is an engine bug (callers
// validate user input long before an op sees it).
#include "kernels/backend.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include "common/gguf/ggml_block_element.h"
#include "common/logging.h"
#include "kernels/coded_bf16_layout.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/linear_int8_panels.h"
#include "kernels/weight_stager.h"
#ifdef TESSERA_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_probe.h"
#endif

namespace tessera {
namespace {

bool is_float_storage(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// f32 [rows, columns]; rows may lie further apart than their width (a column slice).
void check_f32_2d_strided(const TensorView& t, const char* what) {
  TESSERA_CHECK_EQ(t.ndim, 2) << what << " must be 2-D, got " << t.shape_string();
  TESSERA_CHECK(t.dtype == DType::kF32) << what << " must be float32, got " << dtype_name(t.dtype);
  TESSERA_CHECK_GE(t.row_stride(), t.dim(1)) << what << " " << t.shape_string() << ": row stride below the row's width";
}

void check_f32_2d(const TensorView& t, const char* what) {
  check_f32_2d_strided(t, what);
  TESSERA_CHECK(t.contiguous()) << what << " must be contiguous, got " << t.shape_string();
}

const char* memory_name(DeviceKind d) { return d == DeviceKind::kCuda ? "CUDA memory" : "host memory"; }

// Where a view of each kind comes from, for check_on_device's message.
constexpr const char* kFromAlloc = " (Backend::alloc)";
constexpr const char* kFromPlaceWeight = ": parameters must be placed at load time (Backend::place_weight)";

// A view an op reads or writes must be on the backend's device: activations, caches and
// outputs from Backend::alloc, parameters (gamma, rotary frequencies, ALiBi slopes) from
// Backend::place_weight.
void check_on_device(const Backend& b, const TensorView& t, const char* op, const char* what,
                     const char* from = kFromAlloc) {
  TESSERA_CHECK(t.device == b.device()) << op << ": " << what << " is " << memory_name(t.device) << "; the "
                                        << b.name() << " backend needs it in " << memory_name(b.device()) << from;
}

// Heads of tokens: f32 [tokens, heads, head_dim] on the backend's device, rows at least
// heads * head_dim floats apart (a column slice of a packed qkv buffer is fine).
void check_heads(const Backend& b, const TensorView& x, const char* op, const char* what) {
  check_on_device(b, x, op, what);
  TESSERA_CHECK_EQ(x.ndim, 3) << op << ": " << what << " must be [tokens, heads, head_dim], got " << x.shape_string();
  TESSERA_CHECK(x.dtype == DType::kF32) << op << ": " << what << " must be float32, got " << dtype_name(x.dtype);
  TESSERA_CHECK_GE(x.row_stride(), x.dim(1) * x.dim(2))
      << op << ": " << what << " " << x.shape_string() << ": row stride below heads * head_dim";
}

// A coded bf16 matrix of `rows` rows of `inputs` inputs, as kernels/coded_bf16_layout.h lays
// it out (the fronts of linear_coded_bf16 and embedding_coded_bf16).
void check_coded_bf16(const char* op, const TensorView& body, const TensorView& side, int64_t rows, int64_t inputs) {
  TESSERA_CHECK(is_coded_bf16(body, side) && body.contiguous() && side.contiguous() && body.dim(0) == rows &&
                coded_bf16_codable(inputs) && body.dim(1) == coded_bf16_row_bytes(inputs) &&
                CodedBf16Side::fits(rows, side.dim(0)))
      << op << ": body " << body.shape_string() << " " << dtype_name(body.dtype) << " and side "
      << side.shape_string() << " " << dtype_name(side.dtype) << " for " << rows << " rows of " << inputs
      << " inputs (kernels/coded_bf16_layout.h)";
}

}  // namespace

StatusOr<std::unique_ptr<WeightStager>> Backend::make_weight_stager(size_t host_bytes, size_t slot_bytes, int slots) {
  return make_host_weight_stager(host_bytes, slot_bytes, slots);
}

void Backend::embedding(const TensorView& ids, const TensorView& table, const TensorView& out) {
  TESSERA_CHECK(ids.dtype == DType::kI32 && ids.ndim == 1) << "ids " << ids.shape_string();
  TESSERA_CHECK(table.ndim == 2 && is_float_storage(table.dtype)) << "table " << table.shape_string();
  check_f32_2d(out, "embedding out");
  TESSERA_CHECK_EQ(out.dim(0), ids.dim(0));
  TESSERA_CHECK_EQ(out.dim(1), table.dim(1));
  embedding_impl(ids, table, out, -1);
}

void Backend::embedding(const TensorView& ids, const TensorView& table, const TensorView& out, int64_t row_offset) {
  TESSERA_CHECK(ids.dtype == DType::kI32 && ids.ndim == 1) << "ids " << ids.shape_string();
  TESSERA_CHECK(table.ndim == 2 && is_float_storage(table.dtype)) << "table " << table.shape_string();
  check_f32_2d(out, "embedding out");
  TESSERA_CHECK_EQ(out.dim(0), ids.dim(0));
  TESSERA_CHECK_EQ(out.dim(1), table.dim(1));
  TESSERA_CHECK_GE(row_offset, 0);
  embedding_impl(ids, table, out, row_offset);
}

void Backend::embedding_coded_bf16(const TensorView& ids, const TensorView& body, const TensorView& side,
                                   const TensorView& out, int64_t row_offset) {
  TESSERA_CHECK(ids.dtype == DType::kI32 && ids.ndim == 1) << "ids " << ids.shape_string();
  check_f32_2d(out, "embedding out");
  check_on_device(*this, body, "embedding_coded_bf16", "body", kFromPlaceWeight);
  check_on_device(*this, side, "embedding_coded_bf16", "side", kFromPlaceWeight);
  check_coded_bf16("embedding_coded_bf16", body, side, body.dim(0), out.dim(1));
  TESSERA_CHECK_EQ(out.dim(0), ids.dim(0));
  TESSERA_CHECK_GE(row_offset, -1);
  embedding_coded_bf16_impl(ids, body, side, out, row_offset);
}

void Backend::embedding_ggml(const TensorView& ids, const TensorView& table, uint32_t ggml_type,
                             const TensorView& out, int64_t row_offset) {
  TESSERA_CHECK(ids.dtype == DType::kI32 && ids.ndim == 1) << "ids " << ids.shape_string();
  check_f32_2d(out, "embedding out");
  check_on_device(*this, table, "embedding_ggml", "table", kFromPlaceWeight);
  TESSERA_CHECK(ggml_element::decodes(ggml_type)) << "embedding_ggml: ggml type " << ggml_type << " is not decoded";
  const int64_t h = out.dim(1), per_block = ggml_element::block_elems(ggml_type);
  TESSERA_CHECK(table.ndim == 2 && table.dtype == DType::kU8 && table.contiguous() && h % per_block == 0 &&
                table.dim(1) == h / per_block * ggml_element::block_bytes(ggml_type))
      << "embedding_ggml: table " << table.shape_string() << " " << dtype_name(table.dtype) << " is not rows of " << h
      << " elements in ggml type " << ggml_type << " blocks";
  TESSERA_CHECK_EQ(out.dim(0), ids.dim(0));
  TESSERA_CHECK_GE(row_offset, -1);
  embedding_ggml_impl(ids, table, ggml_type, out, row_offset);
}

void Backend::layer_norm(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                         float eps, const TensorView& out) {
  check_f32_2d(x, "layer_norm x");
  check_f32_2d(out, "layer_norm out");
  TESSERA_CHECK_EQ(gamma.numel(), x.dim(1));
  TESSERA_CHECK_EQ(beta.numel(), x.dim(1));
  layer_norm_impl(x, gamma, beta, eps, out);
}

void Backend::rms_norm(const TensorView& x, const TensorView& gamma, float eps, const TensorView& out) {
  check_f32_2d(x, "rms_norm x");
  check_f32_2d(out, "rms_norm out");
  TESSERA_CHECK_EQ(gamma.numel(), x.dim(1));
  rms_norm_impl(x, gamma, eps, out);
}

void Backend::residual_add_norm(const TensorView& residual, const TensorView& delta,
                                const TensorView& gamma, const TensorView& beta, float eps,
                                bool rms, const TensorView& out) {
  check_f32_2d(residual, "residual");
  check_f32_2d(delta, "delta");
  check_f32_2d(out, "norm out");
  TESSERA_CHECK(residual.dims() == delta.dims()) << residual.shape_string() << " vs " << delta.shape_string();
  TESSERA_CHECK_EQ(gamma.numel(), residual.dim(1));
  if (!rms) TESSERA_CHECK_EQ(beta.numel(), residual.dim(1));
  residual_add_norm_impl(residual, delta, gamma, beta, eps, rms, out);
}

void Backend::linear(const TensorView& x, const TensorView& w, const TensorView& bias,
                     const TensorView& out) {
  check_f32_2d(x, "linear x");
  check_f32_2d(out, "linear out");
  TESSERA_CHECK(w.ndim == 2 && is_float_storage(w.dtype)) << "weight " << w.shape_string();
  TESSERA_CHECK_EQ(x.dim(1), w.dim(1)) << "x " << x.shape_string() << " w " << w.shape_string();
  TESSERA_CHECK_EQ(out.dim(0), x.dim(0));
  TESSERA_CHECK_EQ(out.dim(1), w.dim(0));
  if (!bias.empty()) TESSERA_CHECK_EQ(bias.numel(), w.dim(0));
  linear_impl(x, w, bias, out, Activation::kNone);
}

void Backend::linear_act(const TensorView& x, const TensorView& w, const TensorView& bias,
                         const TensorView& out, Activation act) {
  check_f32_2d(x, "linear x");
  check_f32_2d(out, "linear out");
  TESSERA_CHECK(w.ndim == 2 && is_float_storage(w.dtype)) << "weight " << w.shape_string();
  TESSERA_CHECK_EQ(x.dim(1), w.dim(1));
  TESSERA_CHECK_EQ(out.dim(0), x.dim(0));
  TESSERA_CHECK_EQ(out.dim(1), w.dim(0));
  if (!bias.empty()) TESSERA_CHECK_EQ(bias.numel(), w.dim(0));
  linear_impl(x, w, bias, out, act);
}

void Backend::linear_int8(const TensorView& x, const TensorView& w, const TensorView& scales,
                          const TensorView& bias, const TensorView& out, Activation act) {
  check_f32_2d(x, "linear_int8 x");
  check_f32_2d(out, "linear_int8 out");
  TESSERA_CHECK((w.ndim == 2 || w.ndim == 3) && w.dtype == DType::kI8)
      << "int8 weight " << w.shape_string() << " " << dtype_name(w.dtype);
  if (w.ndim == 3) {
    // The CPU's column panels (kernels/cpu/linear_int8_panels.h): w [ceil(N / 32), K / 2, 64],
    // scales [ceil(N / 32), groups, 32]; N is the output's width.
    const int64_t N = out.dim(1), K = x.dim(1);
    TESSERA_CHECK(w.dim(0) == cpu::int8_panel_count(N) && w.dim(1) * 2 == K && w.dim(2) == 2 * cpu::kInt8PanelColumns)
        << "int8 panels " << w.shape_string() << " for x " << x.shape_string() << " out " << out.shape_string();
    TESSERA_CHECK(scales.ndim == 3 && scales.dtype == DType::kF32 && scales.dim(0) == w.dim(0) &&
                  scales.dim(2) == cpu::kInt8PanelColumns &&
                  scales.dim(1) > 0 && K % scales.dim(1) == 0 && (K / scales.dim(1)) % 32 == 0)
        << "panel scales " << scales.shape_string() << " for w " << w.shape_string();
    TESSERA_CHECK_EQ(out.dim(0), x.dim(0));
    if (!bias.empty()) TESSERA_CHECK_EQ(bias.numel(), N);
    linear_int8_impl(x, w, scales, bias, out, act);
    return;
  }
  TESSERA_CHECK(scales.ndim == 2 && scales.dtype == DType::kF32) << "scales " << scales.shape_string();
  TESSERA_CHECK_EQ(scales.dim(0), w.dim(0));
  TESSERA_CHECK(scales.dim(1) > 0 && w.dim(1) % scales.dim(1) == 0 && (w.dim(1) / scales.dim(1)) % 32 == 0)
      << "w " << w.shape_string() << " scales " << scales.shape_string();
  TESSERA_CHECK_EQ(x.dim(1), w.dim(1)) << "x " << x.shape_string() << " w " << w.shape_string();
  TESSERA_CHECK_EQ(out.dim(0), x.dim(0));
  TESSERA_CHECK_EQ(out.dim(1), w.dim(0));
  if (!bias.empty()) TESSERA_CHECK_EQ(bias.numel(), w.dim(0));
  linear_int8_impl(x, w, scales, bias, out, act);
}

DType int4_scales_dtype(Int4Scheme scheme) {
  if (int4_super_block(scheme)) return DType::kU8;
  return scheme == Int4Scheme::kSixBit ? DType::kI8 : DType::kF16;
}

int64_t int4_record_elements(Int4Scheme scheme) {
  return int4_record_bytes(scheme) / static_cast<int64_t>(dtype_size(int4_scales_dtype(scheme)));
}

std::optional<Int4Scheme> int4_scheme_of(const TensorView& w, const TensorView& scales) {
  if (w.ndim != 3 || scales.ndim != 3) return std::nullopt;
  for (int i = 0; i < kInt4SchemeCount; ++i) {
    const auto scheme = static_cast<Int4Scheme>(i);
    if (scales.dtype == int4_scales_dtype(scheme) && scales.dim(2) == int4_record_elements(scheme) &&
        w.dim(2) == int4_step_bytes(scheme)) {
      return scheme;
    }
  }
  return std::nullopt;
}

void Backend::linear_int4(const TensorView& x, const TensorView& w, const TensorView& scales, const TensorView& bias,
                          const TensorView& out, Activation act) {
  check_on_device(*this, x, "linear_int4", "x");
  check_on_device(*this, out, "linear_int4", "out");
  check_on_device(*this, w, "linear_int4", "w", kFromPlaceWeight);
  check_on_device(*this, scales, "linear_int4", "scales", kFromPlaceWeight);
  if (!bias.empty()) check_on_device(*this, bias, "linear_int4", "bias", kFromPlaceWeight);
  check_f32_2d(x, "linear_int4 x");
  check_f32_2d(out, "linear_int4 out");
  const int64_t N = out.dim(1), K = x.dim(1);
  TESSERA_CHECK_EQ(out.dim(0), x.dim(0)) << "linear_int4: x " << x.shape_string() << " out " << out.shape_string();
  const std::optional<Int4Scheme> scheme = int4_scheme_of(w, scales);
  TESSERA_CHECK(scheme.has_value()) << "linear_int4: panels " << w.shape_string() << " " << dtype_name(w.dtype)
                                    << " with scales " << scales.shape_string() << " " << dtype_name(scales.dtype)
                                    << " are no scheme of kernels/int4_layout.h";
  const int64_t unit = int4_k_multiple(*scheme);
  TESSERA_CHECK(w.dtype == DType::kU8 && w.contiguous() && w.dim(0) == int4_panel_count(N) && w.dim(1) * 4 == K &&
                K % unit == 0 && scales.contiguous() && scales.dim(0) == w.dim(0) && scales.dim(1) == K / unit)
      << "linear_int4: " << int4_scheme_name(*scheme) << " panels " << w.shape_string() << " "
      << dtype_name(w.dtype) << " and scales " << scales.shape_string() << " for x " << x.shape_string()
      << " and out " << out.shape_string();
  if (!bias.empty()) TESSERA_CHECK_EQ(bias.numel(), N) << "linear_int4 bias";
  linear_int4_impl(x, w, scales, bias, out, act);
}

void Backend::linear_coded_bf16(const TensorView& x, const TensorView& body, const TensorView& side,
                                const TensorView& bias, const TensorView& out, Activation act) {
  check_on_device(*this, x, "linear_coded_bf16", "x");
  check_on_device(*this, out, "linear_coded_bf16", "out");
  check_on_device(*this, body, "linear_coded_bf16", "body", kFromPlaceWeight);
  check_on_device(*this, side, "linear_coded_bf16", "side", kFromPlaceWeight);
  if (!bias.empty()) check_on_device(*this, bias, "linear_coded_bf16", "bias", kFromPlaceWeight);
  check_f32_2d(x, "linear_coded_bf16 x");
  check_f32_2d(out, "linear_coded_bf16 out");
  const int64_t N = out.dim(1);
  check_coded_bf16("linear_coded_bf16", body, side, N, x.dim(1));
  TESSERA_CHECK_EQ(out.dim(0), x.dim(0)) << "linear_coded_bf16: x " << x.shape_string() << " out " << out.shape_string();
  if (!bias.empty()) TESSERA_CHECK_EQ(bias.numel(), N) << "linear_coded_bf16 bias";
  linear_coded_bf16_impl(x, body, side, bias, out, act);
}

void Backend::activate(const TensorView& x, Activation act) {
  TESSERA_CHECK(x.dtype == DType::kF32);
  if (act != Activation::kNone) activate_impl(x, act);
}

void Backend::gated_act(const TensorView& gate, const TensorView& up, const TensorView& out, Activation act) {
  check_on_device(*this, gate, "gated_act", "gate");
  check_on_device(*this, up, "gated_act", "up");
  check_on_device(*this, out, "gated_act", "out");
  check_f32_2d_strided(gate, "gate");
  check_f32_2d_strided(up, "up");
  check_f32_2d(out, "gated_act out");
  TESSERA_CHECK(gate.dims() == up.dims() && gate.dims() == out.dims())
      << "gated_act: gate " << gate.shape_string() << " up " << up.shape_string() << " out " << out.shape_string();
  TESSERA_CHECK_EQ(gate.row_stride(), up.row_stride()) << "gated_act: gate and up rows must be spaced alike";
  TESSERA_CHECK(act != Activation::kNone) << "a gated MLP needs an activation";
  gated_act_impl(gate, up, out, act);
}

void Backend::gated_act_packed(const TensorView& gate_up, const TensorView& out, Activation act) {
  check_f32_2d(gate_up, "gate_up");
  check_f32_2d(out, "gated_act out");
  const int64_t width = out.dim(1);
  TESSERA_CHECK_EQ(gate_up.dim(1), 2 * width);
  TESSERA_CHECK_EQ(gate_up.dim(0), out.dim(0));
  gated_act(gate_up.columns(0, width), gate_up.columns(width, width), out, act);
}

void Backend::add(const TensorView& a, const TensorView& b, const TensorView& out) {
  TESSERA_CHECK(a.dtype == DType::kF32 && b.dtype == DType::kF32 && out.dtype == DType::kF32);
  TESSERA_CHECK_EQ(a.numel(), b.numel());
  TESSERA_CHECK_EQ(a.numel(), out.numel());
  add_impl(a, b, out);
}

void Backend::scale(const TensorView& x, float factor) {
  TESSERA_CHECK(x.dtype == DType::kF32);
  scale_impl(x, factor);
}

void Backend::softcap(const TensorView& x, float cap) {
  TESSERA_CHECK(x.dtype == DType::kF32);
  TESSERA_CHECK_GT(cap, 0.0f);
  softcap_impl(x, cap);
}

void Backend::greedy_rows(const TensorView& logits, const TensorView& ids, const TensorView& logprobs) {
  TESSERA_CHECK(logits.dtype == DType::kF32 && logits.ndim == 2 && logits.contiguous())
      << "greedy_rows: logits must be contiguous f32 [rows, vocab]";
  TESSERA_CHECK(ids.dtype == DType::kI32 && ids.numel() == logits.dim(0)) << "greedy_rows: ids must be i32 [rows]";
  TESSERA_CHECK(logprobs.dtype == DType::kF32 && logprobs.numel() == logits.dim(0))
      << "greedy_rows: logprobs must be f32 [rows]";
  TESSERA_CHECK_GT(logits.dim(1), 0);
  greedy_rows_impl(logits, ids, logprobs);
}

void Backend::rejection_sample_rows(const TensorView& p, const TensorView& q, const TensorView& proposals,
                                    const TensorView& uniforms, const TensorView& tokens, const TensorView& accepted) {
  TESSERA_CHECK(p.dtype == DType::kF32 && p.ndim == 2 && p.contiguous())
      << "rejection_sample_rows: p must be contiguous f32 [rows, vocab]";
  TESSERA_CHECK(q.dtype == DType::kF32 && q.ndim == 2 && q.contiguous() && q.dim(0) == p.dim(0) &&
                q.dim(1) == p.dim(1))
      << "rejection_sample_rows: q must be contiguous f32 of p's shape";
  const int64_t rows = p.dim(0);
  TESSERA_CHECK_GT(p.dim(1), 0);
  TESSERA_CHECK(proposals.dtype == DType::kI32 && proposals.numel() == rows)
      << "rejection_sample_rows: proposals must be i32 [rows]";
  TESSERA_CHECK(uniforms.dtype == DType::kI64 && uniforms.numel() == 2 * rows && uniforms.contiguous() &&
                uniforms.device == DeviceKind::kCpu)
      << "rejection_sample_rows: uniforms must be i64 [rows, 2] in host memory";
  TESSERA_CHECK(tokens.dtype == DType::kI32 && tokens.numel() == rows)
      << "rejection_sample_rows: tokens must be i32 [rows]";
  TESSERA_CHECK(accepted.dtype == DType::kI32 && accepted.numel() == rows)
      << "rejection_sample_rows: accepted must be i32 [rows]";
  const int64_t* u = uniforms.as<int64_t>();
  for (int64_t i = 0; i < 2 * rows; ++i)
    TESSERA_CHECK(u[i] >= 0 && u[i] < (int64_t{1} << 53)) << "rejection_sample_rows: a uniform is not 53 bits";
  if (rows == 0) return;
  rejection_sample_rows_impl(p, q, proposals, uniforms, tokens, accepted);
}

void Backend::rotary(const TensorView& x, const TensorView& positions, const TensorView& inv_freq, float magnitude) {
  check_heads(*this, x, "rotary", "x");
  const int64_t head_dim = x.dim(2);
  TESSERA_CHECK(positions.dtype == DType::kI32 && positions.ndim == 1 && positions.device == DeviceKind::kCpu)
      << "rotary: positions must be i32 [tokens] in host memory, got " << dtype_name(positions.dtype) << " "
      << positions.shape_string() << " in " << memory_name(positions.device);
  TESSERA_CHECK_EQ(positions.dim(0), x.dim(0)) << "rotary: one position per token of x " << x.shape_string();
  check_on_device(*this, inv_freq, "rotary", "inv_freq", kFromPlaceWeight);
  TESSERA_CHECK(inv_freq.dtype == DType::kF32 && inv_freq.ndim == 1) << "inv_freq " << inv_freq.shape_string();
  TESSERA_CHECK(inv_freq.numel() >= 1 && 2 * inv_freq.numel() <= head_dim)
      << "rotary over " << 2 * inv_freq.numel() << " of " << head_dim << " dims";
  TESSERA_CHECK(std::isfinite(magnitude) && magnitude > 0) << "rotary: magnitude " << magnitude;
  rotary_impl(x, positions, inv_freq, magnitude);
}

void Backend::head_rms_norm(const TensorView& x, const TensorView& gamma, float eps) {
  check_heads(*this, x, "head_rms_norm", "x");
  check_on_device(*this, gamma, "head_rms_norm", "gamma", kFromPlaceWeight);
  TESSERA_CHECK_EQ(gamma.numel(), x.dim(2)) << "head_rms_norm: one gamma per dim of a head of x " << x.shape_string();
  TESSERA_CHECK(is_float_storage(gamma.dtype)) << "head_rms_norm: gamma is " << dtype_name(gamma.dtype);
  head_rms_norm_impl(x, gamma, eps);
}

void Backend::write_kv(const TensorView& k, const TensorView& v, const AttentionBatch& batch,
                       const TensorView& k_cache, const TensorView& v_cache) {
  check_heads(*this, k, "write_kv", "k");
  check_heads(*this, v, "write_kv", "v");
  check_on_device(*this, k_cache, "write_kv", "k_cache");
  check_on_device(*this, v_cache, "write_kv", "v_cache");
  TESSERA_CHECK(k.dims() == v.dims()) << "write_kv: k " << k.shape_string() << " v " << v.shape_string();
  TESSERA_CHECK_EQ(k.row_stride(), v.row_stride()) << "write_kv: k and v rows must be spaced alike";
  TESSERA_CHECK_EQ(k_cache.ndim, 4);
  TESSERA_CHECK(is_float_storage(k_cache.dtype) && k_cache.dtype == v_cache.dtype) << dtype_name(k_cache.dtype);
  TESSERA_CHECK(k_cache.dims() == v_cache.dims());
  TESSERA_CHECK(k.dim(1) == k_cache.dim(2) && k.dim(2) == k_cache.dim(3))
      << "write_kv: k " << k.shape_string() << " into a cache of " << k_cache.shape_string();
  TESSERA_CHECK_EQ(static_cast<int64_t>(batch.slot_mapping.size()), k.dim(0));
  write_kv_impl(k, v, batch, k_cache, v_cache);
}

void Backend::attention(const TensorView& q, const AttentionBatch& batch, const TensorView& k_cache,
                        const TensorView& v_cache, const AttentionParams& params, const TensorView& out,
                        const GqaLayout& gqa) {
  check_heads(*this, q, "attention", "q");
  check_on_device(*this, k_cache, "attention", "k_cache");
  check_on_device(*this, v_cache, "attention", "v_cache");
  check_on_device(*this, out, "attention", "out");
  if (!params.alibi_slopes.empty()) {
    check_on_device(*this, params.alibi_slopes, "attention", "alibi_slopes", kFromPlaceWeight);
  }
  TESSERA_CHECK_EQ(k_cache.ndim, 4);
  TESSERA_CHECK(k_cache.dims() == v_cache.dims() && k_cache.dtype == v_cache.dtype)
      << "attention: k_cache " << k_cache.shape_string() << " v_cache " << v_cache.shape_string();
  const int64_t q_heads = q.dim(1);
  const int64_t kv_heads = k_cache.dim(2), head_dim = k_cache.dim(3);
  TESSERA_CHECK_EQ(q.dim(2), head_dim) << "attention: q " << q.shape_string() << " over a cache of "
                                       << k_cache.shape_string();
  GqaLayout g = gqa;
  if (g.group == 0) {
    TESSERA_CHECK_EQ(q_heads % kv_heads, 0) << "query heads must be a multiple of kv heads";
    g = {q_heads / kv_heads, 0, 0};
  }
  TESSERA_CHECK(g.q_head_offset / g.group - g.kv_head_offset >= 0 &&
                (g.q_head_offset + q_heads - 1) / g.group - g.kv_head_offset < kv_heads)
      << "query heads [" << g.q_head_offset << ", +" << q_heads << ") read KV heads outside the cache's ["
      << g.kv_head_offset << ", +" << kv_heads << ")";
  check_f32_2d(out, "attention out");
  TESSERA_CHECK_EQ(out.dim(0), q.dim(0)) << "attention: q " << q.shape_string() << " out " << out.shape_string();
  TESSERA_CHECK_EQ(out.dim(1), q_heads * head_dim);
  TESSERA_CHECK_EQ(static_cast<int64_t>(batch.query_start.size()), batch.num_seqs() + 1);
  TESSERA_CHECK_EQ(batch.query_start.back(), out.dim(0));
  TESSERA_CHECK_EQ(static_cast<int64_t>(batch.block_tables.size()),
                   static_cast<int64_t>(batch.num_seqs()) * batch.max_blocks_per_seq);
  if (!params.alibi_slopes.empty()) TESSERA_CHECK_EQ(params.alibi_slopes.numel(), q_heads);
  TESSERA_CHECK_GE(params.window, 0);
  TESSERA_CHECK_GE(params.softcap, 0.0f);
  attention_impl(q, batch, k_cache, v_cache, params, out, g);
}

void Backend::copy_block(const TensorView& pool, int64_t src, int64_t dst) {
  TESSERA_CHECK_GE(pool.ndim, 1);
  TESSERA_CHECK(src >= 0 && src < pool.dim(0) && dst >= 0 && dst < pool.dim(0)) << src << " -> " << dst;
  if (src != dst) copy_block_impl(pool, src, dst);
}

void Backend::moe_topk(const TensorView& logits, int top_k, bool normalize, const TensorView& weights,
                       const TensorView& ids) {
  check_f32_2d(logits, "router logits");
  TESSERA_CHECK(top_k >= 1 && top_k <= logits.dim(1)) << "top_k " << top_k;
  TESSERA_CHECK(weights.dtype == DType::kF32 && ids.dtype == DType::kI32);
  TESSERA_CHECK_EQ(weights.numel(), logits.dim(0) * top_k);
  TESSERA_CHECK_EQ(ids.numel(), logits.dim(0) * top_k);
  moe_topk_impl(logits, top_k, normalize, weights, ids);
}

void Backend::gather_rows(const TensorView& x, const std::vector<int32_t>& rows, const TensorView& out) {
  check_f32_2d(x, "gather x");
  check_f32_2d(out, "gather out");
  TESSERA_CHECK_EQ(out.dim(0), static_cast<int64_t>(rows.size()));
  TESSERA_CHECK_EQ(out.dim(1), x.dim(1));
  for (int32_t r : rows) TESSERA_CHECK(r >= 0 && r < x.dim(0)) << "row " << r;
  gather_rows_impl(x, rows, out);
}

void Backend::scatter_add_scaled(const TensorView& x, const std::vector<int32_t>& rows,
                                 const std::vector<float>& scale, const TensorView& out) {
  check_f32_2d(x, "scatter x");
  check_f32_2d(out, "scatter out");
  TESSERA_CHECK_EQ(x.dim(0), static_cast<int64_t>(rows.size()));
  TESSERA_CHECK_EQ(rows.size(), scale.size());
  TESSERA_CHECK_EQ(out.dim(1), x.dim(1));
  for (int32_t r : rows) TESSERA_CHECK(r >= 0 && r < out.dim(0)) << "row " << r;
  scatter_add_scaled_impl(x, rows, scale, out);
}

void Backend::lora_add(const TensorView& x, const std::vector<LoraSegment>& segments, const TensorView& out) {
  check_f32_2d_strided(x, "lora_add x");
  check_f32_2d_strided(out, "lora_add out");
  TESSERA_CHECK_EQ(x.dim(0), out.dim(0)) << "lora_add: x and out have different rows";
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const LoraSegment& s : segments) {
    TESSERA_CHECK(s.begin >= 0 && s.begin < s.end && s.end <= x.dim(0))
        << "lora_add: segment rows [" << s.begin << ", " << s.end << ") outside the " << x.dim(0) << " rows";
    for (const auto& [factor, what] : {std::pair{&s.shrink, "lora_add shrink"}, std::pair{&s.expand, "lora_add expand"}}) {
      TESSERA_CHECK(factor->dtype == DType::kF32 || factor->dtype == DType::kBF16)
          << what << " must be float32 or bfloat16, got " << dtype_name(factor->dtype);
      TESSERA_CHECK(factor->ndim == 2 && factor->contiguous()) << what << " must be 2-D and contiguous, got "
                                                               << factor->shape_string();
    }
    TESSERA_CHECK(s.shrink.dtype == s.expand.dtype) << "lora_add: shrink and expand differ in dtype";
    TESSERA_CHECK_EQ(s.shrink.dim(0), x.dim(1))
        << "lora_add: shrink " << s.shrink.shape_string() << " against x " << x.shape_string();
    TESSERA_CHECK(s.column >= 0 && s.column + s.expand.dim(1) <= out.dim(1))
        << "lora_add: expand " << s.expand.shape_string() << " at column " << s.column << " against out "
        << out.shape_string();
    TESSERA_CHECK_EQ(s.expand.dim(0), s.shrink.dim(1))
        << "lora_add: expand " << s.expand.shape_string() << " against shrink " << s.shrink.shape_string();
  }
  // Column ranges are few (a packed projection's parts): each distinct one must not overlap
  // another, and within one the segments' rows must not overlap.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const LoraSegment& s : segments) {
    const std::pair<int64_t, int64_t> r{s.column, s.column + s.expand.dim(1)};
    if (std::find(ranges.begin(), ranges.end(), r) != ranges.end()) continue;
    for (const auto& o : ranges)
      TESSERA_CHECK(r.second <= o.first || o.second <= r.first) << "lora_add: segments overlap (column ranges)";
    ranges.push_back(r);
  }
  for (const auto& r : ranges) {
    spans.clear();
    for (const LoraSegment& s : segments)
      if (s.column == r.first && s.column + s.expand.dim(1) == r.second) spans.emplace_back(s.begin, s.end);
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
      TESSERA_CHECK_LE(spans[i - 1].second, spans[i].first) << "lora_add: segments overlap";
  }
  if (segments.empty()) return;
  lora_add_impl(x, segments, out);
}

namespace {

// Whether the NVIDIA driver exposes any device to this process (/dev/nvidiactl or
// /dev/nvidia0..): a container or host without them has no GPU to use.
[[maybe_unused]] bool nvidia_device_nodes_present() {
  std::error_code ec;
  if (std::filesystem::exists("/dev/nvidiactl", ec)) return true;
  for (int i = 0; i < 16; ++i) {
    if (std::filesystem::exists("/dev/nvidia" + std::to_string(i), ec)) return true;
  }
  return false;
}

}  // namespace

StatusOr<std::unique_ptr<Backend>> make_backend(std::optional<BackendKind> kind, const BackendOptions& options) {
  auto cpu_backend = [&] {
    return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(options.num_threads, options.kernels.cpu));
  };
  if (kind == BackendKind::kCpu) return cpu_backend();
  const bool automatic = !kind.has_value();
  const char* name = backend_choice_name(kind);
#ifdef TESSERA_WITH_CUDA
  if (cuda::device_count() == 0) {
    // describe_device says why: no driver, driver too old, no device visible...
    std::string why = cuda::describe_device(0);
    const std::string prefix = "no CUDA device: ";
    if (why.rfind(prefix, 0) == 0) why = why.substr(prefix.size());
    if (!automatic) {
      return Status(StatusCode::kUnavailable, "backend 'cuda': no usable CUDA device (" + why + "); use --backend cpu");
    }
    // Without an NVIDIA device node the CUDA runtime's reason ("CUDA driver version is
    // insufficient" when no driver is installed at all) only misleads: the host has no GPU.
    if (!nvidia_device_nodes_present()) {
      TESSERA_LOG_INFO("backend auto: no GPU, using the CPU backend");
    } else {
      TESSERA_LOG_WARN("backend auto: a GPU is present but CUDA cannot use it ({}); using the CPU backend", why);
    }
    return cpu_backend();
  }
  const int index = std::max(0, options.device) % cuda::device_count();
  auto cuda_backend = CudaBackend::create(index, options.kernels.cuda_sync_every_launch);
  if (cuda_backend.is_ok()) {
    TESSERA_LOG_INFO("backend {}: CUDA on device {}: {}", name, index, cuda::describe_device(index));
    return cuda_backend;
  }
  if (!automatic) return cuda_backend.status();
  TESSERA_LOG_WARN("backend auto: {}; using the CPU backend", cuda_backend.status().to_string());
  return cpu_backend();
#else
  (void)name;
  if (automatic) {
    TESSERA_LOG_INFO("backend auto: this build has no CUDA support, using the CPU backend");
    return cpu_backend();
  }
  return unimplemented("backend 'cuda': this build has no CUDA support (configure with nvcc present "
                       "or -DTESSERA_CUDA=ON); use --backend cpu");
#endif
}

StatusOr<std::unique_ptr<Backend>> make_backend(const std::string& name, const BackendOptions& options) {
  std::optional<BackendKind> kind;
  if (!parse_backend_choice(name, &kind)) {
    return invalid_argument("unknown backend '" + name + "' (expected cpu, cuda or auto)");
  }
  return make_backend(kind, options);
}

StatusOr<std::unique_ptr<Backend>> make_backend(std::optional<BackendKind> kind, int num_threads, int device) {
  return make_backend(kind, BackendOptions{num_threads, device, KernelOptions{}});
}

StatusOr<std::unique_ptr<Backend>> make_backend(const std::string& name, int num_threads, int device) {
  return make_backend(name, BackendOptions{num_threads, device, KernelOptions{}});
}

BackendKind auto_backend_kind() {
#ifdef TESSERA_WITH_CUDA
  return cuda::device_count() > 0 ? BackendKind::kCuda : BackendKind::kCpu;
#else
  return BackendKind::kCpu;
#endif
}

}  // namespace tessera
