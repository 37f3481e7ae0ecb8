// The CUDA 4-bit linear layer (kernels/cuda/linear_int4.cu) against the CPU one on the same
// panels (every scheme: quantize_int4's q4_0-style, the others packed from random ggml
// blocks), decode-sized M (the GEMV kernel) and larger M (dequantize + cuBLAS), with and
// without bias and an activation. The weights are the same values on both; the CPU carries
// x in 8 bits per group of 32 (kernels/cpu/linear_int4.h), CUDA in f32, so the bound per
// output is that rounding, sum over groups of (max|x| / 254) sum |w|, plus f32 accumulation.
// Skips without a device; tests/gpu/run.sh runs it.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "common/gguf/ggml_dequant_blocks.h"
#include "tests/kernels/int4_test_blocks.h"
#include "kernels/cpu/linear_int4.h"
#include "tests/kernels/cuda_test_fixture.h"

namespace tessera {
namespace {

using namespace cuda_test;

struct HostPanels {
  Tensor nibbles, scales;
  std::vector<float> w;  // dequantized [N, K]
};

HostPanels host_panels(Int4Scheme scheme, const Tensor& wf, int64_t N, int64_t K) {
  const int64_t P = int4_panel_count(N);
  HostPanels h;
  h.nibbles = Tensor::zeros({P, K / 4, int4_step_bytes(scheme)}, DType::kU8);
  h.scales = Tensor::zeros({P, K / int4_k_multiple(scheme), int4_record_elements(scheme)}, int4_scales_dtype(scheme));
  uint8_t* records = static_cast<uint8_t*>(h.scales.view().data);
  if (scheme == Int4Scheme::kSymmetric) {
    cpu::quantize_int4(wf.data<float>(), N, K, h.nibbles.data<uint8_t>(), records);
  } else {
    std::mt19937 rng(static_cast<uint32_t>(N + K));
    const std::vector<uint8_t> rows = random_block_rows(rng, scheme, N, K);
    const BlockType bt = block_type_of(scheme);
    cpu::pack_int4_from_blocks(scheme, rows.data(), K / bt.elems * bt.bytes, N, K, h.nibbles.data<uint8_t>(),
                               records);
  }
  h.w.resize(static_cast<size_t>(N * K));
  cpu::dequantize_int4(scheme, h.nibbles.data<uint8_t>(), records, N, K, h.w.data());
  return h;
}

TEST_F(CudaBackendTest, LinearInt4MatchesCpu) {
  struct Shape {
    int64_t M, K, N;
  };
  for (const Int4Scheme scheme : kAllSchemes) {
    for (Shape s : {Shape{1, 256, 1}, Shape{1, 512, 37}, Shape{3, 256, 129}, Shape{8, 768, 300}, Shape{9, 256, 77},
                    Shape{64, 512, 512}}) {
      Tensor x = random_host({s.M, s.K}, DType::kF32, -2.0f, 2.0f);
      Tensor wf = random_host({s.N, s.K}, DType::kF32, -0.5f, 0.5f);
      const HostPanels h = host_panels(scheme, wf, s.N, s.K);
      Tensor x_d = to_device(x), w_d = cuda_->place_weight(h.nibbles), s_d = cuda_->place_weight(h.scales);
      std::vector<double> tol(static_cast<size_t>(s.M * s.N));
      for (int64_t m = 0; m < s.M; ++m) {
        for (int64_t n = 0; n < s.N; ++n) {
          double bound = 1e-6;
          for (int64_t g = 0; g < s.K / 32; ++g) {
            double amax = 0, wsum = 0, abs_dot = 0;
            for (int64_t k = g * 32; k < g * 32 + 32; ++k) {
              const double xv = x.data<float>()[m * s.K + k], w = h.w[static_cast<size_t>(n * s.K + k)];
              amax = std::max(amax, std::fabs(xv));
              wsum += std::fabs(w);
              abs_dot += std::fabs(xv * w);
            }
            bound += amax / 254.0 * wsum * 1.01 + 1e-5 * abs_dot;
          }
          tol[static_cast<size_t>(m * s.N + n)] = bound;
        }
      }
      for (int bias_kind = 0; bias_kind < 2; ++bias_kind) {
        Tensor bias = bias_kind == 0 ? Tensor() : random_host({s.N}, DType::kF32);
        Tensor bias_d = bias_kind == 0 ? Tensor() : cuda_->place_weight(bias);
        // SiLU's slope is at most 1.1: the bound carries over with a margin.
        for (Activation act : {Activation::kNone, Activation::kSilu}) {
          Tensor ref = Tensor::zeros({s.M, s.N}, DType::kF32);
          Tensor out = cuda_->alloc({s.M, s.N}, DType::kF32);
          cpu_->linear_int4(x, h.nibbles, h.scales, bias, ref, act);
          cuda_->linear_int4(x_d, w_d, s_d, bias_d, out, act);
          std::vector<double> t = tol;
          for (double& v : t) v *= 1.2;
          std::ostringstream tag;
          tag << "linear_int4 " << int4_scheme_name(scheme) << " M=" << s.M << " K=" << s.K << " N=" << s.N
              << " bias=" << bias_kind << (act == Activation::kSilu ? " silu" : "");
          expect_close(widen(ref), device_f32(out), 0, 0, tag.str(), &t);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera
