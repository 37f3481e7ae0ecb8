#pragma once
// The op set every device implements. Each public method is a validated front (shapes and
// dtypes are checked once, here, for every backend); the `*_impl` virtuals are the device
// kernels. Activations are float32 [tokens, features]; weights may be f32, f16 or bf16.
// Views may be strided along dimension 0 (TensorView::row_stride) where an op says so (the
// q, k, v column slices of a fused QKV output); every other view must be contiguous.
//
// Attention works on a paged KV cache: every layer owns K and V pools shaped
// [num_blocks, block_size, kv_heads, head_dim] (f32, f16 or bf16), and each sequence of a ragged batch names
// its blocks in a block table (see AttentionBatch).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/kernel_options.h"
#include "common/parallel_roles.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/activation.h"
#include "kernels/int4_layout.h"

namespace tessera {

class WeightStager;

// What a backend's device has: free is what an allocation could still get now (CPU: the
// kernel's MemAvailable; CUDA: cudaMemGetInfo's free), total its whole memory.
struct MemoryInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

// Host-side description of one ragged batch, shared by all layers of a step.
struct AttentionBatch {
  int num_seqs() const { return static_cast<int>(context_lens.size()); }
  // [num_seqs + 1]: the new tokens of sequence s are rows query_start[s] .. query_start[s+1]-1.
  std::vector<int32_t> query_start;
  // [num_seqs]: tokens in the cache for s once this step's tokens are written (past + new).
  // The new tokens of s have positions context_len - n_new .. context_len - 1.
  std::vector<int32_t> context_lens;
  // [num_seqs * max_blocks_per_seq]: block ids of each sequence, row-major, padded with -1.
  std::vector<int32_t> block_tables;
  int max_blocks_per_seq = 0;
  // [num_tokens]: where each new token's K/V goes: block_id * block_size + offset.
  std::vector<int32_t> slot_mapping;
};

// Which cached KV head each query head reads (grouped-query attention). Global query head
// q_head_offset + h reads global KV head (q_head_offset + h) / group, stored in this cache at
// index (that - kv_head_offset). group 0 means q_heads / kv_heads with both offsets 0 (the
// whole model, or an even tensor-parallel split).
struct GqaLayout {
  int64_t group = 0;
  int64_t q_head_offset = 0;
  int64_t kv_head_offset = 0;
};

// How one layer's attention scores are formed, in this order: s = scale * q.k; with
// softcap > 0, s = softcap * tanh(s / softcap) (Gemma 2); + slope_h * key position with
// ALiBi; then the causal mask, narrowed to the last `window` keys when window > 0 (a query
// at position p sees keys p - window + 1 .. p: Mistral's and Gemma's sliding window).
struct AttentionParams {
  float scale = 1.0f;
  float softcap = 0.0f;
  int32_t window = 0;
  TensorView alibi_slopes;  // empty, or f32 [q_heads]
};

// One adapter's rows in Backend::lora_add: rows [begin, end) of x and out take the update
// scale · (x · shrink) · expand, shrink [in, r] (PEFT's lora_A transposed) and expand [r, out]
// (lora_B transposed), both float32 or both bfloat16 (widened to f32 as they are read),
// contiguous on the backend: laid out so that both products run along contiguous rows (the
// rank's r sums side by side, then out's columns side by side).
// The update lands in out's columns [column, column + expand.dim(1)): a packed projection's
// q, k and v parts (or gate and up) are segments of one call.
struct LoraSegment {
  int64_t begin = 0, end = 0;
  TensorView shrink, expand;
  float scale = 1.0f;
  int64_t column = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual std::string name() const = 0;
  // Where this backend's views must live (the fronts check every view against it).
  DeviceKind device() const { return kind() == BackendKind::kCuda ? DeviceKind::kCuda : DeviceKind::kCpu; }

