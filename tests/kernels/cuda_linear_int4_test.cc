// The CUDA 4-bit linear layer (kernels/cuda/linear_int4.cu) against the CPU one on the same
// panels (every scheme: quantize_int4's q4_0-style, and q4_K-style and q6_K-style packed
// from random ggml blocks), decode-sized M (the GEMV kernel) and larger M (dequantize + cuBLAS), with and
// without bias and an activation. The weights are the same values on both; the CPU carries
// x in 8 bits per group of 32 (kernels/cpu/linear_int4.h), CUDA in f32, so the bound per
// output is that rounding, sum over groups of (max|x| / 254) sum |w|, plus f32 accumulation.
// Skips without a device; tests/gpu/run.sh runs it.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "common/gguf/ggml_dequant_blocks.h"
#include "kernels/cpu/linear_int4.h"
#include "tests/kernels/cuda_test_fixture.h"

namespace tessera {
namespace {

using namespace cuda_test;

struct HostPanels {
  Tensor nibbles, scales;
  std::vector<float> w;  // dequantized [N, K]
};

// N rows of random ggml blocks of type B (every byte random, then `fill` sets the scales).
template <typename B, typename Fill>
std::vector<uint8_t> random_blocks(int64_t N, int64_t K, Fill fill) {
  std::mt19937 rng(static_cast<uint32_t>(N + K));
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> rows(static_cast<size_t>(N * (K / kGgmlQKK)) * sizeof(B));
  for (uint8_t& v : rows) v = static_cast<uint8_t>(byte(rng));
  for (size_t b = 0; b < rows.size() / sizeof(B); ++b) {
    B block;
    std::memcpy(&block, rows.data() + b * sizeof(B), sizeof(B));
    fill(block, b);
    std::memcpy(rows.data() + b * sizeof(B), &block, sizeof(B));
  }
  return rows;
}

HostPanels host_panels(Int4Scheme scheme, const Tensor& wf, int64_t N, int64_t K) {
  const int64_t P = int4_panel_count(N);
  HostPanels h;
  h.nibbles = Tensor::zeros({P, K / 4, int4_step_bytes(scheme)}, DType::kU8);
  if (scheme == Int4Scheme::kSymmetric) {
    h.scales = Tensor::zeros({P, K / kInt4Group, kInt4PanelColumns}, DType::kF16);
    cpu::quantize_int4(wf.data<float>(), N, K, h.nibbles.data<uint8_t>(), h.scales.data<uint8_t>());
  } else if (scheme == Int4Scheme::kSuperBlock) {
    h.scales = Tensor::zeros({P, K / kInt4SuperBlock, kInt4SuperRecordBytes}, DType::kU8);
    const std::vector<uint8_t> rows = random_blocks<BlockQ4_K>(N, K, [](BlockQ4_K& block, size_t b) {
      block.d = f32_to_f16(0.002f + 0.001f * static_cast<float>(b % 3));
      block.dmin = f32_to_f16(0.003f);
    });
    cpu::pack_int4_from_q4_k(rows.data(), K / kGgmlQKK * static_cast<int64_t>(sizeof(BlockQ4_K)), N, K,
                             h.nibbles.data<uint8_t>(), h.scales.data<uint8_t>());
  } else {
    h.scales = Tensor::zeros({P, K / kInt4SuperBlock, kSixBitRecordBytes}, DType::kI8);
    const std::vector<uint8_t> rows = random_blocks<BlockQ6_K>(N, K, [](BlockQ6_K& block, size_t b) {
      block.d = f32_to_f16(0.0001f + 0.0001f * static_cast<float>(b % 3));
    });
    cpu::pack_int4_from_q6_k(rows.data(), K / kGgmlQKK * static_cast<int64_t>(sizeof(BlockQ6_K)), N, K,
                             h.nibbles.data<uint8_t>(), h.scales.data<uint8_t>());
  }
  h.w.resize(static_cast<size_t>(N * K));
  cpu::dequantize_int4(scheme, h.nibbles.data<uint8_t>(), h.scales.data<uint8_t>(), N, K, h.w.data());
  return h;
}

TEST_F(CudaBackendTest, LinearInt4MatchesCpu) {
  struct Shape {
    int64_t M, K, N;
  };
  for (const Int4Scheme scheme : {Int4Scheme::kSymmetric, Int4Scheme::kSuperBlock, Int4Scheme::kSixBit}) {
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
          tag << "linear_int4 " << cpu::int4_scheme_name(scheme) << " M=" << s.M << " K=" << s.K << " N=" << s.N
              << " bias=" << bias_kind << (act == Activation::kSilu ? " silu" : "");
          expect_close(widen(ref), device_f32(out), 0, 0, tag.str(), &t);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera
