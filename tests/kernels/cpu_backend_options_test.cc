// CpuBackend takes its kernel choices as CpuKernelOptions (common/kernel_options.h), so
// backends with different options live in one process: each, used interleaved with the
// other, runs exactly the kernels its own options pick (bit for bit what those kernels give
// when called directly), and options that pick different arithmetic give different results.
#include "kernels/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <iostream>
#include <random>
#include <vector>

#include "common/kernel_options.h"
#include "common/tensor.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/cpu/gemm_packed.h"
#include "kernels/cpu/linear_cpu.h"
#include "kernels/cpu/linear_int8.h"
#include "kernels/cpu/linear_int8_kernels.h"

namespace tessera {
namespace {

using cpu::CpuIsa;

Tensor uniform_tensor(const std::vector<int64_t>& dims, DType dtype, std::mt19937& rng) {
  Tensor t = Tensor::zeros(dims, dtype);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(t.numel()));
  for (float& v : values) v = dist(rng);
  convert_elements(values.data(), DType::kF32, t.view().data, dtype, values.size());
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.view().data, b.view().data, a.nbytes()) == 0;
}

CpuKernelOptions scalar_f32_openblas() {
  CpuKernelOptions options;
  options.isa = CpuIsa::kScalar;
  options.bf16_dot = false;
  options.gemm = cpu::GemmKernel::kOpenBlas;
  return options;
}

// Decode rows of bf16 weights: the defaults take the bf16-dot GEMV where the CPU has
// AVX512_BF16 (else the best flavour's GEMV); scalar, f32, OpenBLAS options the scalar GEMV.
TEST(CpuBackendOptions, TwoBackendsInOneProcessPickTheirOwnLinearKernels) {
  CpuBackend fast(0, CpuKernelOptions{});
  CpuBackend plain(0, scalar_f32_openblas());
  EXPECT_EQ(fast.kernel_options(), CpuKernelOptions{});
  EXPECT_EQ(plain.kernel_options(), scalar_f32_openblas());
  std::mt19937 rng(11);
  const int64_t M = 4, K = 256, N = 96;
  const Tensor x = uniform_tensor({M, K}, DType::kF32, rng);
  const Tensor w = uniform_tensor({N, K}, DType::kBF16, rng);
  Tensor fast_out = Tensor::zeros({M, N}, DType::kF32), plain_out = Tensor::zeros({M, N}, DType::kF32);
  Tensor fast_again = Tensor::zeros({M, N}, DType::kF32);
  fast.linear(x, w, Tensor(), fast_out);
  plain.linear(x, w, Tensor(), plain_out);
  fast.linear(x, w, Tensor(), fast_again);  // after the other backend ran: nothing it set lingers

  // What each choice is, built by hand rather than through linear_options.
  cpu::detail::LinearOptions fast_kernel;
  fast_kernel.isa = cpu::detected_cpu_isa();
  fast_kernel.bf16_dot = true;
  cpu::detail::LinearOptions scalar_gemv;
  scalar_gemv.isa = CpuIsa::kScalar;
  scalar_gemv.bf16_dot = false;
  scalar_gemv.path = cpu::detail::LinearPath::kGemv;
  Tensor fast_want = Tensor::zeros({M, N}, DType::kF32), plain_want = Tensor::zeros({M, N}, DType::kF32);
  cpu::detail::linear_with(fast_kernel, x.data<float>(), M, K, K, w.view().data, DType::kBF16, N, nullptr,
                           fast_want.data<float>(), N, Activation::kNone);
  cpu::detail::linear_with(scalar_gemv, x.data<float>(), M, K, K, w.view().data, DType::kBF16, N, nullptr,
                           plain_want.data<float>(), N, Activation::kNone);
  EXPECT_TRUE(same_bits(fast_out, fast_want));
  EXPECT_TRUE(same_bits(fast_again, fast_want));
  EXPECT_TRUE(same_bits(plain_out, plain_want));
  if (cpu::detected_cpu_isa() == CpuIsa::kAvx512 && cpu::detail::cpu_has_bf16_dot()) {
    EXPECT_FALSE(same_bits(fast_out, plain_out)) << "x rounded to bf16 against f32 x";
  } else {
    std::cout << "NOTE: no AVX512_BF16 here; the two backends' arithmetic may agree\n";
  }
}

// int8_dot on one backend, off on the other: x quantized to 8 bits against the weight-only
// kernels, and only the weight-only backend stores panels (where the CPU has VNNI).
TEST(CpuBackendOptions, Int8DotIsPerBackend) {
  CpuKernelOptions dot_options;
  dot_options.int8_dot = true;
  CpuBackend weight_only(0, CpuKernelOptions{});
  CpuBackend dot(0, dot_options);
  EXPECT_EQ(weight_only.prefers_int8_panels(),
            cpu::detected_cpu_isa() == CpuIsa::kAvx512 && cpu::detail::cpu_has_avx512_vnni());
  EXPECT_FALSE(dot.prefers_int8_panels());
  CpuKernelOptions rows_only;
  rows_only.int8_x16 = false;
  EXPECT_FALSE(CpuBackend(0, rows_only).prefers_int8_panels());

  std::mt19937 rng(12);
  const int64_t M = 3, K = 128, N = 40, group = 32;
  const Tensor x = uniform_tensor({M, K}, DType::kF32, rng);
  const Tensor wf = uniform_tensor({N, K}, DType::kF32, rng);
  Tensor q = Tensor::zeros({N, K}, DType::kI8), scales = Tensor::zeros({N, K / group}, DType::kF32);
  cpu::quantize_int8(wf.view().data, DType::kF32, N, K, group, q.data<int8_t>(), scales.data<float>());
  Tensor weight_only_out = Tensor::zeros({M, N}, DType::kF32), dot_out = Tensor::zeros({M, N}, DType::kF32);
  dot.linear_int8(x, q, scales, Tensor(), dot_out);
  weight_only.linear_int8(x, q, scales, Tensor(), weight_only_out);

  cpu::detail::Int8LinearOptions weight_only_kernel, dot_kernel;
  dot_kernel.int8_activations = true;
  auto direct = [&](const cpu::detail::Int8LinearOptions& kernel) {
    Tensor want = Tensor::zeros({M, N}, DType::kF32);
    cpu::detail::linear_int8_with(kernel, x.data<float>(), M, K, K, q.data<int8_t>(), scales.data<float>(), group, N,
                                  nullptr, want.data<float>(), N, Activation::kNone);
    return want;
  };
  const Tensor weight_only_want = direct(weight_only_kernel), dot_want = direct(dot_kernel);
  EXPECT_TRUE(same_bits(weight_only_out, weight_only_want));
  EXPECT_TRUE(same_bits(dot_out, dot_want));
  EXPECT_FALSE(same_bits(weight_only_out, dot_out)) << "8-bit x against 16-bit or f32 x";
}

