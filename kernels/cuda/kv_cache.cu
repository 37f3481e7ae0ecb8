// KV-cache write: each new token's K and V rows go to their slot in the paged pools,
// rounded once to the cache dtype (round to nearest even, as the CPU's convert_elements).
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launchers.h"

namespace tessera::cuda {
namespace {

template <typename T>
__global__ void write_kv_kernel(const float* k, const float* v, int64_t row_stride, const int32_t* slots,
                                int64_t width, T* kc, T* vc) {
  const int64_t t = blockIdx.x;
  const int64_t dst = static_cast<int64_t>(slots[t]) * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    kc[dst + i] = from_f32<T>(k[t * row_stride + i]);
    vc[dst + i] = from_f32<T>(v[t * row_stride + i]);
  }
}

}  // namespace

namespace launch {

void write_kv(const float* k, const float* v, int64_t tokens, int64_t row_stride, const int32_t* slots,
              int64_t width, void* k_cache, void* v_cache, DType cache_dtype, Stream stream) {
  if (tokens == 0 || width == 0) return;
  const int threads = width >= 256 ? 256 : 128;
  switch (cache_dtype) {
    case DType::kF16:
      write_kv_kernel<<<tokens, threads, 0, stream>>>(k, v, row_stride, slots, width, static_cast<__half*>(k_cache),
                                                      static_cast<__half*>(v_cache));
      break;
    case DType::kBF16:
      write_kv_kernel<<<tokens, threads, 0, stream>>>(k, v, row_stride, slots, width,
                                                      static_cast<__nv_bfloat16*>(k_cache),
                                                      static_cast<__nv_bfloat16*>(v_cache));
      break;
    default:
      write_kv_kernel<<<tokens, threads, 0, stream>>>(k, v, row_stride, slots, width, static_cast<float*>(k_cache),
                                                      static_cast<float*>(v_cache));
      break;
  }
}

}  // namespace launch
}  // namespace tessera::cuda
