// The CUDA int8 weight-only linear layer (kernels/cuda/linear_int8.cu) against the CPU one:
// the same int8 weights and scales (quantized once on the host), decode-sized M (the GEMV
// kernel) and larger M (dequantize + cuBLAS f32 GEMM), with and without bias (f32 and bf16)
// and an activation. Both compute in f32 from the same dequantized values, so the bound is
// f32 accumulation in a different order: 1e-5 * sum_k |x_k dequant(w)_k| + 1e-6 per element.
// Skips without a device; tests/gpu/run.sh runs it.
#include <gtest/gtest.h>

#include "kernels/cpu/linear_int8.h"
#include "tests/kernels/cuda_test_fixture.h"

namespace tessera {
namespace {

using namespace cuda_test;

TEST_F(CudaBackendTest, LinearInt8MatchesCpu) {
  struct Int8Shape {
    int64_t M, K, N, group;
  };
  for (Int8Shape s : {Int8Shape{1, 64, 1, 32}, Int8Shape{1, 192, 37, 64}, Int8Shape{3, 256, 129, 128},
                      Int8Shape{8, 512, 300, 256}, Int8Shape{9, 128, 77, 32}, Int8Shape{64, 384, 512, 64}}) {
    Tensor x = random_host({s.M, s.K}, DType::kF32, -2.0f, 2.0f);
    Tensor w = random_host({s.N, s.K}, DType::kF32, -0.5f, 0.5f);
    Tensor q = Tensor::zeros({s.N, s.K}, DType::kI8);
    Tensor scales = Tensor::zeros({s.N, s.K / s.group}, DType::kF32);
    cpu::quantize_int8(w.data<float>(), DType::kF32, s.N, s.K, s.group, q.data<int8_t>(), scales.data<float>());
    Tensor x_d = to_device(x), q_d = cuda_->place_weight(q), s_d = cuda_->place_weight(scales);
    std::vector<double> tol(s.M * s.N);
    for (int64_t m = 0; m < s.M; ++m)
      for (int64_t n = 0; n < s.N; ++n) {
        double abs_dot = 0;
        for (int64_t k = 0; k < s.K; ++k)
          abs_dot += std::fabs(double(x.data<float>()[m * s.K + k]) * q.data<int8_t>()[n * s.K + k] *
                               scales.data<float>()[n * (s.K / s.group) + k / s.group]);
        tol[m * s.N + n] = 1.2 * (1e-5 * abs_dot + 1e-6);
      }
    for (int bias_kind = 0; bias_kind < 3; ++bias_kind) {  // none, f32, bf16
      Tensor bias = bias_kind == 0 ? Tensor() : random_host({s.N}, bias_kind == 1 ? DType::kF32 : DType::kBF16);
      Tensor bias_d = bias_kind == 0 ? Tensor() : cuda_->place_weight(bias);
      for (Activation act : {Activation::kNone, Activation::kSilu}) {
        Tensor ref = Tensor::zeros({s.M, s.N}, DType::kF32);
        Tensor out = cuda_->alloc({s.M, s.N}, DType::kF32);
        cpu_->linear_int8(x, q, scales, bias, ref, act);
        cuda_->linear_int8(x_d, q_d, s_d, bias_d, out, act);
        std::ostringstream tag;
        tag << "linear_int8 M=" << s.M << " K=" << s.K << " N=" << s.N << " group=" << s.group << " bias=" << bias_kind
            << (act == Activation::kSilu ? " silu" : "");
        expect_close(widen(ref), device_f32(out), 0, 0, tag.str(), &tol);
      }
    }
  }
}

}  // namespace
}  // namespace tessera
