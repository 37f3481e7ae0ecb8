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
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/tensor.h"
#include "kernels/backend.h"

namespace tessera {
namespace {

const DType kFloatTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
const Activation kActivations[] = {Activation::kNone, Activation::kGeluTanh, Activation::kGeluErf,
                                   Activation::kSilu};
// Those a gated MLP can use (gated_act rejects kNone).
const Activation kGatedActivations[] = {Activation::kGeluTanh, Activation::kGeluErf, Activation::kSilu};

// ---- host helpers ----------------------------------------------------------------------------

std::vector<float> widen(const TensorView& host) {
  std::vector<float> out(host.numel());
  if (host.dtype == DType::kI32) {
    for (int64_t i = 0; i < host.numel(); ++i) out[i] = static_cast<float>(host.as<int32_t>()[i]);
  } else {
    convert_elements(host.data, host.dtype, out.data(), DType::kF32, out.size());
  }
  return out;
}

// Every element within atol + rtol * |ref|; the first few failures and the worst are named.
// ALiBi-like slopes 2^-(h+1) for the attention tests.
Tensor alibi_test_slopes(int64_t q_heads) {
  Tensor slopes = Tensor::zeros({q_heads}, DType::kF32);
  for (int64_t h = 0; h < q_heads; ++h) slopes.data<float>()[h] = std::pow(2.0f, -static_cast<float>(h + 1));
  return slopes;
}

void expect_close(const std::vector<float>& ref, const std::vector<float>& got, double atol, double rtol,
                  const std::string& what, const std::vector<double>* per_element_tol = nullptr) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  int64_t bad = 0;
  double worst = 0;
  std::ostringstream first;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double tol = per_element_tol ? (*per_element_tol)[i] : atol + rtol * std::fabs(ref[i]);
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    worst = std::max(worst, err);
    if (!(err <= tol)) {  // NaN fails too
      if (bad < 5) first << "\n  [" << i << "] cpu " << ref[i] << " cuda " << got[i] << " (tol " << tol << ")";
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.size() << " elements out of tolerance, max |err| "
                    << worst << first.str();
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cuda = make_backend("cuda");
    if (!cuda.is_ok()) {
      const StatusCode code = cuda.status().code();
      if (code == StatusCode::kUnimplemented || code == StatusCode::kUnavailable) {
        GTEST_SKIP() << "SKIPPED: no CUDA device (" << cuda.status().message() << ")";
      }
      FAIL() << "a CUDA device is present but the backend failed: " << cuda.status().to_string();
    }
    cuda_ = std::move(cuda).value();
    ASSERT_EQ(cuda_->kind(), BackendKind::kCuda);
    auto cpu = make_backend("cpu");
    ASSERT_TRUE(cpu.is_ok());
    cpu_ = std::move(cpu).value();
  }

  // Host tensor of uniform values in [lo, hi), stored in `dtype` (rounded once).
  Tensor random_host(const std::vector<int64_t>& dims, DType dtype, float lo = -1.0f, float hi = 1.0f) {
    Tensor t = Tensor::zeros(dims, dtype);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(t.numel());
    for (float& x : v) x = dist(rng_);
    convert_elements(v.data(), DType::kF32, t.data<void>(), dtype, v.size());
    return t;
  }
  Tensor host_ints(const std::vector<int32_t>& values) {
    Tensor t = Tensor::zeros({static_cast<int64_t>(values.size())}, DType::kI32);
    std::copy(values.begin(), values.end(), t.data<int32_t>());
    return t;
  }
  Tensor host_copy(const Tensor& h) {
    Tensor t = Tensor::zeros(h.view().dims(), h.dtype());
    std::memcpy(t.data<void>(), h.data<void>(), h.nbytes());
    return t;
  }
  Tensor to_device(const Tensor& host) {
    Tensor d = cuda_->alloc(host.view().dims(), host.dtype());
    cuda_->copy_from_host(host.data<void>(), d.view());
    return d;
  }
  Tensor to_host(const TensorView& dev) {
    Tensor h = Tensor::zeros(dev.dims(), dev.dtype);
    cuda_->copy_to_host(dev, h.data<void>());
    return h;
  }
  std::vector<float> device_f32(const TensorView& dev) { return widen(to_host(dev).view()); }

