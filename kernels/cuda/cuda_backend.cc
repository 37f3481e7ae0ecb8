// Host side of the CUDA backend: memory, copies, argument upload and validation, cuBLAS
// GEMMs, and the launches of the kernels in kernels/cuda/*.cu.
#include "kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_weight_stager.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/launchers.h"

namespace tessera {
namespace {

TensorView with_data(const TensorView& t, void* data) {
  TensorView v = t;
  v.data = data;
  v.device = DeviceKind::kCuda;
  return v;
}

// Activations, caches and outputs must live on the device (Backend::alloc). Fails loudly
// instead of letting a kernel fault on a host address.
void require_device(std::initializer_list<std::pair<const TensorView*, const char*>> views, const char* op) {
  for (const auto& [v, what] : views) {
    TESSERA_CHECK(v->empty() || v->device == DeviceKind::kCuda)
        << op << ": " << what << " is host memory; the CUDA backend needs it on the device (Backend::alloc)";
  }
}

// Parameters (weights, biases, norm gammas, the embedding table, rotary frequencies, ALiBi
// slopes) must have been placed on the device at load time (Backend::place_weight).
void require_placed(std::initializer_list<std::pair<const TensorView*, const char*>> views, const char* op) {
  for (const auto& [v, what] : views) {
    TESSERA_CHECK(v->empty() || v->device == DeviceKind::kCuda)
        << op << ": " << what
        << " is host memory; parameters must be placed on the device at load time (Backend::place_weight)";
  }
}

int checked_int(int64_t v, const char* what) {
  TESSERA_CHECK(v >= 0 && v <= INT_MAX) << what << " = " << v << " does not fit cuBLAS's int";
  return static_cast<int>(v);
}

}  // namespace

CudaBackend::CudaBackend(int device, bool sync_every_launch) : device_(device), sync_every_launch_(sync_every_launch) {}

StatusOr<std::unique_ptr<Backend>> CudaBackend::create(int device, bool sync_every_launch) {
  std::unique_ptr<CudaBackend> b(new CudaBackend(device, sync_every_launch));
  Status st = b->init();
  if (!st.is_ok()) return st.with_context("backend 'cuda' on device " + std::to_string(device));
  return std::unique_ptr<Backend>(std::move(b));
}

Status CudaBackend::init() {
  TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  cudaStream_t stream = nullptr;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
  TESSERA_ASSIGN_OR_RETURN(const cuda::CublasLibrary* blas, cuda::load_cublas());
  cublasHandle_t handle = nullptr;
  TESSERA_CUBLAS_RETURN_IF_ERROR(blas->create(&handle));
  cublas_ = handle;
  TESSERA_CUBLAS_RETURN_IF_ERROR(blas->set_stream(handle, stream_));
  // No TF32: f32 weights must match the CPU backend to ~1e-5 relative.
  TESSERA_CUBLAS_RETURN_IF_ERROR(blas->set_math_mode(handle, CUBLAS_DEFAULT_MATH));
  void* flag = nullptr;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&flag, 2 * sizeof(int), cudaHostAllocMapped));
  error_flag_host_ = static_cast<int*>(flag);
  error_flag_host_[0] = error_flag_host_[1] = 0;
  void* flag_dev = nullptr;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&flag_dev, flag, 0));
  error_flag_device_ = static_cast<int*>(flag_dev);
  allocator_ = std::make_shared<cuda::CachingAllocator>();
  weights_ = std::make_shared<cuda::DeviceArena>();
  workspace_ = std::make_unique<cuda::Workspace>();
  staging_ = std::make_unique<cuda::StagingRing>();
  return Status::ok();
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  staging_.reset();
  workspace_.reset();
  weights_.reset();    // placed weights still alive keep the arena until they go
  allocator_.reset();  // tensors still alive keep it (and their blocks) until they go
  if (cublas_ != nullptr) cuda::cublas().destroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (error_flag_host_ != nullptr) cudaFreeHost(error_flag_host_);
}

// ---- memory and copies ---------------------------------------------------------------------

