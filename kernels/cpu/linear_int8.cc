// The CPU int8 linear layer's front (linear_int8.h): checks, regime by M, the ISA flavour,
// and the threading of both regimes.
#include "kernels/cpu/linear_int8.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/decode_chunks.h"
#include "kernels/cpu/gemm_packed.h"
#include "kernels/cpu/linear_int8_kernels.h"

namespace tessera::cpu {
namespace {

using detail::Int8LinearArgs;

void gemv_range(CpuIsa isa, const Int8LinearArgs& a, int64_t n0, int64_t n1) {
  switch (isa) {
    case CpuIsa::kAvx512: detail::gemv_int8_avx512(a, 0, a.M, n0, n1); break;
    case CpuIsa::kAvx2: detail::gemv_int8_avx2(a, 0, a.M, n0, n1); break;
    case CpuIsa::kScalar: detail::gemv_int8_scalar(a, 0, a.M, n0, n1); break;
  }
}

void dequantize(CpuIsa isa, const Int8LinearArgs& a, int64_t n0, int64_t n1, float* out) {
  switch (isa) {
    case CpuIsa::kAvx512: detail::dequantize_int8_avx512(a, n0, n1, out); break;
    case CpuIsa::kAvx2: detail::dequantize_int8_avx2(a, n0, n1, out); break;
    case CpuIsa::kScalar: detail::dequantize_int8_scalar(a, n0, n1, out); break;
  }
}

constexpr int64_t kMinParallelMacs = 32 * 1024;

// Decode, every GEMV flavour: weight rows (K bytes plus K / group scales each) in chunks
// that threads take dynamically (decode_chunks.h); run(n0, n1) computes rows [n0, n1).
template <typename RunRows>
void for_row_chunks(const Int8LinearArgs& a, RunRows run) {
  const int threads = omp_get_max_threads();
  if (threads == 1 || a.M * a.N * a.K < kMinParallelMacs || a.N < 2) {
    run(int64_t{0}, a.N);
    return;
  }
  const detail::DecodeChunks chunks(a.N, a.K + 4 * (a.K / a.group), 16, threads);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t c = 0; c < chunks.count(); ++c) run(chunks.begin(c), chunks.begin(c + 1));
}

void gemv(CpuIsa isa, const Int8LinearArgs& a) {
  for_row_chunks(a, [&](int64_t n0, int64_t n1) { gemv_range(isa, a, n0, n1); });
}

void x16_range(CpuIsa isa, const detail::Int16XArgs& d, int64_t n0, int64_t n1) {
  if (isa == CpuIsa::kAvx512 && detail::cpu_has_avx512_vnni()) {
    detail::gemv_int8_x16_avx512_vnni(d, n0, n1);
  } else {
    detail::gemv_int8_x16_avx2(d, n0, n1);
  }
}

// x rows in 16-bit fixed point (linear_int8_kernels.h), then the weight rows in chunks as
// gemv() does.
void gemv_int16_x(CpuIsa isa, const Int8LinearArgs& a) {
  const detail::Int16XArgs d = detail::quantize_x_int16(isa, a);
  for_row_chunks(a, [&](int64_t n0, int64_t n1) { x16_range(isa, d, n0, n1); });
}

void dot_range(CpuIsa isa, const detail::Int8DotArgs& d, int64_t n0, int64_t n1) {
  // AVX2's integer instructions serve AVX-512 CPUs without VNNI.
  if (isa == CpuIsa::kScalar) {
    detail::gemv_int8_dot_scalar(d, n0, n1);
  } else if (isa == CpuIsa::kAvx512 && detail::cpu_has_avx512_vnni()) {
    detail::gemv_int8_dot_avx512_vnni(d, n0, n1);
  } else {
    detail::gemv_int8_dot_avx2(d, n0, n1);
  }
}

// Decode with int8 activations: x quantized once per call (thread-local buffers, reused),
// then the weight rows in chunks as gemv() does.
void gemv_int8_activations(CpuIsa isa, const Int8LinearArgs& a) {
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> xs;
  const int64_t groups = a.K / a.group;
  xq.resize(static_cast<size_t>(a.M * a.K));
  xs.resize(static_cast<size_t>(a.M * groups));
  int8_t* q = xq.data();
  float* s = xs.data();
#pragma omp parallel for schedule(static) if (a.M * a.K >= (int64_t{1} << 16))
  for (int64_t m = 0; m < a.M; ++m) {
    if (isa == CpuIsa::kAvx512) {
      detail::quantize_row_int8_avx512(a.x + m * a.ldx, a.K, a.group, q + m * a.K, s + m * groups);
    } else {
      quantize_int8(a.x + m * a.ldx, DType::kF32, 1, a.K, a.group, q + m * a.K, s + m * groups);
    }
  }
  const detail::Int8DotArgs d{&a, xq.data(), xs.data()};
  for_row_chunks(a, [&](int64_t n0, int64_t n1) { dot_range(isa, d, n0, n1); });
}

// Rows per dequantized panel: ~1 MiB of f32 (it stays in L2 between dequantizing and the
// sgemm that reads it), at least 32 rows, a multiple of 16.
int64_t panel_rows(int64_t K) {
  const int64_t rows = (int64_t{1} << 20) / (4 * std::max<int64_t>(K, 1));
  return std::clamp<int64_t>(rows / 16 * 16, 32, 1024);
}

float* panel_buffer(int64_t floats) {
  thread_local std::vector<float> buffer;  // reused: a fresh one would page-fault every call
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(static_cast<size_t>(floats));
  return buffer.data();
}

// Prefill where the packed GEMM does not run (the scalar build, the openblas gemm policy):
// each OpenMP thread dequantizes and multiplies its own output columns with a
// single-threaded OpenBLAS (one thread pool only; linear_gemm.cc explains why).
void gemm(CpuIsa isa, const Int8LinearArgs& a) {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  const int threads = omp_get_max_threads();
  const int64_t panel = panel_rows(a.K);
#pragma omp parallel num_threads(threads)
  {
    const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t per_thread = ((a.N + nt - 1) / nt + 15) / 16 * 16;
    const int64_t n0 = std::min(a.N, tid * per_thread), n1 = std::min(a.N, n0 + per_thread);
    float* buffer = n0 < n1 ? panel_buffer(std::min(panel, n1 - n0) * a.K) : nullptr;
    for (int64_t p = n0; p < n1; p += panel) {
      const int64_t rows = std::min(panel, n1 - p);
      dequantize(isa, a, p, p + rows, buffer);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(a.M), static_cast<int>(rows),
                  static_cast<int>(a.K), 1.0f, a.x, static_cast<int>(a.ldx), buffer, static_cast<int>(a.K), 0.0f,
                  a.y + p, static_cast<int>(a.ldy));
      if (a.bias != nullptr || a.act != Activation::kNone) {
        for (int64_t m = 0; m < a.M; ++m) {
          float* row = a.y + m * a.ldy;
          for (int64_t n = p; n < p + rows; ++n) row[n] = detail::finish_output(row[n], a.bias, n, a.act);
        }
      }
    }
  }
}

}  // namespace

