// Parity of every CUDA backend op with the CPU backend (the reference, itself tested
// against plain references in linear_cpu_test.cc and the fixture goldens). Each test feeds
// both backends the same random inputs -- odd sizes, every weight and KV-cache dtype, every
// activation, GQA groups and tensor-parallel head offsets, ALiBi, soft-capping, sliding
// windows over partly freed block tables, ragged batches mixing prefill chunks and decode
// rows, non-contiguous block tables, strided q/k rows, partial rotary, vocabulary-parallel
// embedding -- and checks every element (no "99% within tolerance").
//
// Compiled in every build. Without CUDA compiled in, or without a device, every test that
// needs one is skipped with "SKIPPED: no CUDA device (...)", never passed silently.
//
// Tolerances (|cuda - cpu| <= atol + rtol * |cpu| unless stated):
//  - copies, gathers, conversions, cache writes, scale, top-k ids: exact (same rounding
//    rules), and so are the elements an op must leave alone (strides, unrotated dims).
//  - norms (head_rms_norm too): 1e-5 + 1e-5 rel. Statistics are accumulated in double on
//    both backends; what remains is float rounding of the final expression and summation order.
//  - element-wise activations, softcap, rotary: 1e-6 + 1e-5 rel (tanhf/erff/expf/sinf/cosf
//    of CUDA and glibc differ by an ulp or two; both rotate by the same inv_freq table).
//  - attention: 1e-5 + 1e-5 rel (online vs two-pass softmax, different dot-product order).
//  - linear, f32 weights: 1e-5 * sum_k |x_k w_k| (both accumulate in f32 in different
//    orders; TF32 is off on the CUDA side, and TF32 would fail this by ~100x).
//  - linear, f16/bf16 weights: the CUDA backend rounds x to the weight dtype before the
//    tensor-core GEMM, the CPU does not. Rounding each x_k moves the result by at most
//    u * sum_k |x_k w_k| (u = 2^-11 for f16, 2^-8 for bf16: half an ulp, relative), so
//    the bound is (u + 1e-5) * sum_k |x_k w_k|, times 1.2 after an activation (|gelu'| <
//    1.13 for both GELUs, |silu'| < 1.1).
#include "kernels/weight_stager.h"
#include "tests/kernels/cuda_test_fixture.h"

namespace tessera {
namespace {

using namespace cuda_test;


// ---- LoRA --------------------------------------------------------------------------------------

// Segments of ranks 8, 16 and 64 over a batch with rows of no adapter, out a column slice of a
// wider buffer: both backends sum each element in the same order (they may contract to FMA
// differently), so 1e-5 + 1e-5 relative.
TEST_F(CudaBackendTest, LoraAddMatchesCpu) {
  constexpr int64_t kRows = 11, kIn = 40, kOut = 30, kWide = 50;
  const Tensor x = random_host({kRows, kIn}, DType::kF32), before = random_host({kRows, kWide}, DType::kF32);
  struct Seg {
    int64_t begin, end, rank;
    float scale;
  };
  const std::vector<Seg> segs = {{0, 3, 8, 2.0f}, {5, 6, 16, 0.5f}, {7, 11, 64, 0.125f}};
  for (DType factors : {DType::kF32, DType::kBF16}) {
    std::vector<Tensor> a_h, b_h, a_d, b_d;
    for (const Seg& s : segs) {
      a_h.push_back(random_host({kIn, s.rank}, factors));
      b_h.push_back(random_host({s.rank, kOut}, factors));
      a_d.push_back(to_device(a_h.back()));
      b_d.push_back(to_device(b_h.back()));
    }
    std::vector<LoraSegment> on_cpu, on_cuda;
    for (size_t i = 0; i < segs.size(); ++i) {
      on_cpu.push_back({segs[i].begin, segs[i].end, a_h[i].view(), b_h[i].view(), segs[i].scale});
      on_cuda.push_back({segs[i].begin, segs[i].end, a_d[i].view(), b_d[i].view(), segs[i].scale});
    }
    Tensor ref = host_copy(before);
    cpu_->lora_add(x.view(), on_cpu, ref.view().columns(10, kOut));
    Tensor out_d = to_device(before);
    cuda_->lora_add(to_device(x).view(), on_cuda, out_d.view().columns(10, kOut));
    expect_close(widen(ref.view()), device_f32(out_d.view()), 1e-5, 1e-5,
                 std::string("lora_add, ") + dtype_name(factors) + " factors");
  }
}

// ---- memory ----------------------------------------------------------------------------------

TEST_F(CudaBackendTest, AllocIsZeroedOnTheDeviceAndCopiesRoundTrip) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32}) {
    Tensor d = cuda_->alloc({3, 37}, dt);
    EXPECT_EQ(d.view().device, DeviceKind::kCuda);
    Tensor zeros = to_host(d.view());
    for (size_t i = 0; i < zeros.nbytes(); ++i) ASSERT_EQ(zeros.data<unsigned char>()[i], 0) << dtype_name(dt);
    Tensor h = dt == DType::kI32 ? host_ints(std::vector<int32_t>(111, -7)) : random_host({3, 37}, dt);
    cuda_->copy_from_host(h.data<void>(), d.view());
    Tensor back = to_host(d.view());
    EXPECT_EQ(std::memcmp(back.data<void>(), h.data<void>(), h.nbytes()), 0) << dtype_name(dt);
    // Row slices of device tensors copy just those rows.
    Tensor row = Tensor::zeros({1, 37}, dt);
    cuda_->copy_to_host(d.view().rows(2, 1), row.data<void>());
    EXPECT_EQ(std::memcmp(row.data<void>(), h.data<char>() + 2 * 37 * dtype_size(dt), 37 * dtype_size(dt)), 0);
  }
  Tensor empty = cuda_->alloc({0, 5}, DType::kF32);  // a step that samples nothing
  EXPECT_EQ(empty.numel(), 0);
  // Released blocks are reused: many short-lived tensors of varying sizes.
  for (int i = 0; i < 200; ++i) {
    Tensor t = cuda_->alloc({1 + i % 17, 1000 + 37 * i}, DType::kF32);
    if (i % 50 == 0) {
      EXPECT_EQ(to_host(t.view()).data<float>()[0], 0.0f);
    }
  }
}

