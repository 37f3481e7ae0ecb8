#pragma once
// The CUDA-vs-CPU parity fixture shared by cuda_backend_test.cc (element-wise, norms,
// linear, rotary, routing) and cuda_attention_test.cc (KV cache and paged attention); the
// tolerances they use are explained in cuda_backend_test.cc.
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

namespace tessera::cuda_test {

const DType kFloatTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
const Activation kActivations[] = {Activation::kNone, Activation::kGeluTanh, Activation::kGeluErf,
                                   Activation::kSilu};
// Those a gated MLP can use (gated_act rejects kNone).
const Activation kGatedActivations[] = {Activation::kGeluTanh, Activation::kGeluErf, Activation::kSilu};

// ---- host helpers ----------------------------------------------------------------------------

inline std::vector<float> widen(const TensorView& host) {
  std::vector<float> out(host.numel());
  if (host.dtype == DType::kI32) {
    for (int64_t i = 0; i < host.numel(); ++i) out[i] = static_cast<float>(host.as<int32_t>()[i]);
  } else {
    convert_elements(host.data, host.dtype, out.data(), DType::kF32, out.size());
  }
  return out;
}

// ALiBi-like slopes 2^-(h+1) for the attention tests.
inline Tensor alibi_test_slopes(int64_t q_heads) {
  Tensor slopes = Tensor::zeros({q_heads}, DType::kF32);
  for (int64_t h = 0; h < q_heads; ++h) slopes.data<float>()[h] = std::pow(2.0f, -static_cast<float>(h + 1));
  return slopes;
}

// Every element within atol + rtol * |ref|; the first few failures and the worst are named.
inline void expect_close(const std::vector<float>& ref, const std::vector<float>& got, double atol, double rtol,
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

}  // namespace tessera::cuda_test
