#pragma once
// The CUDA backend: every Backend op on one device and one stream. Plain C++ header (CUDA
// types are forward declared); callers normally see only kernels/backend.h and get this
// through make_backend("cuda" | "auto").
//
// Memory: Backend::alloc comes from a caching allocator (activations, KV pools, logits);
// parameters (weights, norm gammas, biases, the embedding table, rotary frequencies, ALiBi
// slopes) are uploaded once, at load time, by place_weight into a bump-allocated weight
// arena, and an op handed a parameter still in host memory fails loudly; the f16/bf16
// copy of a GEMM input lives in a workspace; host-side op arguments (batch metadata,
// positions, row lists) go through a pinned staging ring. Pointer arguments of the ops
// (q, k, v, rotary's and head_rms_norm's x, gated_act's gate and up) are device pointers.
//
// Synchronisation: every op is enqueued on the backend's stream and returns; copy_to_host
// and copy_from_host synchronise. Made with sync_every_launch (TESSERA_CUDA_SYNC=1,
// KernelOptions in common/kernel_options.h) it synchronises and checks after every launch
// (names the failing op).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"

struct CUstream_st;
struct cublasContext;

namespace tessera {
namespace cuda {
class CachingAllocator;
class DeviceArena;
class Workspace;
class StagingRing;
}  // namespace cuda

class CudaBackend final : public Backend {
 public:
  // Fails (as a Status) when the device cannot be used: no device, a driver error, cuBLAS
  // failing to initialise. sync_every_launch: synchronise and check after every launch
  // (debugging; KernelOptions::cuda_sync_every_launch).
  static StatusOr<std::unique_ptr<Backend>> create(int device = 0, bool sync_every_launch = false);
  ~CudaBackend() override;

  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string name() const override { return "cuda"; }
  Tensor alloc(const std::vector<int64_t>& dims, DType dtype) override;
  void copy_to_host(const TensorView& src, void* dst) override;
  void copy_from_host(const void* src, const TensorView& dst) override;
  Tensor place_weight(const Tensor& host) override;
  StatusOr<MemoryInfo> memory_info() const override;
  // Pinned host memory, device slots and a copy stream of their own (kernels/cuda/cuda_weight_stager.h).
  StatusOr<std::unique_ptr<WeightStager>> make_weight_stager(size_t host_bytes, size_t slot_bytes, int slots) override;

  // Waits for all queued work and checks for errors reported by kernels.
  void synchronize();

 protected:
  void embedding_impl(const TensorView& ids, const TensorView& table, const TensorView& out,
                      int64_t row_offset) override;
  void layer_norm_impl(const TensorView& x, const TensorView& gamma, const TensorView& beta, float eps,
                       const TensorView& out) override;
  void rms_norm_impl(const TensorView& x, const TensorView& gamma, float eps, const TensorView& out) override;
  void residual_add_norm_impl(const TensorView& residual, const TensorView& delta, const TensorView& gamma,
                              const TensorView& beta, float eps, bool rms, const TensorView& out) override;
  void linear_impl(const TensorView& x, const TensorView& w, const TensorView& bias, const TensorView& out,
                   Activation act) override;
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
  void gated_act_impl(const TensorView& gate, const TensorView& up, const TensorView& out, Activation act) override;
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
  void write_kv_impl(const TensorView& k, const TensorView& v, const AttentionBatch& batch, const TensorView& k_cache,
                     const TensorView& v_cache) override;
  void attention_impl(const TensorView& q, const AttentionBatch& batch, const TensorView& k_cache, const TensorView& v_cache, const AttentionParams& params,
                      const TensorView& out, const GqaLayout& gqa) override;
  void copy_block_impl(const TensorView& pool, int64_t src, int64_t dst) override;
  void moe_topk_impl(const TensorView& logits, int top_k, bool normalize, const TensorView& weights,
                     const TensorView& ids) override;
  void gather_rows_impl(const TensorView& x, const std::vector<int32_t>& rows, const TensorView& out) override;
  void scatter_add_scaled_impl(const TensorView& x, const std::vector<int32_t>& rows,
                               const std::vector<float>& scale, const TensorView& out) override;
  void lora_add_impl(const TensorView& x, const std::vector<LoraSegment>& segments, const TensorView& out) override;

 private:
  CudaBackend(int device, bool sync_every_launch);
  Status init();

  // After every launch: the launch error, and with sync_every_launch_ the kernel's own.
  void after_launch(const char* op);
  // linear_int8_impl's and linear_int4_impl's common path (cuda_backend.cc says how).
  void quantized_linear(const TensorView& x, const TensorView& bias, const TensorView& out, Activation act,
                        int64_t gemv_max_rows, const char* op, const std::function<void(Activation)>& gemv,
                        const std::function<void(float*)>& dequantize);
  // Fails loudly if a kernel reported a bad argument (e.g. a token id outside the vocabulary).
  void check_device_errors();

  int device_;
  CUstream_st* stream_ = nullptr;
  cublasContext* cublas_ = nullptr;
  bool sync_every_launch_ = false;
  int* error_flag_host_ = nullptr;    // mapped pinned int[2]
  int* error_flag_device_ = nullptr;  // its device address
  std::shared_ptr<cuda::CachingAllocator> allocator_;
  std::shared_ptr<cuda::DeviceArena> weights_;  // placed weights share it (place_weight)
  std::unique_ptr<cuda::Workspace> workspace_;
  std::unique_ptr<cuda::StagingRing> staging_;
};

}  // namespace tessera