TEST_F(CudaBackendTest, HostActivationsAreALoudErrorNotAKernelFault) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child re-executes: no CUDA across fork
  Tensor x = random_host({2, 8}, DType::kF32), gamma = random_host({8}, DType::kF32);
  Tensor out = cuda_->alloc({2, 8}, DType::kF32);
  EXPECT_DEATH(cuda_->rms_norm(x, gamma, 1e-5f, out), "x is host memory");
}

// ---- embedding -------------------------------------------------------------------------------

TEST_F(CudaBackendTest, EmbeddingGathersAndWidensRows) {
  struct Case { int64_t tokens, vocab, hidden; };
  for (DType dt : kFloatTypes) {
    for (Case c : {Case{1, 3, 1}, Case{7, 50, 64}, Case{33, 1000, 257}}) {
      Tensor table = random_host({c.vocab, c.hidden}, dt);
      std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(c.vocab - 1));
      std::vector<int32_t> ids(c.tokens);
      for (int32_t& i : ids) i = id(rng_);
      ids[0] = static_cast<int32_t>(c.vocab - 1);
      Tensor ids_h = host_ints(ids);
      Tensor ref = Tensor::zeros({c.tokens, c.hidden}, DType::kF32);
      cpu_->embedding(ids_h, table, ref);
      Tensor ids_d = to_device(ids_h), table_d = to_device(table);
      Tensor out = cuda_->alloc({c.tokens, c.hidden}, DType::kF32);
      cuda_->embedding(ids_d, table_d, out);
      expect_close(widen(ref), device_f32(out), 0, 0, std::string("embedding ") + dtype_name(dt));
    }
  }
}

TEST_F(CudaBackendTest, VocabParallelEmbeddingZeroesOtherRanksRows) {
  for (DType dt : kFloatTypes) {
    const int64_t rows = 13, hidden = 40, offset = 26;  // this rank holds ids [26, 39)
    Tensor table = random_host({rows, hidden}, dt);
    std::vector<int32_t> ids = {0, 25, 26, 27, 38, 39, 100, 30, 12, 26};
    Tensor ids_h = host_ints(ids);
    Tensor ref = Tensor::zeros({10, hidden}, DType::kF32);
    cpu_->embedding(ids_h, table, ref, offset);
    Tensor out = cuda_->alloc({10, hidden}, DType::kF32);
    cuda_->embedding(to_device(ids_h), to_device(table), out, offset);
    expect_close(widen(ref), device_f32(out), 0, 0, std::string("vocab-parallel embedding ") + dtype_name(dt));
  }
}

// ---- norms -----------------------------------------------------------------------------------

struct NormShape { int64_t rows, hidden; };
const NormShape kNormShapes[] = {{1, 1}, {1, 7}, {5, 64}, {3, 1000}, {2, 4099}, {9, 8192}};

TEST_F(CudaBackendTest, LayerNormAndRmsNormMatchIncludingInPlace) {
  for (DType gt : kFloatTypes) {
    for (NormShape s : kNormShapes) {
      // Offset values: LayerNorm must centre them.
      Tensor x = random_host({s.rows, s.hidden}, DType::kF32, 2.0f, 5.0f);
      Tensor gamma = random_host({s.hidden}, gt, 0.5f, 1.5f), beta = random_host({s.hidden}, gt);
      const std::string tag = std::string(dtype_name(gt)) + " [" + std::to_string(s.rows) + ", " +
                              std::to_string(s.hidden) + "]";
      Tensor ref_ln = Tensor::zeros({s.rows, s.hidden}, DType::kF32);
      Tensor ref_rms = Tensor::zeros({s.rows, s.hidden}, DType::kF32);
      cpu_->layer_norm(x, gamma, beta, 1e-5f, ref_ln);
      cpu_->rms_norm(x, gamma, 1e-6f, ref_rms);
      Tensor xd = to_device(x), gd = to_device(gamma), bd = to_device(beta);
      Tensor ln = cuda_->alloc({s.rows, s.hidden}, DType::kF32), rms = cuda_->alloc({s.rows, s.hidden}, DType::kF32);
      cuda_->layer_norm(xd, gd, bd, 1e-5f, ln);
      cuda_->rms_norm(xd, gd, 1e-6f, rms);
      expect_close(widen(ref_ln), device_f32(ln), 1e-5, 1e-5, "layer_norm " + tag);
      expect_close(widen(ref_rms), device_f32(rms), 1e-5, 1e-5, "rms_norm " + tag);
      // In place (the embedding LayerNorm of BLOOM writes over its input).
      cuda_->layer_norm(xd, gd, bd, 1e-5f, xd);
      expect_close(widen(ref_ln), device_f32(xd), 1e-5, 1e-5, "in-place layer_norm " + tag);
    }
  }
}

TEST_F(CudaBackendTest, ResidualAddNormUpdatesTheResidualAndNormalises) {
  for (bool rms : {false, true}) {
    for (DType gt : kFloatTypes) {
      for (NormShape s : kNormShapes) {
        Tensor res = random_host({s.rows, s.hidden}, DType::kF32, -3.0f, 3.0f);
        Tensor delta = random_host({s.rows, s.hidden}, DType::kF32);
        Tensor gamma = random_host({s.hidden}, gt, 0.5f, 1.5f);
        Tensor beta = rms ? Tensor() : random_host({s.hidden}, gt);
        Tensor res_d = to_device(res), delta_d = to_device(delta), gamma_d = to_device(gamma);
        Tensor beta_d = rms ? Tensor() : to_device(beta);
        Tensor ref = Tensor::zeros({s.rows, s.hidden}, DType::kF32);
        cpu_->residual_add_norm(res, delta, gamma, beta, 1e-5f, rms, ref);
        Tensor out = cuda_->alloc({s.rows, s.hidden}, DType::kF32);
        cuda_->residual_add_norm(res_d, delta_d, gamma_d, beta_d, 1e-5f, rms, out);
        const std::string tag =
            std::string(rms ? "rms " : "layer ") + dtype_name(gt) + " h=" + std::to_string(s.hidden);
        expect_close(widen(res), device_f32(res_d), 0, 0, "residual after add, " + tag);
        expect_close(widen(ref), device_f32(out), 1e-5, 1e-5, "residual_add_norm " + tag);
      }
    }
  }
}

// ---- linear ----------------------------------------------------------------------------------

struct GemmShape { int64_t M, K, N; };

class LinearCase {
 public:
  // Per-element bound from sum_k |x_k w_k| (see the file comment).
  static std::vector<double> tolerance(const Tensor& x, const Tensor& w, bool activated) {
    const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
    const std::vector<float> xf = widen(x), wf = widen(w);
    const double u = w.dtype() == DType::kF16    ? std::ldexp(1.0, -11)
                     : w.dtype() == DType::kBF16 ? std::ldexp(1.0, -8)
                                                 : 0.0;
    std::vector<double> tol(M * N);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double abs_dot = 0;
        for (int64_t k = 0; k < K; ++k) abs_dot += std::fabs(static_cast<double>(xf[m * K + k]) * wf[n * K + k]);
        tol[m * N + n] = ((u + 1e-5) * abs_dot + 1e-6) * (activated ? 1.2 : 1.0);
      }
    }
    return tol;
  }
};

TEST_F(CudaBackendTest, LinearMatchesForEveryWeightDtypeBiasAndGelu) {
  const GemmShape shapes[] = {{1, 1, 1},     {1, 64, 96},    {3, 17, 5},     {7, 128, 257},
                             {33, 300, 64}, {64, 512, 384}, {130, 96, 1000}};
  for (DType wt : kFloatTypes) {
    for (GemmShape s : shapes) {
      Tensor x = random_host({s.M, s.K}, DType::kF32, -2.0f, 2.0f);
      Tensor w = random_host({s.N, s.K}, wt, -0.5f, 0.5f);
      Tensor x_d = to_device(x), w_d = to_device(w);
      for (int bias_kind = 0; bias_kind < 3; ++bias_kind) {  // none, f32, the weight dtype
        Tensor bias = bias_kind == 0 ? Tensor() : random_host({s.N}, bias_kind == 1 ? DType::kF32 : wt);
        Tensor bias_d = bias_kind == 0 ? Tensor() : to_device(bias);
        for (bool gelu : {false, true}) {
          Tensor ref = Tensor::zeros({s.M, s.N}, DType::kF32);
          Tensor out = cuda_->alloc({s.M, s.N}, DType::kF32);
          if (gelu) {
            cpu_->linear_act(x, w, bias, ref, Activation::kGeluTanh);
            cuda_->linear_act(x_d, w_d, bias_d, out, Activation::kGeluTanh);
          } else {
            cpu_->linear(x, w, bias, ref);
            cuda_->linear(x_d, w_d, bias_d, out);
          }
          const std::vector<double> tol = LinearCase::tolerance(x, w, gelu);
          std::ostringstream tag;
          tag << "linear " << dtype_name(wt) << " M=" << s.M << " K=" << s.K << " N=" << s.N << " bias=" << bias_kind
              << (gelu ? " gelu" : "");
          expect_close(widen(ref), device_f32(out), 0, 0, tag.str(), &tol);
        }
      }
    }
  }
}

TEST_F(CudaBackendTest, LinearActMatchesForEveryActivation) {
  // The fused epilogue: bias, then each activation (BLOOM's and GPT-2's tanh GELU, the exact
  // erf GELU of Falcon and GPT-NeoX, SiLU), on decode- and prefill-sized shapes (the CPU's
  // GEMV and GEMM paths).
  const GemmShape shapes[] = {{1, 64, 96}, {3, 17, 5}, {33, 300, 64}, {130, 96, 1000}};
  for (DType wt : kFloatTypes) {
    for (GemmShape s : shapes) {
      Tensor x = random_host({s.M, s.K}, DType::kF32, -2.0f, 2.0f);
      Tensor w = random_host({s.N, s.K}, wt, -0.5f, 0.5f);
      Tensor x_d = to_device(x), w_d = to_device(w);
      for (bool with_bias : {false, true}) {
        Tensor bias = with_bias ? random_host({s.N}, wt) : Tensor();
        Tensor bias_d = with_bias ? to_device(bias) : Tensor();
        for (Activation act : kActivations) {
          Tensor ref = Tensor::zeros({s.M, s.N}, DType::kF32);
          Tensor out = cuda_->alloc({s.M, s.N}, DType::kF32);
          cpu_->linear_act(x, w, bias, ref, act);
          cuda_->linear_act(x_d, w_d, bias_d, out, act);
          const std::vector<double> tol = LinearCase::tolerance(x, w, act != Activation::kNone);
          std::ostringstream tag;
          tag << "linear_act " << activation_name(act) << " " << dtype_name(wt) << " M=" << s.M << " K=" << s.K
              << " N=" << s.N << (with_bias ? " bias" : "");
          expect_close(widen(ref), device_f32(out), 0, 0, tag.str(), &tol);
        }
      }
    }
  }
}