  // Memory on this backend's device (zeroed): a step's activations and outputs.
  virtual Tensor alloc(const std::vector<int64_t>& dims, DType dtype) = 0;
  // Memory kept as long as the model (a KV cache pool), zeroed: on the CPU not drawn from the
  // recycled activation buffers, so that their limit (below) counts activations alone.
  virtual Tensor alloc_persistent(const std::vector<int64_t>& dims, DType dtype) { return alloc(dims, dtype); }
  // The activation memory the worker planned (worker/activation_memory.h; the KV pool was
  // sized beside it). The CPU backend keeps its recycled activation buffers within it. The
  // default ignores it: the CUDA backend's caching allocator gives its cached blocks back
  // when an allocation would otherwise fail instead.
  virtual void bound_activation_memory(int64_t /*bytes*/) {}
  // Where a parameter lives (ggml's buffer types): the loader hands every weight it read
  // (host memory: a mapped checkpoint or a converted copy) to place_weight once, at load
  // time, and ops receive the returned tensor from then on. CPU: `host` itself, no copy.
  // CUDA: uploaded once into the backend's weight memory; the returned tensor is device
  // memory that lives as long as the backend, and `host` may be freed. Ops never move
  // parameters themselves: one handed over in host memory is a loud error on CUDA.
  virtual Tensor place_weight(const Tensor& host) = 0;
  // Memory of this backend's device now (what a worker reports when it registers).
  virtual StatusOr<MemoryInfo> memory_info() const = 0;
  // Copies between host and this device; identical for the CPU backend.
  virtual void copy_to_host(const TensorView& src, void* dst) = 0;
  virtual void copy_from_host(const void* src, const TensorView& dst) = 0;
  // Host memory and device slots for weights streamed to this device beyond the weights'
  // memory budget (kernels/weight_stager.h). The CPU backend streams from a spill file
  // instead (worker/weight_residency.h); its stager (host slots, memcpy) runs the device
  // path's bookkeeping in tests.
  virtual StatusOr<std::unique_ptr<WeightStager>> make_weight_stager(size_t host_bytes, size_t slot_bytes, int slots);