// Two sequences (a 10-token prefill, one decode row at context 7) over shuffled blocks.
struct SmallPagedAttention {
  static constexpr int64_t kBlockSize = 4, kKvHeads = 2, kQHeads = 4, kHeadDim = 16;
  AttentionBatch batch;
  Tensor q, k_cache, v_cache;
  explicit SmallPagedAttention(std::mt19937& rng) {
    batch.query_start = {0, 10, 11};
    batch.context_lens = {10, 7};
    batch.max_blocks_per_seq = 3;
    batch.block_tables = {4, 0, 2, 1, 3, -1};
    q = uniform_tensor({11, kQHeads * kHeadDim}, DType::kF32, rng);
    k_cache = uniform_tensor({5, kBlockSize, kKvHeads, kHeadDim}, DType::kF32, rng);
    v_cache = uniform_tensor({5, kBlockSize, kKvHeads, kHeadDim}, DType::kF32, rng);
  }
  Tensor run(Backend& backend) const {
    Tensor out = Tensor::zeros({11, kQHeads * kHeadDim}, DType::kF32);
    backend.attention(q.view().reshape({11, kQHeads, kHeadDim}), batch, k_cache, v_cache, params(), out);
    return out;
  }
  AttentionParams params() const {
    AttentionParams p;
    p.scale = 0.25f;
    return p;
  }
};

// The tiled kernel (with the best inner loops, or the scalar ones under isa: scalar) on two
// backends, the two-pass reference on a third.
TEST(CpuBackendOptions, AttentionKernelIsPerBackend) {
  std::mt19937 rng(13);
  const SmallPagedAttention a(rng);
  CpuKernelOptions reference_options, scalar_options;
  reference_options.attention = cpu::AttentionKernel::kReference;
  scalar_options.isa = CpuIsa::kScalar;
  CpuBackend tiled(0, CpuKernelOptions{}), reference(0, reference_options), scalar_tiled(0, scalar_options);
  const Tensor tiled_out = a.run(tiled), reference_out = a.run(reference), scalar_out = a.run(scalar_tiled);

  const GqaLayout gqa{SmallPagedAttention::kQHeads / SmallPagedAttention::kKvHeads, 0, 0};
  const int64_t row = SmallPagedAttention::kQHeads * SmallPagedAttention::kHeadDim;
  Tensor tiled_want = Tensor::zeros({11, row}, DType::kF32), reference_want = Tensor::zeros({11, row}, DType::kF32);
  Tensor scalar_want = Tensor::zeros({11, row}, DType::kF32);
  cpu::detail::attention_tiled(cpu::detail::attention_tile_ops_for(cpu::detected_cpu_isa()), a.q.data<float>(), row,
                               SmallPagedAttention::kQHeads, a.batch, a.k_cache, a.v_cache, a.params(), tiled_want, gqa);
  cpu::detail::attention_tiled(cpu::detail::attention_tile_ops_for(CpuIsa::kScalar), a.q.data<float>(), row,
                               SmallPagedAttention::kQHeads, a.batch, a.k_cache, a.v_cache, a.params(), scalar_want, gqa);
  cpu::detail::attention_reference(a.q.data<float>(), row, SmallPagedAttention::kQHeads, a.batch, a.k_cache,
                                   a.v_cache, a.params(), reference_want, gqa);
  EXPECT_TRUE(same_bits(tiled_out, tiled_want));
  EXPECT_TRUE(same_bits(reference_out, reference_want));
  EXPECT_TRUE(same_bits(scalar_out, scalar_want));
  EXPECT_FALSE(same_bits(tiled_out, reference_out)) << "online softmax against two passes round differently";
}

// make_backend hands BackendOptions' kernel options to the CPU backend it makes; the
// overload without them gives the defaults whatever the environment says.
TEST(CpuBackendOptions, MakeBackendPassesTheOptions) {
  BackendOptions options;
  options.kernels.cpu = scalar_f32_openblas();
  auto made = make_backend(BackendKind::kCpu, options);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  EXPECT_EQ(dynamic_cast<const CpuBackend&>(*made.value()).kernel_options(), scalar_f32_openblas());
  auto plain = make_backend("cpu");
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  EXPECT_EQ(dynamic_cast<const CpuBackend&>(*plain.value()).kernel_options(), CpuKernelOptions{});
}

}  // namespace
}  // namespace tessera