TEST_F(CudaBackendTest, PlacedWeightsAreDeviceCopiesIndependentOfTheirHostBuffers) {
  // The loader hands every weight to place_weight once, at load time; the placed tensor is
  // device memory holding the host values, and stays valid once the host buffer is gone
  // or overwritten.
  for (DType wt : kFloatTypes) {
    Tensor x = random_host({5, 96}, DType::kF32);
    Tensor w = random_host({70, 96}, wt, -0.5f, 0.5f);
    Tensor b = random_host({70}, DType::kF32);
    Tensor gamma = random_host({96}, wt, 0.5f, 1.5f);
    Tensor ref = Tensor::zeros({5, 70}, DType::kF32), ref_n = Tensor::zeros({5, 96}, DType::kF32);
    cpu_->linear(x, w, b, ref);
    cpu_->rms_norm(x, gamma, 1e-5f, ref_n);
    const std::vector<double> tol = LinearCase::tolerance(x, w, false);
    Tensor w_d = cuda_->place_weight(w), b_d = cuda_->place_weight(b), g_d = cuda_->place_weight(gamma);
    for (const Tensor* t : {&w_d, &b_d, &g_d}) EXPECT_EQ(t->view().device, DeviceKind::kCuda);
    EXPECT_EQ(w_d.view().dims(), w.view().dims());
    EXPECT_EQ(w_d.dtype(), wt);
    expect_close(widen(w), device_f32(w_d), 0, 0, std::string("placed weight bytes ") + dtype_name(wt));
    // Overwrite, then free, the host buffers: the placed copies do not change.
    std::memset(w.data<void>(), 0, w.nbytes());
    std::memset(gamma.data<void>(), 0, gamma.nbytes());
    w = Tensor();
    gamma = Tensor();
    b = Tensor();
    Tensor x_d = to_device(x);
    Tensor out = cuda_->alloc({5, 70}, DType::kF32), out_n = cuda_->alloc({5, 96}, DType::kF32);
    cuda_->linear(x_d, w_d, b_d, out);
    cuda_->rms_norm(x_d, g_d, 1e-5f, out_n);
    expect_close(widen(ref), device_f32(out), 0, 0, std::string("placed-weight linear ") + dtype_name(wt), &tol);
    expect_close(widen(ref_n), device_f32(out_n), 1e-5, 1e-5, std::string("placed-gamma rms_norm ") + dtype_name(wt));
    // Placing a device tensor again is a no-op (same memory).
    EXPECT_EQ(cuda_->place_weight(w_d).view().data, w_d.view().data);
  }
}

// Streamed weights (kernels/weight_stager.h): eight weight matrices in the stager's pinned
// host memory go through two device slots in the order a step asks for them (each copied
// ahead into the slot the matrix two before it used), and every linear over a slot gives
// the CPU's result for its own matrix: a copy never lands in a slot before the linear that
// read the slot's last matrix ran (release), nor runs after the linear that needs it (wait).
TEST_F(CudaBackendTest, StagedWeightsCopiedAheadIntoSlotsGiveEachLinearItsOwnMatrix) {
  const int64_t N = 192, K = 256, matrices = 8;
  const size_t bytes = static_cast<size_t>(N * K) * sizeof(float);
  auto stager = cuda_->make_weight_stager(bytes * matrices, bytes, 2);
  ASSERT_TRUE(stager.is_ok()) << stager.status().to_string();
  WeightStager& st = *stager.value();
  Tensor x = random_host({3, K}, DType::kF32);
  Tensor x_d = to_device(x);
  std::vector<Tensor> refs, outs;
  std::vector<std::vector<double>> tols;
  for (int64_t m = 0; m < matrices; ++m) {
    Tensor w = random_host({N, K}, DType::kF32, -0.5f, 0.5f);
    std::memcpy(st.host() + m * bytes, w.data<void>(), bytes);
    Tensor ref = Tensor::zeros({3, N}, DType::kF32);
    cpu_->linear(x, w, Tensor(), ref);
    refs.push_back(std::move(ref));
    tols.push_back(LinearCase::tolerance(x, w, false));
  }
  st.copy_in(0, st.host(), bytes);
  for (int64_t m = 0; m < matrices; ++m) {
    const int slot = static_cast<int>(m % 2);
    if (m + 1 < matrices) st.copy_in(1 - slot, st.host() + (m + 1) * bytes, bytes);  // the next, ahead
    st.wait(slot);
    TensorView wv(st.slot(slot), DType::kF32, {N, K}, DeviceKind::kCuda);
    outs.push_back(cuda_->alloc({3, N}, DType::kF32));
    cuda_->linear(x_d, Tensor::borrowed(wv, nullptr), Tensor(), outs.back());
    st.release(slot);
  }
  for (int64_t m = 0; m < matrices; ++m)
    expect_close(widen(refs[m]), device_f32(outs[m]), 0, 0, "linear over slot-staged matrix " + std::to_string(m),
                 &tols[m]);
}

