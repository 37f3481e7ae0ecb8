#pragma once
// The CPU backend: float32 compute over f32/f16/bf16 weights (bf16 weights in prefill and
// batched decode multiply bf16-rounded activations where the CPU has AVX512_BF16:
// CpuKernelOptions::bf16_dot, linear_cpu.h), threads through OpenMP.
// It is both the production path on machines without a GPU and the reference every other
// backend is tested against. Every kernel choice comes from the CpuKernelOptions it is made
// with (common/kernel_options.h), so backends with different options live side by side.
#include <memory>

#include "common/kernel_options.h"
#include "kernels/backend.h"
#include "kernels/cpu/buffer_pool.h"

namespace tessera {

class CpuBackend final : public Backend {
 public:
  // num_threads <= 0 keeps OpenMP's default (all cores, or OMP_NUM_THREADS). The OpenMP
  // pool is the process's: its size and pinning (options.pin_threads) are set for every
  // backend, by the last one made and the first one that pins.
  explicit CpuBackend(int num_threads = 0, const CpuKernelOptions& options = {});
  BackendKind kind() const override { return BackendKind::kCpu; }
  std::string name() const override { return "cpu"; }
  Tensor alloc(const std::vector<int64_t>& dims, DType dtype) override;
  Tensor alloc_persistent(const std::vector<int64_t>& dims, DType dtype) override;
  void bound_activation_memory(int64_t bytes) override;
  // The recycled activation buffers (their accounting, for tests and the plan's check).
  const cpu::BufferPool& activation_pool() const { return *pool_; }
  void copy_to_host(const TensorView& src, void* dst) override;
  void copy_from_host(const void* src, const TensorView& dst) override;
  Tensor place_weight(const Tensor& host) override;
  StatusOr<MemoryInfo> memory_info() const override;

  const CpuKernelOptions& kernel_options() const { return options_; }
  // Whether int8 linears should be loaded as panels for this backend (linear_int8_panels.h).
  bool prefers_int8_panels() const;
  // Whether coded bf16 weights decode on this CPU's fast kernel (linear_coded_bf16.h: AVX-512
  // BF16 with bf16 dot products on); elsewhere they decode a chunk at a time.
  bool codes_bf16_fast() const;

 protected:
  void embedding_impl(const TensorView& ids, const TensorView& table, const TensorView& out,
                      int64_t row_offset) override;
  void layer_norm_impl(const TensorView& x, const TensorView& gamma, const TensorView& beta, float eps,
                       const TensorView& out) override;
  void rms_norm_impl(const TensorView& x, const TensorView& gamma, float eps,
                     const TensorView& out) override;
  void residual_add_norm_impl(const TensorView& residual, const TensorView& delta,
                              const TensorView& gamma, const TensorView& beta, float eps, bool rms,
                              const TensorView& out) override;
  void linear_impl(const TensorView& x, const TensorView& w, const TensorView& bias,
                   const TensorView& out, Activation act) override;
  void linear_int8_impl(const TensorView& x, const TensorView& w, const TensorView& scales, const TensorView& bias,
                        const TensorView& out, Activation act) override;
  void embedding_coded_bf16_impl(const TensorView& ids, const TensorView& body, const TensorView& side,
                                 const TensorView& out, int64_t row_offset) override;
  void embedding_ggml_impl(const TensorView& ids, const TensorView& table, uint32_t ggml_type, const TensorView& out,
                           int64_t row_offset) override;
  void linear_coded_bf16_impl(const TensorView& x, const TensorView& body, const TensorView& side,
                              const TensorView& bias, const TensorView& out, Activation act) override;
  void linear_int4_impl(const TensorView& x, const TensorView& w, const TensorView& scales, const TensorView& bias,
                        const TensorView& out, Activation act) override;
  void activate_impl(const TensorView& x, Activation act) override;
  void gated_act_impl(const TensorView& gate, const TensorView& up, const TensorView& out,
                      Activation act) override;
  void add_impl(const TensorView& a, const TensorView& b, const TensorView& out) override;
  void scale_impl(const TensorView& x, float factor) override;
  void softcap_impl(const TensorView& x, float cap) override;
  void greedy_rows_impl(const TensorView& logits, const TensorView& ids, const TensorView& logprobs) override;
  void rejection_sample_rows_impl(const TensorView& p, const TensorView& q, const TensorView& proposals,
                                  const TensorView& uniforms, const TensorView& tokens,
                                  const TensorView& accepted) override;
  void rotary_impl(const TensorView& x, const TensorView& positions, const TensorView& inv_freq,
                   float magnitude) override;
  void head_rms_norm_impl(const TensorView& x, const TensorView& gamma, float eps) override;
  void write_kv_impl(const TensorView& k, const TensorView& v, const AttentionBatch& batch,
                     const TensorView& k_cache, const TensorView& v_cache) override;
  void attention_impl(const TensorView& q, const AttentionBatch& batch, const TensorView& k_cache,
                      const TensorView& v_cache, const AttentionParams& params,
                      const TensorView& out, const GqaLayout& gqa) override;
  void copy_block_impl(const TensorView& pool, int64_t src, int64_t dst) override;
  void moe_topk_impl(const TensorView& logits, int top_k, bool normalize, const TensorView& weights,
                     const TensorView& ids) override;
  void gather_rows_impl(const TensorView& x, const std::vector<int32_t>& rows,
                        const TensorView& out) override;
  void scatter_add_scaled_impl(const TensorView& x, const std::vector<int32_t>& rows,
                               const std::vector<float>& scale, const TensorView& out) override;
  // kernels/cpu/lora_cpu.cc
  void lora_add_impl(const TensorView& x, const std::vector<LoraSegment>& segments, const TensorView& out) override;

 private:
  // Activations are recycled between ops and steps instead of page-faulting fresh memory
  // every time (buffer_pool.h).
  std::shared_ptr<cpu::BufferPool> pool_ = cpu::BufferPool::create();
  CpuKernelOptions options_;
};

}  // namespace tessera
