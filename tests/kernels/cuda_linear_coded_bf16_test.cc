// The CUDA coded bf16 linear layer (kernels/cuda/linear_coded_bf16.cu) against the CPU one on
// the same coded matrix (random bf16 rows with outliers that become escapes), decode-sized M
// (the GEMV kernel) and larger M (dequantize + cuBLAS), with and without bias and an
// activation. The CPU rounds x to bf16 for its dot products, CUDA keeps it f32, so the bound
// per output is that rounding, 2^-8 sum |x w|, plus f32 accumulation.
// Also the lookup in a table kept as ggml blocks (the other embedding of a GGUF file).
// Skips without a device; tests/gpu/run.sh runs it.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>

#include "kernels/coded_bf16.h"
#include "tests/kernels/int4_test_blocks.h"
#include "tests/kernels/cuda_test_fixture.h"

namespace tessera {
namespace {

using namespace cuda_test;

TEST_F(CudaBackendTest, LinearCodedBf16MatchesCpu) {
  struct Shape {
    int64_t M, K, N;
  };
  for (Shape s : {Shape{1, 64, 1}, Shape{1, 512, 37}, Shape{3, 256, 129}, Shape{8, 768, 300}, Shape{9, 256, 77},
                  Shape{64, 512, 512}}) {
    Tensor x = random_host({s.M, s.K}, DType::kF32, -2.0f, 2.0f);
    Tensor w = random_host({s.N, s.K}, DType::kBF16, -0.05f, 0.05f);
    std::mt19937 rng(static_cast<uint32_t>(s.N));
    for (int64_t n = 0; n < s.N; ++n) {
      w.data<uint16_t>()[n * s.K + static_cast<int64_t>(rng() % s.K)] = f32_to_bf16(300.0f);  // escapes
      w.data<uint16_t>()[n * s.K + static_cast<int64_t>(rng() % s.K)] = 0x0000;
    }
    const CodedBf16Matrix c = encode_coded_bf16(w.data<uint16_t>(), s.N, s.K);
    Tensor x_d = to_device(x), body_d = cuda_->place_weight(c.body), side_d = cuda_->place_weight(c.side);
    std::vector<double> tol(static_cast<size_t>(s.M * s.N));
    for (int64_t m = 0; m < s.M; ++m) {
      for (int64_t n = 0; n < s.N; ++n) {
        double abs_dot = 0;
        for (int64_t k = 0; k < s.K; ++k) {
          abs_dot += std::fabs(x.data<float>()[m * s.K + k] * bf16_to_f32(w.data<uint16_t>()[n * s.K + k]));
        }
        tol[static_cast<size_t>(m * s.N + n)] = 1e-5 + abs_dot * (1.0 / 256 + 1e-5);
      }
    }
    for (int bias_kind = 0; bias_kind < 2; ++bias_kind) {
      Tensor bias = bias_kind == 0 ? Tensor() : random_host({s.N}, DType::kF32);
      Tensor bias_d = bias_kind == 0 ? Tensor() : cuda_->place_weight(bias);
      for (Activation act : {Activation::kNone, Activation::kSilu}) {
        Tensor ref = Tensor::zeros({s.M, s.N}, DType::kF32);
        Tensor out = cuda_->alloc({s.M, s.N}, DType::kF32);
        cpu_->linear_coded_bf16(x, c.body, c.side, bias, ref, act);
        cuda_->linear_coded_bf16(x_d, body_d, side_d, bias_d, out, act);
        std::vector<double> t = tol;
        for (double& v : t) v *= 1.2;  // SiLU's slope is at most 1.1
        std::ostringstream tag;
        tag << "linear_coded_bf16 M=" << s.M << " K=" << s.K << " N=" << s.N << " bias=" << bias_kind
            << (act == Activation::kSilu ? " silu" : "");
        expect_close(widen(ref), device_f32(out), 0, 0, tag.str(), &t);
      }
    }
  }
}

// A coded table's rows gathered on CUDA are the CPU's (the same bits: both decode exactly),
// the whole vocabulary and a vocabulary-parallel rank's rows.
TEST_F(CudaBackendTest, EmbeddingCodedBf16MatchesCpu) {
  const int64_t V = 300, H = 192;
  Tensor table = random_host({V, H}, DType::kBF16, -0.05f, 0.05f);
  for (int64_t v = 0; v < V; v += 7) table.data<uint16_t>()[v * H + v % H] = f32_to_bf16(500.0f);  // escapes
  const CodedBf16Matrix c = encode_coded_bf16(table.data<uint16_t>(), V, H);
  Tensor body_d = cuda_->place_weight(c.body), side_d = cuda_->place_weight(c.side);
  Tensor ids = Tensor::zeros({5}, DType::kI32);
  const int32_t picked[] = {0, 299, 7, 150, 42};
  std::memcpy(ids.data<int32_t>(), picked, sizeof picked);
  Tensor ids_d = to_device(ids);
  for (const int64_t offset : {int64_t{-1}, int64_t{0}, int64_t{100}}) {
    Tensor ref = Tensor::zeros({5, H}, DType::kF32);
    Tensor out = cuda_->alloc({5, H}, DType::kF32);
    cpu_->embedding_coded_bf16(ids, c.body, c.side, ref, offset);
    cuda_->embedding_coded_bf16(ids_d, body_d, side_d, out, offset);
    expect_close(widen(ref), device_f32(out), 0, 0, "embedding_coded_bf16 row_offset " + std::to_string(offset));
  }
}

// A table kept in ggml blocks (an untied GGUF embedding; kernels/cuda/embedding.cu, each
// element decoded by common/gguf/ggml_block_element.h) against the CPU's lookup, which decodes
// whole rows with dequantize_ggml: every block type, the whole vocabulary and a rank's rows.
TEST_F(CudaBackendTest, EmbeddingGgmlMatchesCpu) {
  std::mt19937 rng(3);
  const int64_t V = 60, H = 512;
  Tensor ids = Tensor::zeros({5}, DType::kI32);
  const int32_t picked[] = {0, 59, 7, 30, 42};
  std::memcpy(ids.data<int32_t>(), picked, sizeof picked);
  Tensor ids_d = to_device(ids);
  for (const GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                              GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    const Tensor table = random_ggml_table(type, V, H, rng);
    Tensor table_d = cuda_->place_weight(table);
    for (const int64_t offset : {int64_t{-1}, int64_t{0}, int64_t{20}}) {
      Tensor ref = Tensor::zeros({5, H}, DType::kF32);
      Tensor out = cuda_->alloc({5, H}, DType::kF32);
      cpu_->embedding_ggml(ids, table, static_cast<uint32_t>(type), ref, offset);
      cuda_->embedding_ggml(ids_d, table_d, static_cast<uint32_t>(type), out, offset);
      expect_close(widen(ref), device_f32(out), 0, 0,
                   "embedding_ggml " + ggml_type_name(static_cast<uint32_t>(type)) + " row_offset " + std::to_string(offset));
    }
  }
}

}  // namespace
}  // namespace tessera
