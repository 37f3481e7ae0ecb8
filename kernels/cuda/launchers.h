#pragma once
// Host-callable launchers of the CUDA kernels, one section per .cu file. Plain C++17
// header: the stream is the runtime's opaque CUstream_st*, every pointer is device
// memory (the backend uploads host-side arguments before calling), every launch is
// enqueued on `stream` and returns at once. The caller checks cudaGetLastError().
// A launcher with no work (zero tokens or rows) enqueues nothing.
#include <cstdint>

#include "common/dtype.h"
#include "kernels/activation.h"
#include "kernels/int4_layout.h"

struct CUstream_st;

namespace tessera::cuda::launch {

using Stream = CUstream_st*;

// ---- embedding.cu ---------------------------------------------------------------------------
// out[t, :] = table[ids[t] - max(row_offset, 0), :] widened to f32. row_offset >= 0: ids
// outside the table give zero rows (vocabulary-parallel). row_offset < 0: an id outside
// the table gives a zero row and is reported through error_flag (a mapped host int[2]:
// [0] = 1, [1] = the id), which the backend checks at its next synchronisation.
void embedding(const int32_t* ids, int64_t tokens, const void* table, DType table_dtype, int64_t rows,
               int64_t hidden, int64_t row_offset, float* out, int* error_flag, Stream stream);
// Backend::embedding_ggml: the same of a table of `rows` rows of `row_bytes` bytes, each
// `hidden` elements in blocks of ggml type `ggml_type` (common/gguf/ggml_block_element.h).
void embedding_ggml(const int32_t* ids, int64_t tokens, const uint8_t* table, int64_t rows, int64_t row_bytes,
                    uint32_t ggml_type, int64_t hidden, int64_t row_offset, float* out, int* error_flag,
                    Stream stream);

// ---- norms.cu -------------------------------------------------------------------------------
// One block per row; statistics in double (as the CPU reference). delta != nullptr: fused
// residual add, x += delta first (x is written). beta == nullptr selects RMSNorm
// (out = gamma * (x * rsqrt(mean(x^2) + eps))), else LayerNorm. out may alias x.
void norm(float* x, const float* delta, const void* gamma, DType gamma_dtype, const void* beta,
          DType beta_dtype, float eps, int64_t rows, int64_t hidden, float* out, Stream stream);
// RMSNorm in place of every head vector x[t * row_stride + h * head_dim + 0 .. head_dim),
// one gamma [head_dim] for all heads; one block per (token, head), same arithmetic as norm.
void head_rms_norm(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t row_stride,
                   const void* gamma, DType gamma_dtype, float eps, Stream stream);

// ---- linear_int8.cu --------------------------------------------------------------------------
// Int8 weight-only linear (Backend::linear_int8): w int8 [N, K], scales f32 [N, K / group],
// group a multiple of 32. gemv: y[M, N] = act(x[M, K] · dequant(w)^T + bias) for
// M <= kInt8GemvMaxRows, x rows K apart (bias f32 or nullptr). dequantize: out[N, K] f32.
inline constexpr int kInt8GemvMaxRows = 8;
void linear_int8_gemv(const float* x, int64_t M, int64_t K, const int8_t* w, const float* scales, int64_t group,
                      int64_t N, const float* bias, float* y, Activation act, Stream stream);
void dequantize_int8(const int8_t* w, const float* scales, int64_t group, int64_t N, int64_t K, float* out,
                     Stream stream);

// ---- linear_int4.cu --------------------------------------------------------------------------
// 4-bit (and 6-bit) weight-only linear (Backend::linear_int4) on kernels/int4_layout.h's
// panels of `scheme`. gemv: y[M, N] = act(x[M, K] · dequant(w)^T + bias) for
// M <= kInt4GemvMaxRows (bias f32 or nullptr). dequantize: out[N, K] f32.
inline constexpr int kInt4GemvMaxRows = 8;
void linear_int4_gemv(const float* x, int64_t M, int64_t K, Int4Scheme scheme, const uint8_t* nibbles,
                      const uint8_t* scales, int64_t N, const float* bias, float* y, Activation act, Stream stream);
void dequantize_int4(Int4Scheme scheme, const uint8_t* nibbles, const uint8_t* scales, int64_t N, int64_t K,
                     float* out, Stream stream);

// ---- linear_coded_bf16.cu ----------------------------------------------------------------------
// Coded bf16 weights (Backend::linear_coded_bf16, kernels/coded_bf16_layout.h): body and side
// as laid out there. gemv: y[M, N] = act(x[M, K] · W^T + bias) for M <= kCodedBf16GemvMaxRows
// (bias f32 or nullptr). dequantize: out[N, K] f32, escapes included.
inline constexpr int kCodedBf16GemvMaxRows = 8;
void linear_coded_bf16_gemv(const float* x, int64_t M, int64_t K, const uint8_t* body, const int32_t* side,
                            int64_t side_elements, int64_t N, const float* bias, float* y, Activation act,
                            Stream stream);
void dequantize_coded_bf16(const uint8_t* body, const int32_t* side, int64_t side_elements, int64_t N, int64_t K,
                           float* out, Stream stream);
// Backend::embedding_coded_bf16: out[t, :] = row ids[t] (less row_offset when >= 0) of the
// coded table [rows, hidden], as launch::embedding does for a plain table (zeros for another
// rank's ids; an id outside the whole vocabulary sets error_flag).
void embedding_coded_bf16(const int32_t* ids, int64_t tokens, const uint8_t* body, const int32_t* side,
                          int64_t side_elements, int64_t rows, int64_t hidden, int64_t row_offset, float* out,
                          int* error_flag, Stream stream);

// ---- elementwise.cu -------------------------------------------------------------------------
// Activations are kernels/cpu/activations.h's formulas, in f32; kNone is the identity.
// out[i] = (dtype) in[i], round to nearest even (the f16/bf16 copy of a GEMM input).
void convert_from_f32(const float* in, void* out, DType out_dtype, int64_t n, Stream stream);
// GEMM epilogue on out[rows, cols]: += bias[col] (bias may be nullptr), then act.
void bias_act(float* out, int64_t rows, int64_t cols, const void* bias, DType bias_dtype, Activation act,
              Stream stream);
// x[i] = act(x[i]).
void activate(float* x, int64_t n, Activation act, Stream stream);
// out[t, i] = act(gate[t * in_stride + i]) * up[t * in_stride + i], out rows `width` apart.
void gated_act(const float* gate, const float* up, int64_t tokens, int64_t width, int64_t in_stride,
               float* out, Activation act, Stream stream);
void add(const float* a, const float* b, float* out, int64_t n, Stream stream);
// x[i] *= factor.
void scale(float* x, int64_t n, float factor, Stream stream);
// x[i] = cap * tanh(x[i] / cap).
void softcap(float* x, int64_t n, float cap, Stream stream);

// ---- greedy_rows.cu -------------------------------------------------------------------------
// Per row of logits [rows, vocab]: ids[r] = the highest logit's id (ties to the lowest),
// logprobs[r] = its log-softmax (Backend::greedy_rows).
void greedy_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, float* logprobs, Stream stream);

// ---- rejection_sample.cu --------------------------------------------------------------------
// Speculative sampling's check per row of p, q [rows, vocab] (Backend::rejection_sample_rows):
// uniforms [rows, 2] (53-bit integers) on the device.
void rejection_sample_rows(const float* p, const float* q, int64_t rows, int64_t vocab, const int32_t* proposals,
                           const int64_t* uniforms, int32_t* tokens, int32_t* accepted, Stream stream);

// ---- rotary.cu ------------------------------------------------------------------------------
// Rotate-half RoPE in place on x[t * row_stride + h * head_dim + i] over the first
// 2 * rot_half dims of each head (pairs i, i + rot_half); the rest are not touched.
// angle = positions[t] * inv_freq[i], inv_freq [rot_half] (the model's own table); cos and
// sin scaled by `magnitude` (1 for a pure rotation).
void rotary(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t row_stride,
            const int32_t* positions, const float* inv_freq, int64_t rot_half, float magnitude, Stream stream);

// ---- kv_cache.cu ----------------------------------------------------------------------------
// cache[slots[t] * width + i] = (cache dtype) k[t * row_stride + i] (and v), width =
// kv_heads * head_dim; slots were validated on the host.
void write_kv(const float* k, const float* v, int64_t tokens, int64_t row_stride, const int32_t* slots,
              int64_t width, void* k_cache, void* v_cache, DType cache_dtype, Stream stream);