  // out[t, :] = table[ids[t], :]. ids: i32 [T]; table [V, H]; out f32 [T, H].
  void embedding(const TensorView& ids, const TensorView& table, const TensorView& out);
  // Vocabulary-parallel form: the table holds rows [row_offset, row_offset + V) of the full
  // vocabulary; ids outside them give zero rows (another rank holds those).
  void embedding(const TensorView& ids, const TensorView& table, const TensorView& out, int64_t row_offset);
  // The same lookup in a coded bf16 table (kernels/coded_bf16_layout.h: body u8 [V,
  // coded_bf16_row_bytes(H)], side i32): a tied embedding whose LM head is coded. row_offset
  // -1: the whole vocabulary; else the vocabulary-parallel form above.
  void embedding_coded_bf16(const TensorView& ids, const TensorView& body, const TensorView& side,
                            const TensorView& out, int64_t row_offset = -1);
  // The same lookup in a table kept in ggml's quantized blocks (an untied GGUF embedding):
  // table u8 [V, H / block_elems * block_bytes], each row its blocks of `ggml_type` (q8_0,
  // q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K; common/gguf/ggml_block_element.h), decoded to
  // f32 as dequantize_ggml does. row_offset as for embedding_coded_bf16.
  void embedding_ggml(const TensorView& ids, const TensorView& table, uint32_t ggml_type, const TensorView& out,
                      int64_t row_offset = -1);
  // out = layer_norm(x) * gamma + beta over the last dim. x, out f32 [T, H].
  void layer_norm(const TensorView& x, const TensorView& gamma, const TensorView& beta, float eps,
                  const TensorView& out);
  // out = x / sqrt(mean(x^2) + eps) * gamma.
  void rms_norm(const TensorView& x, const TensorView& gamma, float eps, const TensorView& out);
  // Fused: residual += delta; out = norm(residual). beta empty selects RMSNorm.
  void residual_add_norm(const TensorView& residual, const TensorView& delta,
                         const TensorView& gamma, const TensorView& beta, float eps, bool rms,
                         const TensorView& out);
  // out[T, N] = x[T, K] · w[N, K]^T (+ bias[N]). bias may be empty.
  void linear(const TensorView& x, const TensorView& w, const TensorView& bias, const TensorView& out);
  // Fused: out = act(x · w^T + bias).
  void linear_act(const TensorView& x, const TensorView& w, const TensorView& bias, const TensorView& out,
                  Activation act);
  // Int8 weight-only: out = act(x · dequant(w)^T + bias), w int8 [N, K] with one f32 scale
  // per group of K / scales.dim(1) consecutive inputs of each row (scales f32 [N, groups];
  // docs/quantization.md). The group is a multiple of 32. The CPU backend also takes its
  // column panels (w 3-D, kernels/cpu/linear_int8_panels.h), which only it produces.
  void linear_int8(const TensorView& x, const TensorView& w, const TensorView& scales, const TensorView& bias,
                   const TensorView& out, Activation act = Activation::kNone);
  // Low-bit weight-only (4-, 5- and 6-bit): out = act(x · dequant(w)^T + bias), w the panels
  // of kernels/int4_layout.h (u8 [ceil(N / 32), K / 4, int4_step_bytes]) and scales their
  // records ([ceil(N / 32), K / unit, int4_record_elements] of int4_scales_dtype); the
  // scheme is read off the two (int4_scheme_of).
  void linear_int4(const TensorView& x, const TensorView& w, const TensorView& scales, const TensorView& bias,
                   const TensorView& out, Activation act = Activation::kNone);
  // Coded bf16 weights, lossless (kernels/coded_bf16_layout.h): out = act(x · W^T + bias), W
  // the [N, K] bf16 matrix held as body u8 [N, coded_bf16_row_bytes(K)] and side i32 (its
  // tables and escapes); K a multiple of 64.
  void linear_coded_bf16(const TensorView& x, const TensorView& body, const TensorView& side, const TensorView& bias,
                         const TensorView& out, Activation act = Activation::kNone);
  // In place: x = act(x).
  void activate(const TensorView& x, Activation act);
  // out[T, F] = act(gate[T, F]) * up[T, F] (SwiGLU with silu, GeGLU with a gelu). gate and
  // up may be strided, with the same row stride (two column slices of one buffer).
  void gated_act(const TensorView& gate, const TensorView& up, const TensorView& out, Activation act);
  // Fused form for a packed [T, 2F] gate|up buffer: gated_act on its two column halves.
  void gated_act_packed(const TensorView& gate_up, const TensorView& out, Activation act);
  // out = a + b (same shapes; out may alias a).
  void add(const TensorView& a, const TensorView& b, const TensorView& out);
  // In place: x *= factor (Gemma's embedding scale).
  void scale(const TensorView& x, float factor);
  // In place: x = cap * tanh(x / cap) (Gemma 2's final logit soft-capping).
  void softcap(const TensorView& x, float cap);
  // Greedy verification where the logits are: for each row of logits f32 [R, V] (contiguous),
  // the token a temperature-0 row with nothing adjusting its logits takes — the highest logit,
  // ties to the lowest id — into ids i32 [R], and its log-softmax (the logit less
  // max + log sum exp(logit - max), the sum in double) into logprobs f32 [R]; both on this
  // backend. What the host sampler gives such a row, so a greedy step (speculative
  // verification included) copies two numbers per row to the host instead of the vocabulary.
  void greedy_rows(const TensorView& logits, const TensorView& ids, const TensorView& logprobs);
  // Speculative sampling's check where the distributions are (worker/speculative_sampling.h):
  // for each row r, p f32 [R, V] the target's sampling weights and q f32 [R, V] the draft's
  // (any non-negative weights; each row is normalised by its sum, taken in double), the
  // proposal proposals[r] (i32 [R], drawn from q) is kept when u * q(x) < p(x), and otherwise
  // the row's token is drawn with v from the residual max(0, p - q), renormalised (from p
  // itself when rounding leaves no residual), walking the ids in order. uniforms: i64 [R, 2]
  // in host memory, each the 53-bit integer n of a uniform u = n / 2^53 — u then v; the
  // same draws give the same tokens on every backend (to the rounding of the sums). A proposal
  // outside the vocabulary is rejected. tokens
  // i32 [R] and accepted i32 [R] (1 kept, 0 not) on this backend.
  void rejection_sample_rows(const TensorView& p, const TensorView& q, const TensorView& proposals,
                             const TensorView& uniforms, const TensorView& tokens, const TensorView& accepted);
  // Rotary embedding (rotate-half convention), in place on x f32 [T, heads, head_dim], which
  // may be strided (q or k as a column slice of a packed qkv buffer, reshaped within its rows).
  // inv_freq: f32 [R/2] on this backend; the first R dims of each head are rotated
  // (pairs i, i + R/2) and the rest pass through (GPT-NeoX's partial rotary: R < head_dim).
  // positions: i32 [T] in host memory (DeviceKind::kCpu), whatever the backend.
  // magnitude scales cos and sin (LongRoPE's attention factor: the rotated dims grow by it, the
  // others do not); 1 leaves the rotation a pure rotation.
  void rotary(const TensorView& x, const TensorView& positions, const TensorView& inv_freq, float magnitude = 1.0f);
  // In place RMSNorm of every head of x f32 [T, heads, head_dim] (may be strided) with one
  // gamma [head_dim] for all heads (Qwen3's and Gemma 3's q/k norms).
  void head_rms_norm(const TensorView& x, const TensorView& gamma, float eps);
  // Writes each token's K and V rows (f32 [T, kv_heads, head_dim], may be strided, with the
  // same row stride) to their slots in the paged caches.
  void write_kv(const TensorView& k, const TensorView& v, const AttentionBatch& batch, const TensorView& k_cache,
                const TensorView& v_cache);
  // Causal attention of each new token over its sequence's cached keys. q is f32
  // [T, q_heads, head_dim] (may be strided); out is f32 [T, q_heads * head_dim], contiguous.
  // Blocks of a sequence that lie wholly outside every query's window are never read (the
  // scheduler may have freed them; their table entries may be -1).
  void attention(const TensorView& q, const AttentionBatch& batch, const TensorView& k_cache,
                 const TensorView& v_cache, const AttentionParams& params, const TensorView& out,
                 const GqaLayout& gqa = {});
  // pool[dst] = pool[src] along dimension 0 (a KV block, for copy-on-write).
  void copy_block(const TensorView& pool, int64_t src, int64_t dst);
  // Mixture-of-experts routing: softmax over experts, top-k (ties to the lower id), the k
  // weights renormalised to sum 1 when `normalize` (Mixtral, Qwen3-MoE) or left as the
  // softmax probabilities (Qwen2-MoE's norm_topk_prob false). logits f32 [T, E]; weights
  // f32 [T, k]; ids i32 [T, k].
  void moe_topk(const TensorView& logits, int top_k, bool normalize, const TensorView& weights,
                const TensorView& ids);
  // out[i, :] = x[rows[i], :].
  void gather_rows(const TensorView& x, const std::vector<int32_t>& rows, const TensorView& out);
  // out[rows[i], :] += scale[i] * x[i, :].
  void scatter_add_scaled(const TensorView& x, const std::vector<int32_t>& rows,
                          const std::vector<float>& scale, const TensorView& out);
  // LoRA adapters over a batch whose rows use different ones (segmented shrink and expand,
  // as Punica's SGMV): out[begin:end] += scale · (x[begin:end] · shrink) · expand for each segment.
  // x f32 [T, in] and out f32 [T, N] (either may be a strided view); each segment's update goes
  // to its column range of out; segments whose rows overlap must have disjoint column ranges
  // (ranges that are not the same must not overlap at all); in any order, each of its own rank;
  // what no segment covers is left as it is (the base model alone). The rank-r intermediate is
  // float32, each element the sum over the first half of the inputs plus the sum over the
  // second (each in input order); the expand sums over the rank in order; on every backend.
  void lora_add(const TensorView& x, const std::vector<LoraSegment>& segments, const TensorView& out);