Tensor CudaBackend::alloc(const std::vector<int64_t>& dims, DType dtype) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  void* p = allocator_->allocate(bytes);
  if (bytes > 0) TESSERA_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  std::shared_ptr<cuda::CachingAllocator> owner = allocator_;
  std::shared_ptr<void> keep(p, [owner](void* q) { owner->release(q); });
  return Tensor::borrowed(TensorView(p, dtype, dims, DeviceKind::kCuda), std::move(keep));
}

void CudaBackend::copy_to_host(const TensorView& src, void* dst) {
  TESSERA_CHECK(src.contiguous()) << "copy_to_host: " << src.shape_string() << " is strided, not one block of bytes";
  if (src.nbytes() > 0) TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDefault, stream_));
  synchronize();
}

void CudaBackend::copy_from_host(const void* src, const TensorView& dst) {
  TESSERA_CHECK(dst.contiguous()) << "copy_from_host: " << dst.shape_string() << " is strided, not one block of bytes";
  if (dst.nbytes() > 0) TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyDefault, stream_));
  // The caller may reuse `src` at once. (Pageable sources are staged before the call
  // returns anyway; the sync keeps that true for pinned ones too.)
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::synchronize() {
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  check_device_errors();
}

void CudaBackend::check_device_errors() {
  const volatile int* flag = error_flag_host_;
  TESSERA_CHECK(flag[0] == 0) << "embedding: token id " << flag[1]
                              << " is outside the vocabulary table (reported by the CUDA kernel)";
}

void CudaBackend::after_launch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    ::tessera::detail::CheckFailure(__FILE__, __LINE__, op).stream()
        << "CUDA kernel launch failed: " << cuda::describe_cuda_error(err);
  }
  if (sync_every_launch_) {
    const cudaError_t run = cudaStreamSynchronize(stream_);
    if (run != cudaSuccess) {
      ::tessera::detail::CheckFailure(__FILE__, __LINE__, op).stream()
          << "CUDA kernel failed (TESSERA_CUDA_SYNC=1): " << cuda::describe_cuda_error(run);
    }
    check_device_errors();
  }
}

Tensor CudaBackend::place_weight(const Tensor& host) {
  const TensorView v = host.view();
  if (v.empty() || v.device == DeviceKind::kCuda) return host;  // nothing to move, or already placed
  // One upload per weight, at load time, into the bump-allocated weight arena (weights are
  // never freed one by one). The copy is finished before returning, so the caller may free
  // or reuse `host` (a converted copy, a mapped checkpoint page) at once.
  const size_t bytes = v.nbytes();
  void* d = weights_->allocate(bytes);
  if (bytes > 0) {
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(d, v.data, bytes, cudaMemcpyHostToDevice, stream_));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  std::shared_ptr<const void> arena = weights_;  // the arena outlives every weight placed in it
  return Tensor::borrowed(with_data(v, d), std::move(arena));
}

StatusOr<std::unique_ptr<WeightStager>> CudaBackend::make_weight_stager(size_t host_bytes, size_t slot_bytes,
                                                                         int slots) {
  return cuda::make_cuda_weight_stager(device_, stream_, host_bytes, slot_bytes, slots);
}