TEST_F(CudaBackendTest, UnplacedHostWeightsAreALoudErrorNotAKernelFault) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child re-executes: no CUDA across fork
  Tensor x_d = to_device(random_host({2, 8}, DType::kF32));
  Tensor w = random_host({4, 8}, DType::kF32), gamma = random_host({8}, DType::kF32);
  Tensor out = cuda_->alloc({2, 4}, DType::kF32), out_n = cuda_->alloc({2, 8}, DType::kF32);
  EXPECT_DEATH(cuda_->linear(x_d, w, Tensor(), out), "w is host memory; parameters must be placed");
  EXPECT_DEATH(cuda_->rms_norm(x_d, gamma, 1e-5f, out_n), "gamma is host memory; parameters must be placed");
}

TEST_F(CudaBackendTest, MemoryInfoReportsTheDeviceAndAllocationsUseIt) {
  auto before = cuda_->memory_info();
  ASSERT_TRUE(before.is_ok()) << before.status().to_string();
  EXPECT_GT(before->total_bytes, 0);
  EXPECT_GT(before->free_bytes, 0);
  EXPECT_LE(before->free_bytes, before->total_bytes);
  // 512 MiB placed as a weight: the device then has less free.
  Tensor big = Tensor::zeros({int64_t{128} << 20}, DType::kF32);
  Tensor placed = cuda_->place_weight(big);
  auto after = cuda_->memory_info();
  ASSERT_TRUE(after.is_ok());
  EXPECT_LE(after->free_bytes, before->free_bytes - (int64_t{500} << 20));
}

// ---- element-wise ----------------------------------------------------------------------------

TEST_F(CudaBackendTest, GeluSiluMulAndAddMatch) {
  for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{1000}, int64_t{70001}}) {
    Tensor x = random_host({n}, DType::kF32, -6.0f, 6.0f);
    Tensor ref = host_copy(x);
    cpu_->activate(ref, Activation::kGeluTanh);
    Tensor xd = to_device(x);
    cuda_->activate(xd, Activation::kGeluTanh);
    expect_close(widen(ref), device_f32(xd), 1e-6, 1e-5, "gelu_tanh n=" + std::to_string(n));
  }
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {3, 17}, {65, 1000}};  // tokens, width
  for (const auto& [T, F] : shapes) {
    Tensor gate = random_host({T, F}, DType::kF32, -8.0f, 8.0f), up = random_host({T, F}, DType::kF32);
    Tensor ref = Tensor::zeros({T, F}, DType::kF32), out = cuda_->alloc({T, F}, DType::kF32);
    cpu_->gated_act(gate, up, ref, Activation::kSilu);
    cuda_->gated_act(to_device(gate), to_device(up), out, Activation::kSilu);
    expect_close(widen(ref), device_f32(out), 1e-6, 1e-5, "gated_act silu F=" + std::to_string(F));

    Tensor packed = random_host({T, 2 * F}, DType::kF32, -8.0f, 8.0f);
    Tensor ref_p = Tensor::zeros({T, F}, DType::kF32), out_p = cuda_->alloc({T, F}, DType::kF32);
    cpu_->gated_act_packed(packed, ref_p, Activation::kSilu);
    cuda_->gated_act_packed(to_device(packed), out_p, Activation::kSilu);
    expect_close(widen(ref_p), device_f32(out_p), 1e-6, 1e-5, "gated_act_packed silu F=" + std::to_string(F));

    Tensor a = random_host({T, F}, DType::kF32), b = random_host({T, F}, DType::kF32);
    Tensor ref_a = Tensor::zeros({T, F}, DType::kF32);
    cpu_->add(a, b, ref_a);
    Tensor a_d = to_device(a);
    cuda_->add(a_d, to_device(b), a_d);  // out aliases a, as the transformer uses it
    expect_close(widen(ref_a), device_f32(a_d), 0, 0, "add F=" + std::to_string(F));
  }
}

TEST_F(CudaBackendTest, ActivateAndGatedActMatchForEveryActivation) {
  for (Activation act : kActivations) {
    for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{70001}}) {
      Tensor x = random_host({n}, DType::kF32, -8.0f, 8.0f);
      Tensor ref = host_copy(x);
      cpu_->activate(ref, act);
      Tensor xd = to_device(x);
      cuda_->activate(xd, act);
      expect_close(widen(ref), device_f32(xd), 1e-6, 1e-5,
                   std::string("activate ") + activation_name(act) + " n=" + std::to_string(n));
    }
  }
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {3, 17}, {65, 1000}};  // tokens, width
  for (Activation act : kGatedActivations) {
    for (const auto& [T, F] : shapes) {
      const std::string tag = std::string(activation_name(act)) + " F=" + std::to_string(F);
      Tensor gate = random_host({T, F}, DType::kF32, -8.0f, 8.0f), up = random_host({T, F}, DType::kF32);
      Tensor ref = Tensor::zeros({T, F}, DType::kF32), out = cuda_->alloc({T, F}, DType::kF32);
      cpu_->gated_act(gate, up, ref, act);
      cuda_->gated_act(to_device(gate), to_device(up), out, act);
      expect_close(widen(ref), device_f32(out), 1e-6, 1e-5, "gated_act " + tag);

      Tensor packed = random_host({T, 2 * F}, DType::kF32, -8.0f, 8.0f);
      Tensor ref_p = Tensor::zeros({T, F}, DType::kF32), out_p = cuda_->alloc({T, F}, DType::kF32);
      cpu_->gated_act_packed(packed, ref_p, act);
      cuda_->gated_act_packed(to_device(packed), out_p, act);
      expect_close(widen(ref_p), device_f32(out_p), 1e-6, 1e-5, "gated_act_packed " + tag);
    }
  }
}