// ---- attention.cu ---------------------------------------------------------------------------
constexpr int kMaxHeadDim = 256;

struct PagedAttentionArgs {
  const float* q = nullptr;  // rows q_row_stride floats apart, [tokens, q_heads, head_dim]
  int64_t q_row_stride = 0;
  int64_t q_heads = 0;
  int64_t tokens = 0;
  const int32_t* token_seq = nullptr;  // [tokens]: the sequence of each query row
  const int32_t* token_pos = nullptr;  // [tokens]: its position; keys first..pos are attended
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
  const void* k_cache = nullptr;  // [num_blocks, block_size, kv_heads, head_dim]
  const void* v_cache = nullptr;
  DType cache_dtype = DType::kF32;
  int64_t block_size = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;  // <= kMaxHeadDim
  // Scores as AttentionParams (kernels/backend.h) forms them: scale, then softcap > 0:
  // softcap * tanh(s / softcap), then ALiBi; window > 0: first = max(0, pos - window + 1),
  // else 0. Keys before `first` are never read (their table entries may be -1).
  float scale = 1.0f;
  float softcap = 0.0f;
  int32_t window = 0;
  const float* alibi_slopes = nullptr;  // [q_heads] or nullptr
  float* out = nullptr;                 // [tokens, q_heads * head_dim]
  // Query head h reads cached KV head (q_head_offset + h) / group - kv_head_offset.
  int64_t group = 1, q_head_offset = 0, kv_head_offset = 0;
};
// Prefill and decode rows alike: one block per (token, head), online softmax.
void paged_attention(const PagedAttentionArgs& args, Stream stream);

// ---- moe.cu ---------------------------------------------------------------------------------
// Softmax over experts, top-k (ties to the lower id), weights renormalised to sum 1 when
// `normalize`, else the softmax probabilities themselves.
void moe_topk(const float* logits, int64_t tokens, int64_t experts, int top_k, bool normalize, float* weights,
              int32_t* ids, Stream stream);
// out[i, :] = x[rows[i], :].
void gather_rows(const float* x, const int32_t* rows, int64_t n_rows, int64_t hidden, float* out,
                 Stream stream);
// out[rows[i], :] += scale[i] * x[i, :]. rows_unique: one thread per element; otherwise one
// thread per column walks i in order (repeated rows add up in the CPU's order).
void scatter_add_scaled(const float* x, const int32_t* rows, const float* scale, int64_t n_rows,
                        int64_t hidden, bool rows_unique, float* out, Stream stream);

// ---- lora.cu ---------------------------------------------------------------------------------
// One segment of Backend::lora_add: for each of `rows` rows (x and out advance by their
// strides), out += scale · (x · shrink) · expand; shrink [in, rank], expand [rank, n], both f32
// or (`bf16`) both bf16; rank floats of shared memory a block.
void lora_add_rows(const float* x, int64_t x_stride, const void* shrink, const void* expand, bool bf16, int64_t rank,
                   int64_t in, int64_t n, float scale, float* out, int64_t out_stride, int64_t rows, Stream stream);

}  // namespace tessera::cuda::launch