  void check_moe_topk(bool normalize) {
    struct Case { int64_t tokens, experts; int top_k; };
    for (Case c : {Case{9, 8, 2}, Case{5, 5, 3}, Case{33, 64, 6}, Case{4, 3, 3}, Case{1, 1, 1}}) {
      Tensor logits = random_host({c.tokens, c.experts}, DType::kF32, -4.0f, 4.0f);
      float* l = logits.data<float>();
      for (int64_t e = 0; e < c.experts; ++e) l[e] = 0.5f;  // row 0: every expert tied
      if (c.tokens > 1 && c.experts > 2) {
        l[c.experts + 2] = l[c.experts + 1] = 9.0f;  // row 1: a tied top pair
      }
      Tensor w_ref = Tensor::zeros({c.tokens, c.top_k}, DType::kF32);
      Tensor id_ref = Tensor::zeros({c.tokens, c.top_k}, DType::kI32);
      cpu_->moe_topk(logits, c.top_k, normalize, w_ref, id_ref);
      Tensor w = cuda_->alloc({c.tokens, c.top_k}, DType::kF32);
      Tensor ids = cuda_->alloc({c.tokens, c.top_k}, DType::kI32);
      cuda_->moe_topk(to_device(logits), c.top_k, normalize, w, ids);
      const std::string tag = std::string("moe_topk") + (normalize ? "" : " unnormalised") +
                              " E=" + std::to_string(c.experts) + " k=" + std::to_string(c.top_k);
      expect_close(widen(id_ref), widen(to_host(ids).view()), 0, 0, tag + " ids");
      expect_close(widen(w_ref), device_f32(w), 1e-6, 1e-5, tag + " weights");
    }
  }

  std::unique_ptr<Backend> cpu_, cuda_;
  std::mt19937 rng_{20240607};
};

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

TEST_F(CudaBackendTest, HostResidentWeightsAreMirroredAndRefreshedWhenTheyChange) {
  // The worker hands the backend weights in host memory (loaded checkpoints): the CUDA
  // backend mirrors them on first use and must notice a host buffer holding new values.
  for (DType wt : kFloatTypes) {
    Tensor x = random_host({5, 96}, DType::kF32);
    Tensor w = random_host({70, 96}, wt, -0.5f, 0.5f);
    Tensor b = random_host({70}, DType::kF32);
    Tensor gamma = random_host({96}, wt, 0.5f, 1.5f);
    Tensor x_d = to_device(x);
    for (int round = 0; round < 2; ++round) {
      Tensor ref = Tensor::zeros({5, 70}, DType::kF32);
      cpu_->linear(x, w, b, ref);
      Tensor out = cuda_->alloc({5, 70}, DType::kF32);
      cuda_->linear(x_d, w, b, out);  // w and b are host views
      const std::vector<double> tol = LinearCase::tolerance(x, w, false);
      expect_close(widen(ref), device_f32(out), 0, 0, std::string("host-weight linear ") + dtype_name(wt), &tol);
      Tensor ref_n = Tensor::zeros({5, 96}, DType::kF32), out_n = cuda_->alloc({5, 96}, DType::kF32);
      cpu_->rms_norm(x, gamma, 1e-5f, ref_n);
      cuda_->rms_norm(x_d, gamma, 1e-5f, out_n);
      expect_close(widen(ref_n), device_f32(out_n), 1e-5, 1e-5, std::string("host-gamma rms_norm ") + dtype_name(wt));
      // Same addresses, new contents.
      Tensor w2 = random_host({70, 96}, wt, -0.5f, 0.5f), g2 = random_host({96}, wt, 0.5f, 1.5f);
      std::memcpy(w.data<void>(), w2.data<void>(), w.nbytes());
      std::memcpy(gamma.data<void>(), g2.data<void>(), gamma.nbytes());
    }
  }
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
    cpu_->rotary(ref.data<float>(), c.tokens, c.heads, c.head_dim, stride, positions.data(), inv_freq);
    Tensor xd = to_device(x), inv_freq_d = to_device(inv_freq);
    cuda_->rotary(xd.data<float>(), c.tokens, c.heads, c.head_dim, stride, positions.data(), inv_freq_d);
    expect_close(widen(ref), device_f32(xd), 1e-6, 1e-5,
                 "rotary heads=" + std::to_string(c.heads) + " head_dim=" + std::to_string(c.head_dim));
  }
}