StatusOr<MemoryInfo> CudaBackend::memory_info() const {
  size_t free_bytes = 0, total_bytes = 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return MemoryInfo{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

// ---- ops -----------------------------------------------------------------------------------

void CudaBackend::embedding_impl(const TensorView& ids, const TensorView& table, const TensorView& out,
                                 int64_t row_offset) {
  require_device({{&ids, "ids"}, {&out, "out"}}, "embedding");
  require_placed({{&table, "table"}}, "embedding");
  const TensorView& tab = table;
  cuda::launch::embedding(ids.as<int32_t>(), ids.dim(0), tab.data, tab.dtype, tab.dim(0), tab.dim(1), row_offset,
                          out.as<float>(), error_flag_device_, stream_);
  after_launch("embedding");
}

void CudaBackend::embedding_coded_bf16_impl(const TensorView& ids, const TensorView& body, const TensorView& side,
                                            const TensorView& out, int64_t row_offset) {
  require_device({{&ids, "ids"}, {&out, "out"}}, "embedding_coded_bf16");
  require_placed({{&body, "body"}, {&side, "side"}}, "embedding_coded_bf16");
  cuda::launch::embedding_coded_bf16(ids.as<int32_t>(), ids.dim(0), body.as<uint8_t>(), side.as<int32_t>(),
                                     side.dim(0), body.dim(0), out.dim(1), row_offset, out.as<float>(),
                                     error_flag_device_, stream_);
  after_launch("embedding_coded_bf16");
}

void CudaBackend::embedding_ggml_impl(const TensorView& ids, const TensorView& table, uint32_t ggml_type,
                                      const TensorView& out, int64_t row_offset) {
  require_device({{&ids, "ids"}, {&out, "out"}}, "embedding_ggml");
  require_placed({{&table, "table"}}, "embedding_ggml");
  cuda::launch::embedding_ggml(ids.as<int32_t>(), ids.dim(0), table.as<uint8_t>(), table.dim(0), table.dim(1),
                               ggml_type, out.dim(1), row_offset, out.as<float>(), error_flag_device_, stream_);
  after_launch("embedding_ggml");
}

void CudaBackend::layer_norm_impl(const TensorView& x, const TensorView& gamma, const TensorView& beta, float eps,
                                  const TensorView& out) {
  require_device({{&x, "x"}, {&out, "out"}}, "layer_norm");
  require_placed({{&gamma, "gamma"}, {&beta, "beta"}}, "layer_norm");
  const TensorView &g = gamma, &b = beta;
  cuda::launch::norm(x.as<float>(), nullptr, g.data, g.dtype, b.data, b.dtype, eps, x.dim(0), x.dim(1),
                     out.as<float>(), stream_);
  after_launch("layer_norm");
}

void CudaBackend::rms_norm_impl(const TensorView& x, const TensorView& gamma, float eps, const TensorView& out) {
  require_device({{&x, "x"}, {&out, "out"}}, "rms_norm");
  require_placed({{&gamma, "gamma"}}, "rms_norm");
  const TensorView& g = gamma;
  cuda::launch::norm(x.as<float>(), nullptr, g.data, g.dtype, nullptr, DType::kF32, eps, x.dim(0), x.dim(1),
                     out.as<float>(), stream_);
  after_launch("rms_norm");
}

void CudaBackend::residual_add_norm_impl(const TensorView& residual, const TensorView& delta,
                                         const TensorView& gamma, const TensorView& beta, float eps, bool rms,
                                         const TensorView& out) {
  require_device({{&residual, "residual"}, {&delta, "delta"}, {&out, "out"}}, "residual_add_norm");
  const TensorView b = rms ? TensorView() : beta;
  require_placed({{&gamma, "gamma"}, {&b, "beta"}}, "residual_add_norm");
  const TensorView& g = gamma;
  cuda::launch::norm(residual.as<float>(), delta.as<float>(), g.data, g.dtype, b.data, b.dtype, eps,
                     residual.dim(0), residual.dim(1), out.as<float>(), stream_);
  after_launch("residual_add_norm");
}

void CudaBackend::linear_impl(const TensorView& x, const TensorView& w, const TensorView& bias,
                              const TensorView& out, Activation act) {
  require_device({{&x, "x"}, {&out, "out"}}, "linear");
  require_placed({{&w, "w"}, {&bias, "bias"}}, "linear");
  const TensorView &wd = w, &bd = bias;
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
  if (M == 0 || N == 0) return;
  float* y = out.as<float>();
  if (K == 0) {
    TESSERA_CUDA_CHECK(cudaMemsetAsync(y, 0, static_cast<size_t>(M * N) * sizeof(float), stream_));
  } else {
    // Row-major y[M, N] = x[M, K] · w[N, K]^T is, column-major, y^T = w^T · x^T: cuBLAS
    // sees w as K x N (op T) and x as K x M (op N), both with leading dimension K.
    const float alpha = 1.0f, beta = 0.0f;
    cublasHandle_t h = cublas_;
    const cuda::CublasLibrary& blas = cuda::cublas();
    if (w.dtype == DType::kF32) {
      // CUBLAS_COMPUTE_32F with the default math mode: plain f32, never TF32.
      TESSERA_CUBLAS_CHECK(blas.gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, checked_int(N, "N"), checked_int(M, "M"),
                                        checked_int(K, "K"), &alpha, wd.data, CUDA_R_32F, static_cast<int>(K),
                                        x.data, CUDA_R_32F, static_cast<int>(K), &beta, y, CUDA_R_32F,
                                        static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
      // f16/bf16 weights: x is rounded to the weight dtype in the workspace (the tensor-core
      // path), products accumulated in f32. This rounding of x is the one difference from
      // the CPU backend, which widens the weights instead; see cuda_backend_test.cc.
      const cudaDataType_t type = w.dtype == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
      void* xh = workspace_->get(static_cast<size_t>(M * K) * 2, stream_);
      cuda::launch::convert_from_f32(x.as<float>(), xh, w.dtype, M * K, stream_);
      after_launch("linear (convert input)");
      TESSERA_CUBLAS_CHECK(blas.gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, checked_int(N, "N"), checked_int(M, "M"),
                                        checked_int(K, "K"), &alpha, wd.data, type, static_cast<int>(K), xh, type,
                                        static_cast<int>(K), &beta, y, CUDA_R_32F, static_cast<int>(N),
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    if (sync_every_launch_) after_launch("linear (cuBLAS)");
  }
  cuda::launch::bias_act(y, M, N, bd.empty() ? nullptr : bd.data, bd.dtype, act, stream_);
  after_launch("linear (bias/activation epilogue)");
}

// The quantized linears' one shape: for decode-sized M (up to gemv_max_rows) `gemv(act)`
// writes y, applying `act` itself when there is no bias; above it `dequantize(wf)` fills the
// workspace with the weights as f32 [N, K] for cuBLAS's f32 GEMM (as linear_impl's f32 case);
// then the bias/activation epilogue, which handles every bias dtype.
void CudaBackend::quantized_linear(const TensorView& x, const TensorView& bias, const TensorView& out, Activation act,
                                   int64_t gemv_max_rows, const char* op,
                                   const std::function<void(Activation)>& gemv,
                                   const std::function<void(float*)>& dequantize) {
  const int64_t M = x.dim(0), K = x.dim(1), N = out.dim(1);
  if (M == 0 || N == 0) return;
  float* y = out.as<float>();
  const std::string name(op);
  if (M <= gemv_max_rows) {
    gemv(bias.empty() ? act : Activation::kNone);
    after_launch((name + " (gemv)").c_str());
    if (bias.empty()) return;
  } else {
    float* wf = static_cast<float*>(workspace_->get(static_cast<size_t>(N * K) * sizeof(float), stream_));
    dequantize(wf);
    after_launch((name + " (dequantize)").c_str());
    const float alpha = 1.0f, beta = 0.0f;
    const cuda::CublasLibrary& blas = cuda::cublas();
    TESSERA_CUBLAS_CHECK(blas.gemm_ex(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, checked_int(N, "N"), checked_int(M, "M"),
                                      checked_int(K, "K"), &alpha, wf, CUDA_R_32F, static_cast<int>(K), x.data,
                                      CUDA_R_32F, static_cast<int>(K), &beta, y, CUDA_R_32F, static_cast<int>(N),
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (sync_every_launch_) after_launch((name + " (cuBLAS)").c_str());
  }
  cuda::launch::bias_act(y, M, N, bias.empty() ? nullptr : bias.data, bias.dtype, act, stream_);
  after_launch((name + " (bias/activation epilogue)").c_str());
}

// Int8 weights (kernels/cuda/linear_int8.cu), row-major.
void CudaBackend::linear_int8_impl(const TensorView& x, const TensorView& w, const TensorView& scales,
                                   const TensorView& bias, const TensorView& out, Activation act) {
  require_device({{&x, "x"}, {&out, "out"}}, "linear_int8");
  require_placed({{&w, "w"}, {&scales, "scales"}, {&bias, "bias"}}, "linear_int8");
  // Int8 panels are the CPU backend's layout; the loader stores rows for this backend.
  TESSERA_CHECK(w.ndim == 2) << "linear_int8: the CUDA backend takes row-major int8 weights, got " << w.shape_string();
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0), group = K / scales.dim(1);
  quantized_linear(
      x, bias, out, act, cuda::launch::kInt8GemvMaxRows, "linear_int8",
      [&](Activation a) {
        cuda::launch::linear_int8_gemv(x.as<float>(), M, K, w.as<int8_t>(), scales.as<float>(), group, N, nullptr,
                                       out.as<float>(), a, stream_);
      },
      [&](float* wf) { cuda::launch::dequantize_int8(w.as<int8_t>(), scales.as<float>(), group, N, K, wf, stream_); });
}

// 4-bit and 6-bit panels (kernels/cuda/linear_int4.cu), the CPU's layout.
void CudaBackend::linear_int4_impl(const TensorView& x, const TensorView& w, const TensorView& scales,
                                   const TensorView& bias, const TensorView& out, Activation act) {
  require_device({{&x, "x"}, {&out, "out"}}, "linear_int4");
  require_placed({{&w, "w"}, {&scales, "scales"}, {&bias, "bias"}}, "linear_int4");
  const int64_t M = x.dim(0), K = x.dim(1), N = out.dim(1);
  const Int4Scheme scheme = *int4_scheme_of(w, scales);  // checked by the front
  quantized_linear(
      x, bias, out, act, cuda::launch::kInt4GemvMaxRows, "linear_int4",
      [&](Activation a) {
        cuda::launch::linear_int4_gemv(x.as<float>(), M, K, scheme, w.as<uint8_t>(), scales.as<uint8_t>(), N,
                                       nullptr, out.as<float>(), a, stream_);
      },
      [&](float* wf) {
        cuda::launch::dequantize_int4(scheme, w.as<uint8_t>(), scales.as<uint8_t>(), N, K, wf, stream_);
      });
}

// Coded bf16 weights (kernels/cuda/linear_coded_bf16.cu).
void CudaBackend::linear_coded_bf16_impl(const TensorView& x, const TensorView& body, const TensorView& side,
                                         const TensorView& bias, const TensorView& out, Activation act) {
  require_device({{&x, "x"}, {&out, "out"}}, "linear_coded_bf16");
  require_placed({{&body, "body"}, {&side, "side"}, {&bias, "bias"}}, "linear_coded_bf16");
  const int64_t M = x.dim(0), K = x.dim(1), N = out.dim(1), side_elements = side.dim(0);
  quantized_linear(
      x, bias, out, act, cuda::launch::kCodedBf16GemvMaxRows, "linear_coded_bf16",
      [&](Activation a) {
        cuda::launch::linear_coded_bf16_gemv(x.as<float>(), M, K, body.as<uint8_t>(), side.as<int32_t>(),
                                             side_elements, N, nullptr, out.as<float>(), a, stream_);
      },
      [&](float* wf) {
        cuda::launch::dequantize_coded_bf16(body.as<uint8_t>(), side.as<int32_t>(), side_elements, N, K, wf, stream_);
      });
}

void CudaBackend::activate_impl(const TensorView& x, Activation act) {
  require_device({{&x, "x"}}, "activate");
  cuda::launch::activate(x.as<float>(), x.numel(), act, stream_);
  after_launch("activate");
}

void CudaBackend::gated_act_impl(const TensorView& gate, const TensorView& up, const TensorView& out,
                                 Activation act) {
  require_device({{&gate, "gate"}, {&up, "up"}, {&out, "out"}}, "gated_act");
  cuda::launch::gated_act(gate.as<float>(), up.as<float>(), gate.dim(0), gate.dim(1), gate.row_stride(),
                          out.as<float>(), act, stream_);
  after_launch("gated_act");
}

void CudaBackend::add_impl(const TensorView& a, const TensorView& b, const TensorView& out) {
  require_device({{&a, "a"}, {&b, "b"}, {&out, "out"}}, "add");
  cuda::launch::add(a.as<float>(), b.as<float>(), out.as<float>(), a.numel(), stream_);
  after_launch("add");
}

void CudaBackend::scale_impl(const TensorView& x, float factor) {
  require_device({{&x, "x"}}, "scale");
  cuda::launch::scale(x.as<float>(), x.numel(), factor, stream_);
  after_launch("scale");
}

void CudaBackend::greedy_rows_impl(const TensorView& logits, const TensorView& ids, const TensorView& logprobs) {
  require_device({{&logits, "logits"}, {&ids, "ids"}, {&logprobs, "logprobs"}}, "greedy_rows");
  cuda::launch::greedy_rows(logits.as<float>(), logits.dim(0), logits.dim(1), ids.as<int32_t>(), logprobs.as<float>(),
                            stream_);
  after_launch("greedy_rows");
}

void CudaBackend::rejection_sample_rows_impl(const TensorView& p, const TensorView& q, const TensorView& proposals,
                                             const TensorView& uniforms, const TensorView& tokens,
                                             const TensorView& accepted) {
  require_device({{&p, "p"}, {&q, "q"}, {&proposals, "proposals"}, {&tokens, "tokens"}, {&accepted, "accepted"}},
                 "rejection_sample_rows");
  const int64_t rows = p.dim(0);
  // `uniforms` is host memory (the interface's contract), uploaded like rotary's positions.
  const std::vector<const void*> dev =
      staging_->upload({{uniforms.data, static_cast<size_t>(2 * rows) * sizeof(int64_t)}}, stream_);
  cuda::launch::rejection_sample_rows(p.as<float>(), q.as<float>(), rows, p.dim(1), proposals.as<int32_t>(),
                                      static_cast<const int64_t*>(dev[0]), tokens.as<int32_t>(),
                                      accepted.as<int32_t>(), stream_);
  after_launch("rejection_sample_rows");
}

void CudaBackend::softcap_impl(const TensorView& x, float cap) {
  require_device({{&x, "x"}}, "softcap");
  cuda::launch::softcap(x.as<float>(), x.numel(), cap, stream_);
  after_launch("softcap");
}

void CudaBackend::rotary_impl(const TensorView& x, const TensorView& positions, const TensorView& inv_freq,
                              float magnitude) {
  require_device({{&x, "x"}}, "rotary");
  const int64_t tokens = x.dim(0), heads = x.dim(1);
  if (tokens == 0 || heads == 0) return;
  // The model's own inv_freq table, placed at load like a weight, so both backends rotate
  // by the same f32 frequencies.
  require_placed({{&inv_freq, "inv_freq"}}, "rotary");
  const TensorView& freq = inv_freq;
  // `positions` is host memory (the interface's contract). Uploaded per call for now;
  // caching a step's metadata once for all layers is a later optimisation.
  const std::vector<const void*> dev =
      staging_->upload({{positions.data, static_cast<size_t>(tokens) * sizeof(int32_t)}}, stream_);
  cuda::launch::rotary(x.as<float>(), tokens, heads, x.dim(2), x.row_stride(), static_cast<const int32_t*>(dev[0]),
                       freq.as<float>(), freq.numel(), magnitude, stream_);
  after_launch("rotary");
}

void CudaBackend::head_rms_norm_impl(const TensorView& x, const TensorView& gamma, float eps) {
  require_device({{&x, "x"}}, "head_rms_norm");
  require_placed({{&gamma, "gamma"}}, "head_rms_norm");
  const TensorView& g = gamma;
  cuda::launch::head_rms_norm(x.as<float>(), x.dim(0), x.dim(1), x.dim(2), x.row_stride(), g.data, g.dtype, eps,
                              stream_);
  after_launch("head_rms_norm");
}

void CudaBackend::write_kv_impl(const TensorView& k, const TensorView& v, const AttentionBatch& batch,
                                const TensorView& k_cache, const TensorView& v_cache) {
  require_device({{&k, "k"}, {&v, "v"}, {&k_cache, "k_cache"}, {&v_cache, "v_cache"}}, "write_kv");
  const int64_t tokens = k.dim(0);
  if (tokens == 0) return;
  const int64_t width = k_cache.dim(2) * k_cache.dim(3);
  const int64_t slots = k_cache.dim(0) * k_cache.dim(1);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = batch.slot_mapping[t];
    TESSERA_CHECK(slot >= 0 && slot < slots) << "slot " << slot;
  }
  const std::vector<const void*> dev =
      staging_->upload({{batch.slot_mapping.data(), static_cast<size_t>(tokens) * sizeof(int32_t)}}, stream_);
  cuda::launch::write_kv(k.as<float>(), v.as<float>(), tokens, k.row_stride(), static_cast<const int32_t*>(dev[0]),
                         width, k_cache.data,
                         v_cache.data, k_cache.dtype, stream_);
  after_launch("write_kv");
}

void CudaBackend::attention_impl(const TensorView& q, const AttentionBatch& batch, const TensorView& k_cache,
                                 const TensorView& v_cache, const AttentionParams& params, const TensorView& out,
                                 const GqaLayout& gqa) {
  require_device({{&q, "q"}, {&k_cache, "k_cache"}, {&v_cache, "v_cache"}, {&out, "out"}}, "attention");
  const int64_t tokens = out.dim(0);
  if (tokens == 0) return;
  const int64_t num_blocks = k_cache.dim(0), block_size = k_cache.dim(1), head_dim = k_cache.dim(3);
  TESSERA_CHECK_LE(head_dim, cuda::launch::kMaxHeadDim) << "the CUDA attention kernel supports head_dim up to "
                                                         << cuda::launch::kMaxHeadDim;
  // Per-row sequence and position, and a check of every block a row will read (the
  // kernel trusts them). With a sliding window that is only the blocks from the first
  // new token's first key on: the earlier ones may be freed (-1). Built and uploaded per
  // call, i.e. per layer; doing it once per step is a later optimisation.
  std::vector<int32_t> token_seq(tokens), token_pos(tokens);
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const int32_t begin = batch.query_start[s], end = batch.query_start[s + 1];
    const int32_t n_new = end - begin, ctx = batch.context_lens[s];
    TESSERA_CHECK(n_new >= 0 && ctx >= n_new) << "sequence " << s << ": " << n_new << " new tokens, context " << ctx;
    const int64_t blocks = (ctx + block_size - 1) / block_size;
    TESSERA_CHECK_LE(blocks, batch.max_blocks_per_seq) << "sequence " << s;
    // The earliest key any row of s reads: that of its first new token (position ctx - n_new).
    const int64_t first_key = params.window > 0 ? std::max<int64_t>(0, ctx - n_new - params.window + 1) : 0;
    for (int64_t b = first_key / block_size; b < (n_new > 0 ? blocks : 0); ++b) {
      const int32_t id = batch.block_tables[static_cast<int64_t>(s) * batch.max_blocks_per_seq + b];
      TESSERA_CHECK(id >= 0 && id < num_blocks) << "sequence " << s << " block " << b << " is " << id;
    }
    for (int32_t t = begin; t < end; ++t) {
      token_seq[t] = s;
      token_pos[t] = ctx - n_new + (t - begin);
    }
  }
  const size_t table_bytes = batch.block_tables.size() * sizeof(int32_t);
  const std::vector<const void*> dev = staging_->upload({{token_seq.data(), token_seq.size() * sizeof(int32_t)},
                                                         {token_pos.data(), token_pos.size() * sizeof(int32_t)},
                                                         {batch.block_tables.data(), table_bytes}},
                                                        stream_);
  require_placed({{&params.alibi_slopes, "alibi_slopes"}}, "attention");
  const TensorView& slopes = params.alibi_slopes;
  cuda::launch::PagedAttentionArgs a;
  a.q = q.as<float>();
  a.q_row_stride = q.row_stride();
  a.q_heads = q.dim(1);
  a.tokens = tokens;
  a.token_seq = static_cast<const int32_t*>(dev[0]);
  a.token_pos = static_cast<const int32_t*>(dev[1]);
  a.block_tables = static_cast<const int32_t*>(dev[2]);
  a.max_blocks_per_seq = batch.max_blocks_per_seq;
  a.k_cache = k_cache.data;
  a.v_cache = v_cache.data;
  a.cache_dtype = k_cache.dtype;
  a.block_size = block_size;
  a.kv_heads = k_cache.dim(2);
  a.head_dim = head_dim;
  a.scale = params.scale;
  a.softcap = params.softcap;
  a.window = params.window;
  a.alibi_slopes = slopes.empty() ? nullptr : slopes.as<float>();
  a.out = out.as<float>();
  a.group = gqa.group;
  a.q_head_offset = gqa.q_head_offset;
  a.kv_head_offset = gqa.kv_head_offset;
  cuda::launch::paged_attention(a, stream_);
  after_launch("attention");
}

void CudaBackend::copy_block_impl(const TensorView& pool, int64_t src, int64_t dst) {
  require_device({{&pool, "pool"}}, "copy_block");
  const size_t bytes = static_cast<size_t>(pool.row_numel()) * dtype_size(pool.dtype);
  char* base = static_cast<char*>(pool.data);
  if (bytes > 0) {
    TESSERA_CUDA_CHECK(
        cudaMemcpyAsync(base + dst * bytes, base + src * bytes, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
}

void CudaBackend::moe_topk_impl(const TensorView& logits, int top_k, bool normalize, const TensorView& weights,
                                const TensorView& ids) {
  require_device({{&logits, "logits"}, {&weights, "weights"}, {&ids, "ids"}}, "moe_topk");
  cuda::launch::moe_topk(logits.as<float>(), logits.dim(0), logits.dim(1), top_k, normalize, weights.as<float>(),
                         ids.as<int32_t>(), stream_);
  after_launch("moe_topk");
}

void CudaBackend::gather_rows_impl(const TensorView& x, const std::vector<int32_t>& rows, const TensorView& out) {
  require_device({{&x, "x"}, {&out, "out"}}, "gather_rows");
  if (rows.empty()) return;
  const std::vector<const void*> dev = staging_->upload({{rows.data(), rows.size() * sizeof(int32_t)}}, stream_);
  cuda::launch::gather_rows(x.as<float>(), static_cast<const int32_t*>(dev[0]), static_cast<int64_t>(rows.size()),
                            x.dim(1), out.as<float>(), stream_);
  after_launch("gather_rows");
}

void CudaBackend::scatter_add_scaled_impl(const TensorView& x, const std::vector<int32_t>& rows,
                                          const std::vector<float>& scale, const TensorView& out) {
  require_device({{&x, "x"}, {&out, "out"}}, "scatter_add_scaled");
  if (rows.empty()) return;
  std::vector<uint8_t> seen(out.dim(0), 0);
  bool unique = true;
  for (int32_t r : rows) {
    unique = unique && seen[r] == 0;
    seen[r] = 1;
  }
  const std::vector<const void*> dev = staging_->upload(
      {{rows.data(), rows.size() * sizeof(int32_t)}, {scale.data(), scale.size() * sizeof(float)}}, stream_);
  cuda::launch::scatter_add_scaled(x.as<float>(), static_cast<const int32_t*>(dev[0]),
                                   static_cast<const float*>(dev[1]), static_cast<int64_t>(rows.size()), x.dim(1),
                                   unique, out.as<float>(), stream_);
  after_launch("scatter_add_scaled");
}

void CudaBackend::lora_add_impl(const TensorView& x, const std::vector<LoraSegment>& segments, const TensorView& out) {
  require_device({{&x, "x"}, {&out, "out"}}, "lora_add");
  for (const LoraSegment& s : segments) {
    require_placed({{&s.shrink, "shrink"}, {&s.expand, "expand"}}, "lora_add");
    // The rank-r intermediate lives in a block's shared memory (48 KiB without opting in).
    TESSERA_CHECK_LE(s.shrink.dim(1), 12288) << "lora_add: rank " << s.shrink.dim(1) << " above the CUDA kernel's 12288";
    cuda::launch::lora_add_rows(x.as<float>() + s.begin * x.row_stride(), x.row_stride(), s.shrink.data, s.expand.data,
                                s.shrink.dtype == DType::kBF16, s.shrink.dim(1), x.dim(1), s.expand.dim(1), s.scale,
                                out.as<float>() + s.begin * out.row_stride() + s.column, out.row_stride(), s.end - s.begin,
                                stream_);
  }
  after_launch("lora_add");
}

}  // namespace tessera