TEST_F(CudaBackendTest, ScaleAndSoftcapMatch) {
  for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{1000}, int64_t{70001}}) {
    // Gemma's embedding scale sqrt(hidden), and an arbitrary one: one rounding, exact.
    for (float factor : {std::sqrt(3072.0f), -0.37f}) {
      Tensor x = random_host({n}, DType::kF32, -4.0f, 4.0f);
      Tensor ref = host_copy(x);
      cpu_->scale(ref, factor);
      Tensor xd = to_device(x);
      cuda_->scale(xd, factor);
      expect_close(widen(ref), device_f32(xd), 0, 0,
                   "scale by " + std::to_string(factor) + " n=" + std::to_string(n));
    }
    // Gemma 2's final-logit cap (30) and a small one, over values well past both.
    for (float cap : {30.0f, 0.5f}) {
      Tensor x = random_host({n}, DType::kF32, -100.0f, 100.0f);
      Tensor ref = host_copy(x);
      cpu_->softcap(ref, cap);
      Tensor xd = to_device(x);
      cuda_->softcap(xd, cap);
      expect_close(widen(ref), device_f32(xd), 1e-6, 1e-5,
                   "softcap " + std::to_string(cap) + " n=" + std::to_string(n));
    }
  }
}

// Greedy verification on the device: the same ids as the CPU (ties to the lowest id: a row of
// repeated maxima), logprobs within the two exps' rounding; vocabularies short and long.
TEST_F(CudaBackendTest, GreedyRowsMatch) {
  for (int64_t vocab : {int64_t{1}, int64_t{7}, int64_t{1024}, int64_t{151936}}) {
    Tensor logits = random_host({5, vocab}, DType::kF32, -20.0f, 20.0f);
    float* l = logits.data<float>();
    for (int64_t i = 0; i < vocab; i += 3) l[2 * vocab + i] = 25.0f;  // row 2: ties everywhere
    l[3 * vocab + vocab - 1] = 30.0f;                                  // row 3: the max is last
    Tensor ids = Tensor::zeros({5}, DType::kI32), lps = Tensor::zeros({5}, DType::kF32);
    cpu_->greedy_rows(logits, ids, lps);
    Tensor d_ids = cuda_->alloc({5}, DType::kI32), d_lps = cuda_->alloc({5}, DType::kF32);
    cuda_->greedy_rows(to_device(logits), d_ids, d_lps);
    const std::string tag = "vocab " + std::to_string(vocab);
    expect_close(widen(ids), device_f32(d_ids), 0, 0, tag + " ids");
    expect_close(widen(lps), device_f32(d_lps), 1e-5, 1e-5, tag + " logprobs");
  }
}

// Speculative sampling's check on the device: the same verdicts and tokens as the CPU for
// random weights with zeros (tokens p forbids, tokens q never proposes), proposals drawn
// anywhere (also where q is 0), rows where q equals p (a rejected proposal then draws from p
// itself), over vocabularies short and long.
TEST_F(CudaBackendTest, RejectionSampleRowsMatch) {
  std::mt19937_64 rng(23);
  for (int64_t vocab : {int64_t{1}, int64_t{5}, int64_t{1000}, int64_t{151936}}) {
    const int64_t rows = 64;
    Tensor p = random_host({rows, vocab}, DType::kF32, 0.0f, 1.0f);
    Tensor q = random_host({rows, vocab}, DType::kF32, 0.0f, 1.0f);
    float* pw = p.data<float>();
    float* qw = q.data<float>();
    for (int64_t i = 0; i < rows * vocab; i += 3) pw[i] = 0.0f;
    for (int64_t i = 0; i < rows * vocab; i += 5) qw[i] = 0.0f;
    for (int64_t r = 0; r < rows; r += 4)
      for (int64_t i = 0; i < vocab; ++i) qw[r * vocab + i] = pw[r * vocab + i];
    Tensor proposals = Tensor::zeros({rows}, DType::kI32), uniforms = Tensor::zeros({rows, 2}, DType::kI64);
    for (int64_t r = 0; r < rows; ++r) {
      proposals.data<int32_t>()[r] = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
      uniforms.data<int64_t>()[2 * r] = static_cast<int64_t>(rng() >> 11);
      uniforms.data<int64_t>()[2 * r + 1] = static_cast<int64_t>(rng() >> 11);
    }
    Tensor tokens = Tensor::zeros({rows}, DType::kI32), kept = Tensor::zeros({rows}, DType::kI32);
    cpu_->rejection_sample_rows(p, q, proposals, uniforms, tokens, kept);
    Tensor d_tokens = cuda_->alloc({rows}, DType::kI32), d_kept = cuda_->alloc({rows}, DType::kI32);
    cuda_->rejection_sample_rows(to_device(p), to_device(q), to_device(proposals), uniforms, d_tokens, d_kept);
    const std::string tag = "vocab " + std::to_string(vocab);
    expect_close(widen(tokens), device_f32(d_tokens), 0, 0, tag + " tokens");
    expect_close(widen(kept), device_f32(d_kept), 0, 0, tag + " accepted");
  }
}

// ---- rotary and per-head norms ---------------------------------------------------------------

// inv_freq as transformers builds it in float32 for `dims` rotated dims:
// 1 / theta ** (arange(0, dims, 2).float() / dims).
Tensor rope_inv_freq(float theta, int64_t dims) {
  Tensor t = Tensor::zeros({dims / 2}, DType::kF32);
  for (int64_t i = 0; i < dims / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dims);
    t.data<float>()[i] = 1.0f / std::pow(theta, exponent);
  }
  return t;
}