TEST_F(CudaBackendTest, PartialRotaryTurnsOnlyTheFirstRDimsOfEachHead) {
  // GPT-NeoX's rotary_pct: R = rot dims of each head rotate (pairs i, i + R/2), the rest
  // pass through. x is a view into wider rows (k inside a packed qkv row): `lead` columns
  // before it, `extra` after.
  struct Case { int64_t tokens, heads, head_dim, rot, lead, extra; float theta; };
  for (Case c : {Case{1, 1, 4, 2, 0, 0, 10000.0f}, Case{3, 2, 64, 16, 128, 5, 10000.0f},
                 Case{7, 4, 80, 20, 0, 33, 10000.0f}, Case{5, 3, 128, 64, 384, 0, 1e6f},
                 Case{9, 8, 96, 94, 7, 1, 500000.0f}}) {
    const int64_t stride = c.lead + c.heads * c.head_dim + c.extra;
    Tensor x = random_host({c.tokens, stride}, DType::kF32);
    std::uniform_int_distribution<int32_t> pos(0, 8191);
    std::vector<int32_t> positions(c.tokens);
    for (int32_t& p : positions) p = pos(rng_);
    const Tensor inv_freq = rope_inv_freq(c.theta, c.rot);
    Tensor ref = host_copy(x);
    cpu_->rotary(ref.data<float>() + c.lead, c.tokens, c.heads, c.head_dim, stride, positions.data(), inv_freq);
    Tensor xd = to_device(x), inv_freq_d = to_device(inv_freq);
    cuda_->rotary(xd.data<float>() + c.lead, c.tokens, c.heads, c.head_dim, stride, positions.data(), inv_freq_d);
    const std::vector<float> got = device_f32(xd), in = widen(x);
    std::ostringstream tag;
    tag << "partial rotary " << c.rot << " of " << c.head_dim << " heads=" << c.heads;
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
      cpu_->head_rms_norm(ref.data<float>() + c.lead, c.tokens, c.heads, c.head_dim, stride, gamma, 1e-6f);
      Tensor xd = to_device(x), gamma_d = to_device(gamma);
      cuda_->head_rms_norm(xd.data<float>() + c.lead, c.tokens, c.heads, c.head_dim, stride, gamma_d, 1e-6f);
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
struct Batch {
  AttentionBatch batch;
  int64_t tokens = 0;
  int64_t num_blocks = 0;
};

Batch make_batch(const std::vector<std::pair<int, int>>& past_fresh, int block_size, std::mt19937& rng) {
  Batch b;
  std::vector<int> need;
  int max_blocks = 0;
  for (auto [past, fresh] : past_fresh) {
    need.push_back((past + fresh + block_size - 1) / block_size);
    max_blocks = std::max(max_blocks, need.back());
  }
  b.num_blocks = std::accumulate(need.begin(), need.end(), 0) + 3;  // some blocks stay unused
  std::vector<int32_t> ids(b.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  b.batch.max_blocks_per_seq = max_blocks + 1;
  b.batch.query_start.push_back(0);
  size_t next = 0;
  for (size_t s = 0; s < past_fresh.size(); ++s) {
    const auto [past, fresh] = past_fresh[s];
    std::vector<int32_t> table(b.batch.max_blocks_per_seq, -1);
    for (int i = 0; i < need[s]; ++i) table[i] = ids[next++];
    for (int p = past; p < past + fresh; ++p) {
      b.batch.slot_mapping.push_back(table[p / block_size] * block_size + p % block_size);
    }
    b.batch.block_tables.insert(b.batch.block_tables.end(), table.begin(), table.end());
    b.batch.context_lens.push_back(past + fresh);
    b.batch.query_start.push_back(b.batch.query_start.back() + fresh);
  }
  b.tokens = b.batch.query_start.back();
  return b;
}

// Prefill from empty, a decode row deep into a context, a chunked prefill after a cached
// prefix, a first-token decode, a long decode crossing many blocks.
const std::vector<std::pair<int, int>> kMixedBatch = {{0, 7}, {36, 1}, {20, 5}, {0, 1}, {130, 1}};

TEST_F(CudaBackendTest, WriteKvScattersRowsToTheirSlotsInEveryCacheDtype) {
  for (DType ct : kFloatTypes) {
    for (int block_size : {5, 16}) {
      Batch b = make_batch(kMixedBatch, block_size, rng_);
      const int64_t kv_heads = 2, head_dim = 6, width = kv_heads * head_dim, stride = 3 * width + 4;
      Tensor kv = random_host({b.tokens, stride}, DType::kF32, -3.0f, 3.0f);
      Tensor kc = Tensor::zeros({b.num_blocks, block_size, kv_heads, head_dim}, ct);
      Tensor vc = Tensor::zeros({b.num_blocks, block_size, kv_heads, head_dim}, ct);
      const float* k = kv.data<float>() + width;  // k and v as slices of a packed qkv row
      const float* v = kv.data<float>() + 2 * width;
      cpu_->write_kv(k, v, b.tokens, stride, b.batch, kc, vc);
      Tensor kv_d = to_device(kv);
      Tensor kc_d = cuda_->alloc(kc.view().dims(), ct), vc_d = cuda_->alloc(vc.view().dims(), ct);
      const float* kv_base = kv_d.data<float>();
      cuda_->write_kv(kv_base + width, kv_base + 2 * width, b.tokens, stride, b.batch, kc_d, vc_d);
      const std::string tag = std::string(dtype_name(ct)) + " block " + std::to_string(block_size);
      expect_close(widen(kc), device_f32(kc_d), 0, 0, "k cache " + tag);
      expect_close(widen(vc), device_f32(vc_d), 0, 0, "v cache " + tag);
    }
  }
}

struct AttnCase {
  int64_t q_heads, kv_heads, head_dim;
  int block_size;
  DType cache;
  bool alibi;
  GqaLayout gqa;  // group 0: derived from the head counts
};

TEST_F(CudaBackendTest, PagedAttentionMatchesForPrefillAndDecodeRows) {
  const AttnCase cases[] = {
      {4, 4, 64, 16, DType::kF32, false, {}},
      {8, 2, 128, 16, DType::kF16, true, {}},
      {6, 1, 40, 5, DType::kBF16, false, {}},
      {4, 2, 80, 7, DType::kF32, true, {}},
      // Tensor-parallel rank: global 8 query / 4 KV heads; this rank has query heads 2..4,
      // which read global KV heads 1..2, cached here as local heads 0..1.
      {3, 2, 96, 16, DType::kF16, true, {2, 2, 1}},
      {2, 1, 256, 16, DType::kF16, false, {}},
      {5, 5, 33, 3, DType::kBF16, true, {}},
      {1, 1, 1, 4, DType::kF32, false, {}},
  };
  for (const AttnCase& c : cases) {
    Batch b = make_batch(kMixedBatch, c.block_size, rng_);
    const int64_t D = c.head_dim, q_stride = c.q_heads * D + 13;
    Tensor q = random_host({b.tokens, q_stride}, DType::kF32);
    Tensor kc = random_host({b.num_blocks, c.block_size, c.kv_heads, D}, c.cache);
    Tensor vc = random_host({b.num_blocks, c.block_size, c.kv_heads, D}, c.cache);
    const Tensor slopes = c.alibi ? alibi_test_slopes(c.q_heads) : Tensor();
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    Tensor ref = Tensor::zeros({b.tokens, c.q_heads * D}, DType::kF32);
    cpu_->attention(q.data<float>(), q_stride, c.q_heads, b.batch, kc, vc, {.scale = scale, .alibi_slopes = slopes},
                    ref, c.gqa);
    Tensor q_d = to_device(q), kc_d = to_device(kc), vc_d = to_device(vc);
    Tensor slopes_d = c.alibi ? to_device(slopes) : Tensor();
    Tensor out = cuda_->alloc({b.tokens, c.q_heads * D}, DType::kF32);
    cuda_->attention(q_d.data<float>(), q_stride, c.q_heads, b.batch, kc_d, vc_d,
                     {.scale = scale, .alibi_slopes = slopes_d}, out, c.gqa);
    std::ostringstream tag;
    tag << "attention q_heads=" << c.q_heads << " kv_heads=" << c.kv_heads << " head_dim=" << D << " block="
        << c.block_size << " " << dtype_name(c.cache) << (c.alibi ? " alibi" : "") << " gqa offset "
        << c.gqa.q_head_offset;
    expect_close(widen(ref), device_f32(out), 1e-5, 1e-5, tag.str());
  }
}

// What a scheduler may free once a sliding window has moved past it: for each sequence, the
// blocks wholly before the first key any of its new tokens reads get table entry -1, and
// the keys and values before that first key in the first kept block become NaN. A backend
// that read outside the window would fail its own block check on a -1 entry, fault, or put
// NaN in its output. Returns how many table entries were dropped.
int drop_outside_window(AttentionBatch& batch, int block_size, int32_t window, Tensor& kc, Tensor& vc) {
  const int64_t slot_width = kc.dim(2) * kc.dim(3);
  const size_t esize = dtype_size(kc.dtype());
  std::vector<char> nan_row(slot_width * esize);
  const std::vector<float> nans(slot_width, std::nanf(""));
  convert_elements(nans.data(), DType::kF32, nan_row.data(), kc.dtype(), slot_width);
  int dropped = 0;
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const int32_t n_new = batch.query_start[s + 1] - batch.query_start[s];
    const int32_t first_key = std::max(0, batch.context_lens[s] - n_new - window + 1);
    int32_t* table = batch.block_tables.data() + static_cast<int64_t>(s) * batch.max_blocks_per_seq;
    for (int b = 0; b < first_key / block_size; ++b) {
      table[b] = -1;
      ++dropped;
    }
    for (int32_t j = first_key / block_size * block_size; j < first_key; ++j) {
      const int64_t slot = static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
      std::memcpy(kc.data<char>() + slot * slot_width * esize, nan_row.data(), nan_row.size());
      std::memcpy(vc.data<char>() + slot * slot_width * esize, nan_row.data(), nan_row.size());
    }
  }
  return dropped;
}

TEST_F(CudaBackendTest, PagedAttentionWithSlidingWindowAndSoftcapMatches) {
  struct Case {
    int64_t q_heads, kv_heads, head_dim;
    int block_size;
    DType cache;
    bool alibi;
    int32_t window;  // 0: none
    float softcap;   // 0: none
  };
  const Case cases[] = {
      // Sliding window only: one key, a few, Mistral's shape, with ALiBi, wider than every context.
      {4, 4, 64, 16, DType::kF32, false, 1, 0.0f},
      {6, 1, 40, 5, DType::kBF16, false, 7, 0.0f},
      {8, 2, 128, 16, DType::kF16, false, 16, 0.0f},
      {4, 2, 80, 7, DType::kF32, true, 30, 0.0f},
      {2, 1, 64, 4, DType::kF32, false, 1000, 0.0f},
      // Soft cap only: caps near the scores' size (of order 1 here, see q below), and Gemma 2's 50.
      {4, 4, 64, 16, DType::kF32, false, 0, 1.5f},
      {3, 3, 33, 3, DType::kF16, true, 0, 3.0f},
      {8, 4, 256, 16, DType::kBF16, false, 0, 50.0f},
      // Both, as Gemma 2's sliding layers use them.
      {8, 4, 256, 16, DType::kBF16, false, 16, 50.0f},
      {4, 2, 64, 5, DType::kF16, false, 9, 2.0f},
      {6, 2, 96, 7, DType::kF32, true, 3, 1.0f},
  };
  for (const Case& c : cases) {
    Batch b = make_batch(kMixedBatch, c.block_size, rng_);
    const int64_t D = c.head_dim, q_stride = c.q_heads * D + 3;
    // Wider q than the other attention tests (scores of standard deviation ~1 after the
    // scale), so that the small caps bend most scores.
    Tensor q = random_host({b.tokens, q_stride}, DType::kF32, -3.0f, 3.0f);
    Tensor kc = random_host({b.num_blocks, c.block_size, c.kv_heads, D}, c.cache);
    Tensor vc = random_host({b.num_blocks, c.block_size, c.kv_heads, D}, c.cache);
    const int dropped = c.window > 0 ? drop_outside_window(b.batch, c.block_size, c.window, kc, vc) : 0;
    if (c.window > 0 && c.window < 100) {
      // The 130-token decode row of kMixedBatch always leaves whole blocks behind.
      EXPECT_GT(dropped, 0) << "window " << c.window << " dropped no block";
    }
    const Tensor slopes = c.alibi ? alibi_test_slopes(c.q_heads) : Tensor();
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    Tensor ref = Tensor::zeros({b.tokens, c.q_heads * D}, DType::kF32);
    cpu_->attention(q.data<float>(), q_stride, c.q_heads, b.batch, kc, vc,
                    {.scale = scale, .softcap = c.softcap, .window = c.window, .alibi_slopes = slopes}, ref);
    Tensor q_d = to_device(q), kc_d = to_device(kc), vc_d = to_device(vc);
    Tensor slopes_d = c.alibi ? to_device(slopes) : Tensor();
    Tensor out = cuda_->alloc({b.tokens, c.q_heads * D}, DType::kF32);
    cuda_->attention(q_d.data<float>(), q_stride, c.q_heads, b.batch, kc_d, vc_d,
                     {.scale = scale, .softcap = c.softcap, .window = c.window, .alibi_slopes = slopes_d}, out);
    std::ostringstream tag;
    tag << "attention window=" << c.window << " softcap=" << c.softcap << " q_heads=" << c.q_heads
        << " kv_heads=" << c.kv_heads << " head_dim=" << D << " block=" << c.block_size << " "
        << dtype_name(c.cache) << (c.alibi ? " alibi" : "") << " (" << dropped << " blocks dropped)";
    expect_close(widen(ref), device_f32(out), 1e-5, 1e-5, tag.str());
  }
}

TEST_F(CudaBackendTest, WriteThenAttendOverManySteps) {
  // Decode loop as the executor drives it: write this step's K/V, attend, repeat; the
  // caches and outputs of both backends must stay together.
  const int block_size = 4;
  const int64_t q_heads = 4, kv_heads = 2, D = 32, width = (q_heads + 2 * kv_heads) * D;
  for (DType ct : kFloatTypes) {
    Batch full = make_batch({{0, 12}, {0, 9}}, block_size, rng_);
    Tensor kc = Tensor::zeros({full.num_blocks, block_size, kv_heads, D}, ct), vc = host_copy(kc);
    Tensor kc_d = cuda_->alloc(kc.view().dims(), ct), vc_d = cuda_->alloc(vc.view().dims(), ct);
    // Step 1: prefill of the first 8 and 5 tokens; then 4 decode steps of one token each.
    std::vector<std::pair<int, int>> steps = {{8, 5}};
    for (int i = 0; i < 4; ++i) steps.push_back({8 + i, 5 + i});
    for (size_t step = 0; step < steps.size(); ++step) {
      AttentionBatch ab;
      ab.max_blocks_per_seq = full.batch.max_blocks_per_seq;
      ab.block_tables = full.batch.block_tables;
      ab.query_start.push_back(0);
      for (int s = 0; s < 2; ++s) {
        const int past = step == 0 ? 0 : (s == 0 ? steps[step].first : steps[step].second);
        const int fresh = step == 0 ? (s == 0 ? steps[0].first : steps[0].second) : 1;
        const int32_t* table = full.batch.block_tables.data() + s * ab.max_blocks_per_seq;
        for (int p = past; p < past + fresh; ++p) {
          ab.slot_mapping.push_back(table[p / block_size] * block_size + p % block_size);
        }
        ab.context_lens.push_back(past + fresh);
        ab.query_start.push_back(ab.query_start.back() + fresh);
      }
      const int64_t T = ab.query_start.back();
      Tensor qkv = random_host({T, width}, DType::kF32);
      Tensor qkv_d = to_device(qkv);
      const float* base = qkv.data<float>();
      cpu_->write_kv(base + q_heads * D, base + (q_heads + kv_heads) * D, T, width, ab, kc, vc);
      const float* base_d = qkv_d.data<float>();
      cuda_->write_kv(base_d + q_heads * D, base_d + (q_heads + kv_heads) * D, T, width, ab, kc_d, vc_d);
      Tensor ref = Tensor::zeros({T, q_heads * D}, DType::kF32), out = cuda_->alloc({T, q_heads * D}, DType::kF32);
      AttentionParams params;
      params.scale = 0.125f;
      cpu_->attention(base, width, q_heads, ab, kc, vc, params, ref);
      cuda_->attention(base_d, width, q_heads, ab, kc_d, vc_d, params, out);
      expect_close(widen(ref), device_f32(out), 1e-5, 1e-5,
                   std::string("step ") + std::to_string(step) + " " + dtype_name(ct));
    }
    expect_close(widen(kc), device_f32(kc_d), 0, 0, std::string("k cache after the steps ") + dtype_name(ct));
  }
}

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