 protected:
  // row_offset < 0: every id must be inside the table (the single-rank case).
  virtual void embedding_impl(const TensorView& ids, const TensorView& table, const TensorView& out,
                              int64_t row_offset) = 0;
  virtual void layer_norm_impl(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                               float eps, const TensorView& out) = 0;
  virtual void rms_norm_impl(const TensorView& x, const TensorView& gamma, float eps,
                             const TensorView& out) = 0;
  virtual void residual_add_norm_impl(const TensorView& residual, const TensorView& delta,
                                      const TensorView& gamma, const TensorView& beta, float eps,
                                      bool rms, const TensorView& out) = 0;
  virtual void linear_impl(const TensorView& x, const TensorView& w, const TensorView& bias,
                           const TensorView& out, Activation act) = 0;
  virtual void linear_int8_impl(const TensorView& x, const TensorView& w, const TensorView& scales,
                                const TensorView& bias, const TensorView& out, Activation act) = 0;
  virtual void linear_int4_impl(const TensorView& x, const TensorView& w, const TensorView& scales,
                                const TensorView& bias, const TensorView& out, Activation act) = 0;
  virtual void embedding_coded_bf16_impl(const TensorView& ids, const TensorView& body, const TensorView& side,
                                        const TensorView& out, int64_t row_offset) = 0;
  virtual void embedding_ggml_impl(const TensorView& ids, const TensorView& table, uint32_t ggml_type,
                                   const TensorView& out, int64_t row_offset) = 0;
  virtual void linear_coded_bf16_impl(const TensorView& x, const TensorView& body, const TensorView& side,
                                     const TensorView& bias, const TensorView& out, Activation act) = 0;
  virtual void activate_impl(const TensorView& x, Activation act) = 0;
  // gate and up share one row stride; out is contiguous.
  virtual void gated_act_impl(const TensorView& gate, const TensorView& up, const TensorView& out,
                              Activation act) = 0;
  virtual void add_impl(const TensorView& a, const TensorView& b, const TensorView& out) = 0;
  virtual void scale_impl(const TensorView& x, float factor) = 0;
  virtual void softcap_impl(const TensorView& x, float cap) = 0;
  virtual void greedy_rows_impl(const TensorView& logits, const TensorView& ids, const TensorView& logprobs) = 0;
  virtual void rejection_sample_rows_impl(const TensorView& p, const TensorView& q, const TensorView& proposals,
                                         const TensorView& uniforms, const TensorView& tokens,
                                         const TensorView& accepted) = 0;
  // x, q, k, v: 3-D [T, heads, head_dim], possibly strided along dimension 0.
  virtual void rotary_impl(const TensorView& x, const TensorView& positions, const TensorView& inv_freq,
                           float magnitude) = 0;
  virtual void head_rms_norm_impl(const TensorView& x, const TensorView& gamma, float eps) = 0;
  // k and v share one row stride.
  virtual void write_kv_impl(const TensorView& k, const TensorView& v, const AttentionBatch& batch,
                             const TensorView& k_cache, const TensorView& v_cache) = 0;
  // `gqa` is resolved: group > 0.
  virtual void attention_impl(const TensorView& q, const AttentionBatch& batch, const TensorView& k_cache,
                              const TensorView& v_cache, const AttentionParams& params,
                              const TensorView& out, const GqaLayout& gqa) = 0;
  virtual void copy_block_impl(const TensorView& pool, int64_t src, int64_t dst) = 0;
  virtual void moe_topk_impl(const TensorView& logits, int top_k, bool normalize, const TensorView& weights,
                             const TensorView& ids) = 0;
  virtual void gather_rows_impl(const TensorView& x, const std::vector<int32_t>& rows,
                                const TensorView& out) = 0;
  virtual void scatter_add_scaled_impl(const TensorView& x, const std::vector<int32_t>& rows,
                                       const std::vector<float>& scale, const TensorView& out) = 0;
  virtual void lora_add_impl(const TensorView& x, const std::vector<LoraSegment>& segments,
                             const TensorView& out) = 0;
};

// The panels' schemes (kernels/int4_layout.h) as tensors: the scales' dtype (f16 for the
// q4_0 / q5_0 / q4_1 / q5_1 styles, u8 for q4_K / q5_K, i8 for q6_K) and elements per record.
DType int4_scales_dtype(Int4Scheme scheme);
int64_t int4_record_elements(Int4Scheme scheme);
// The scheme of a linear_int4 weight from its panels' step size and its scales' dtype and
// record size; nullopt when they match none.
std::optional<Int4Scheme> int4_scheme_of(const TensorView& w, const TensorView& scales);

// Whether a linear weight and its second tensor are coded bf16 (Backend::linear_coded_bf16):
// a 2-D u8 body beside a 1-D i32 side tensor (int8 and 4-bit weights look otherwise).
inline bool is_coded_bf16(const TensorView& w, const TensorView& side) {
  return w.dtype == DType::kU8 && w.ndim == 2 && side.dtype == DType::kI32 && side.ndim == 1;
}

struct BackendOptions {
  int num_threads = 0;  // CPU threads; <= 0 keeps OpenMP's default (all cores, or OMP_NUM_THREADS)
  // The CUDA device, modulo the visible count (tensor-parallel rank r of one host passes r).
  int device = 0;
  // The kernels' choices, resolved once by the program (resolve_kernel_options,
  // common/kernel_options.h: the configuration's worker.cpu, then the environment).
  KernelOptions kernels;
};

// A CPU or CUDA backend; nullopt is "auto": CUDA when compiled in and a device is present
// (and it starts), else the CPU. Asking for CUDA in a build without it is a clear error,
// never a crash.
StatusOr<std::unique_ptr<Backend>> make_backend(std::optional<BackendKind> kind, const BackendOptions& options);
// The same by name: "cpu", "cuda" or "auto" (command-line flags); another name is an error.
StatusOr<std::unique_ptr<Backend>> make_backend(const std::string& name, const BackendOptions& options);
// With the kernels' default options, whatever the environment says (tests).
StatusOr<std::unique_ptr<Backend>> make_backend(std::optional<BackendKind> kind, int num_threads = 0, int device = 0);
StatusOr<std::unique_ptr<Backend>> make_backend(const std::string& name, int num_threads = 0, int device = 0);
// What "auto" will pick on this machine, without starting a backend: kCuda when the build
// has CUDA and a device is visible. (make_backend still falls back to the CPU when that
// device then fails to start.)
BackendKind auto_backend_kind();

}  // namespace tessera