// Heads [tokens, heads, head_dim] inside wider rows of t (q or k of a packed qkv row): `lead`
// columns before them.
TensorView heads_in_rows(const Tensor& t, int64_t lead, int64_t heads, int64_t head_dim) {
  return t.view().columns(lead, heads * head_dim).reshape({t.dim(0), heads, head_dim});
}

TensorView host_positions(std::vector<int32_t>& positions) {
  return TensorView(positions.data(), DType::kI32, {static_cast<int64_t>(positions.size())});
}

TEST_F(CudaBackendTest, RotaryMatchesOnStridedRowsAndLeavesTheRestAlone) {
  struct Case { int64_t tokens, heads, head_dim, extra; float theta; };
  for (Case c : {Case{1, 1, 2, 0, 10000.0f}, Case{5, 4, 64, 0, 10000.0f}, Case{9, 3, 80, 37, 1e6f},
                 Case{4, 2, 128, 128, 500000.0f}, Case{17, 8, 96, 5, 10000.0f}}) {
    const int64_t stride = c.heads * c.head_dim + c.extra;
    Tensor x = random_host({c.tokens, stride}, DType::kF32);
    std::uniform_int_distribution<int32_t> pos(0, 8191);
    std::vector<int32_t> positions(c.tokens);
    for (int32_t& p : positions) p = pos(rng_);
    positions[0] = 0;
    Tensor ref = host_copy(x);
    const Tensor inv_freq = rope_inv_freq(c.theta, c.head_dim);
    cpu_->rotary(heads_in_rows(ref, 0, c.heads, c.head_dim), host_positions(positions), inv_freq);
    Tensor xd = to_device(x), inv_freq_d = to_device(inv_freq);
    cuda_->rotary(heads_in_rows(xd, 0, c.heads, c.head_dim), host_positions(positions), inv_freq_d);
    expect_close(widen(ref), device_f32(xd), 1e-6, 1e-5,
                 "rotary heads=" + std::to_string(c.heads) + " head_dim=" + std::to_string(c.head_dim));
  }
}

TEST_F(CudaBackendTest, PartialRotaryTurnsOnlyTheFirstRDimsOfEachHead) {
  // GPT-NeoX's rotary_pct: R = rot dims of each head rotate (pairs i, i + R/2), the rest
  // pass through. x is a view into wider rows (k inside a packed qkv row): `lead` columns
  // before it, `extra` after.
  // `magnitude` scales cos and sin (LongRoPE's attention factor), in the rotated dims only.
  struct Case { int64_t tokens, heads, head_dim, rot, lead, extra; float theta, magnitude; };
  for (Case c : {Case{1, 1, 4, 2, 0, 0, 10000.0f, 1.0f}, Case{3, 2, 64, 16, 128, 5, 10000.0f, 1.0f},
                 Case{7, 4, 80, 20, 0, 33, 10000.0f, 1.19f}, Case{5, 3, 128, 64, 384, 0, 1e6f, 1.0f},
                 Case{9, 8, 96, 94, 7, 1, 500000.0f, 0.75f}}) {
    const int64_t stride = c.lead + c.heads * c.head_dim + c.extra;
    Tensor x = random_host({c.tokens, stride}, DType::kF32);
    std::uniform_int_distribution<int32_t> pos(0, 8191);
    std::vector<int32_t> positions(c.tokens);
    for (int32_t& p : positions) p = pos(rng_);
    const Tensor inv_freq = rope_inv_freq(c.theta, c.rot);
    Tensor ref = host_copy(x);
    cpu_->rotary(heads_in_rows(ref, c.lead, c.heads, c.head_dim), host_positions(positions), inv_freq, c.magnitude);
    Tensor xd = to_device(x), inv_freq_d = to_device(inv_freq);
    cuda_->rotary(heads_in_rows(xd, c.lead, c.heads, c.head_dim), host_positions(positions), inv_freq_d,
                  c.magnitude);
    const std::vector<float> got = device_f32(xd), in = widen(x);
    std::ostringstream tag;
    tag << "partial rotary " << c.rot << " of " << c.head_dim << " heads=" << c.heads << " magnitude " << c.magnitude;
    expect_close(widen(ref), got, 1e-6, 1e-5, tag.str());
    // Everything outside the rotated dims is the input, bit for bit.
    int64_t touched = 0;
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int64_t col = 0; col < stride; ++col) {
        const int64_t in_heads = col - c.lead;
        const bool rotated = in_heads >= 0 && in_heads < c.heads * c.head_dim && in_heads % c.head_dim < c.rot;
        if (!rotated && got[t * stride + col] != in[t * stride + col]) ++touched;
      }
    }
    EXPECT_EQ(touched, 0) << tag.str() << ": elements outside the rotated dims changed";
  }
}