namespace detail {

Int16XArgs quantize_x_int16(CpuIsa isa, const Int8LinearArgs& a) {
  thread_local std::vector<int16_t> xq;
  thread_local std::vector<float> xs;
  const int64_t groups = a.K / a.group;
  xq.resize(static_cast<size_t>(a.M * a.K));
  xs.resize(static_cast<size_t>(a.M * groups));
  for (int64_t m = 0; m < a.M; ++m) {
    if (isa == CpuIsa::kAvx512) {
      quantize_row_int16_avx512(a.x + m * a.ldx, a.K, a.group, xq.data() + m * a.K, xs.data() + m * groups);
    } else {
      quantize_row_int16_avx2(a.x + m * a.ldx, a.K, a.group, xq.data() + m * a.K, xs.data() + m * groups);
    }
  }
  return Int16XArgs{&a, xq.data(), xs.data()};
}

Int8LinearOptions int8_linear_options(const CpuKernelOptions& options) {
  Int8LinearOptions int8;
  int8.isa = usable_cpu_isa(options.isa);
  int8.int8_activations = options.int8_dot;
  int8.int16_x = options.int8_x16;
  int8.gemm_policy = options.gemm;
  return int8;
}

bool int8_gemv_uses_int16_x(const Int8LinearOptions& options) {
  return options.int16_x && std::min(options.isa, detected_cpu_isa()) != CpuIsa::kScalar;
}

bool int8_gemm_uses_int16_x(const Int8LinearOptions& options) {
  return options.int16_x && std::min(options.isa, detected_cpu_isa()) == CpuIsa::kAvx512 && cpu_has_avx512_vnni();
}

void linear_int8_with(const Int8LinearOptions& options, const float* x, int64_t M, int64_t K, int64_t ldx,
                      const int8_t* w, const float* scales, int64_t group, int64_t N, const float* bias, float* y,
                      int64_t ldy, Activation act) {
  TESSERA_CHECK(M >= 0 && K >= 0 && N >= 0) << "M=" << M << " K=" << K << " N=" << N;
  TESSERA_CHECK(group > 0 && group % 32 == 0 && K % group == 0) << "K=" << K << " group=" << group;
  TESSERA_CHECK_GE(ldx, K);
  TESSERA_CHECK_GE(ldy, N);
  if (M == 0 || N == 0) return;
  const Int8LinearArgs args{x, M, K, ldx, w, scales, group, N, bias, y, ldy, act};
  Int8LinearOptions clamped = options;
  clamped.isa = std::min(options.isa, detected_cpu_isa());
  const CpuIsa isa = clamped.isa;
  const bool use_gemv = options.path == LinearPath::kGemv ||
                        (options.path == LinearPath::kAuto && M <= linear_int8_gemv_max_rows(options)) || K == 0;
  if (options.int8_activations && K > 0) {
    // Where VNNI runs, rows above the GEMV's go to the packed GEMM with 8-bit x (the same
    // products, 1.4-2.8x the GEMV-shaped dot kernel at 8-128 rows); elsewhere the dot
    // kernels serve every M.
    if (!use_gemv && isa == CpuIsa::kAvx512 && detail::cpu_has_avx512_vnni()) {
      detail::gemm_int8_x8_avx512_vnni(args);
    } else {
      gemv_int8_activations(isa, args);
    }
  } else if (use_gemv && int8_gemv_uses_int16_x(clamped)) {
    gemv_int16_x(isa, args);
  } else if (use_gemv) {
    gemv(isa, args);
  } else if (int8_gemm_uses_int16_x(clamped)) {
    detail::gemm_int8_x16_avx512_vnni(args);
  } else if (packed_gemm_preferred(isa, DType::kI8, M, options.gemm_policy)) {
    // The packed GEMM widens each K block of int8 panels to f32 as it packs them
    // (gemm_packed.h); 1.04-1.50x dequantize + OpenBLAS at 32-2048 rows (docs/quantization.md, "Speed").
    const LinearArgs wide{x, M, K, ldx, w, DType::kI8, N, bias, y, ldy, act};
    gemm_packed_int8(isa, wide, scales, group);
  } else {
    gemm(isa, args);
  }
}

}  // namespace detail

int64_t linear_int8_gemv_max_rows(const detail::Int8LinearOptions& options) {
  const CpuIsa isa = std::min(options.isa, detected_cpu_isa());
  return options.int8_activations && isa == CpuIsa::kAvx512 && detail::cpu_has_avx512_vnni() ? 7 : 16;
}

void linear_int8(const float* x, int64_t M, int64_t K, int64_t ldx, const int8_t* w, const float* scales,
                 int64_t group, int64_t N, const float* bias, float* y, int64_t ldy, Activation act) {
  detail::linear_int8_with(detail::Int8LinearOptions{}, x, M, K, ldx, w, scales, group, N, bias, y, ldy, act);
}

}  // namespace tessera::cpu