TEST_F(CudaBackendTest, HeadRmsNormMatchesOnStridedRowsForEveryGammaDtype) {
  // Qwen3's q_norm / k_norm: every head vector normalised on its own with one shared gamma,
  // in place inside wider rows (q or k of a packed qkv row).
  struct Case { int64_t tokens, heads, head_dim, lead, extra; };
  for (DType gt : kFloatTypes) {
    for (Case c : {Case{1, 1, 1, 0, 0}, Case{5, 4, 64, 0, 0}, Case{7, 3, 128, 24, 37}, Case{3, 2, 256, 0, 5},
                   Case{9, 8, 96, 192, 13}, Case{33, 16, 128, 0, 1024}}) {
      const int64_t stride = c.lead + c.heads * c.head_dim + c.extra;
      Tensor x = random_host({c.tokens, stride}, DType::kF32, -3.0f, 3.0f);
      Tensor gamma = random_host({c.head_dim}, gt, 0.5f, 1.5f);
      Tensor ref = host_copy(x);
      cpu_->head_rms_norm(heads_in_rows(ref, c.lead, c.heads, c.head_dim), gamma, 1e-6f);
      Tensor xd = to_device(x), gamma_d = to_device(gamma);
      cuda_->head_rms_norm(heads_in_rows(xd, c.lead, c.heads, c.head_dim), gamma_d, 1e-6f);
      const std::vector<float> got = device_f32(xd), in = widen(x);
      std::ostringstream tag;
      tag << "head_rms_norm " << dtype_name(gt) << " heads=" << c.heads << " head_dim=" << c.head_dim << " stride="
          << stride;
      expect_close(widen(ref), got, 1e-5, 1e-5, tag.str());
      int64_t touched = 0;
      for (int64_t t = 0; t < c.tokens; ++t) {
        for (int64_t col = 0; col < stride; ++col) {
          const bool normed = col >= c.lead && col < c.lead + c.heads * c.head_dim;
          if (!normed && got[t * stride + col] != in[t * stride + col]) ++touched;
        }
      }
      EXPECT_EQ(touched, 0) << tag.str() << ": elements outside the heads changed";
    }
  }
}

// ---- paged KV cache and attention ------------------------------------------------------------

// A ragged batch over a paged pool: each sequence gets `past` cached and `fresh` new tokens,
// its blocks a random (non-contiguous) choice from the pool, tables padded with -1.

TEST_F(CudaBackendTest, CopyBlockCopiesOneBlockOfThePool) {
  for (DType ct : kFloatTypes) {
    Tensor pool = random_host({6, 4, 2, 8}, ct);
    Tensor pool_d = to_device(pool);
    for (auto [src, dst] : {std::pair<int, int>{1, 4}, {5, 0}, {2, 2}}) {
      cpu_->copy_block(pool, src, dst);
      cuda_->copy_block(pool_d, src, dst);
    }
    expect_close(widen(pool), device_f32(pool_d), 0, 0, std::string("copy_block ") + dtype_name(ct));
  }
}

// ---- mixture of experts ----------------------------------------------------------------------

TEST_F(CudaBackendTest, MoeTopkPicksTheSameExpertsWithTiesToTheLowerId) { check_moe_topk(/*normalize=*/true); }

TEST_F(CudaBackendTest, MoeTopkWithoutNormalizationKeepsTheSoftmaxProbabilities) {
  // Qwen2-MoE's norm_topk_prob = false: same experts, weights the plain probabilities.
  check_moe_topk(/*normalize=*/false);
}

TEST_F(CudaBackendTest, GatherRowsAndScatterAddScaledMatch) {
  for (int64_t hidden : {int64_t{1}, int64_t{33}, int64_t{1000}}) {
    const int64_t n = 11;
    Tensor x = random_host({n, hidden}, DType::kF32);
    const std::vector<int32_t> gather = {10, 0, 3, 3, 7, 10};
    Tensor ref = Tensor::zeros({6, hidden}, DType::kF32), out = cuda_->alloc({6, hidden}, DType::kF32);
    Tensor x_d = to_device(x);
    cpu_->gather_rows(x, gather, ref);
    cuda_->gather_rows(x_d, gather, out);
    expect_close(widen(ref), device_f32(out), 0, 0, "gather_rows h=" + std::to_string(hidden));

    // Distinct rows (the MoE case) and repeated rows (allowed by the interface).
    for (const std::vector<int32_t>& rows : {std::vector<int32_t>{4, 0, 9, 2}, std::vector<int32_t>{4, 0, 4, 4}}) {
      Tensor src = random_host({static_cast<int64_t>(rows.size()), hidden}, DType::kF32);
      const std::vector<float> scale = {0.25f, -1.5f, 0.7f, 2.0f};
      Tensor acc = random_host({10, hidden}, DType::kF32);
      Tensor acc_d = to_device(acc);
      cpu_->scatter_add_scaled(src, rows, scale, acc);
      cuda_->scatter_add_scaled(to_device(src), rows, scale, acc_d);
      expect_close(widen(acc), device_f32(acc_d), 1e-6, 1e-6, "scatter_add_scaled h=" + std::to_string(hidden));
    }
  }
}

// ---- backend selection -----------------------------------------------------------------------

// Runs everywhere: without a device, "cuda" is a clear error and "auto" is the CPU.
TEST(CudaBackendSelection, CudaWithoutADeviceIsAClearErrorAndAutoFallsBackToTheCpu) {
  auto cuda = make_backend("cuda");
  auto autob = make_backend("auto");
  ASSERT_TRUE(autob.is_ok()) << autob.status().to_string();
  if (cuda.is_ok()) {
    EXPECT_EQ(cuda.value()->kind(), BackendKind::kCuda);
    EXPECT_EQ(autob.value()->kind(), BackendKind::kCuda);
    return;
  }
  const std::string msg = cuda.status().message();
  EXPECT_TRUE(cuda.status().code() == StatusCode::kUnimplemented || cuda.status().code() == StatusCode::kUnavailable)
      << cuda.status().to_string();
  EXPECT_NE(msg.find("backend 'cuda'"), std::string::npos) << msg;
  EXPECT_TRUE(msg.find("no CUDA support") != std::string::npos ||
              msg.find("no usable CUDA device") != std::string::npos)
      << msg;
  EXPECT_EQ(autob.value()->kind(), BackendKind::kCpu);
  EXPECT_FALSE(make_backend("tpu").is_ok());
}

}  // namespace
}  // namespace tessera
