#pragma once
// exp for 8 (AVX2 + FMA) and 16 (AVX-512) f32 lanes, one polynomial for both widths: the
// tiled attention's softmax (every flavour) and the sampler's log-sum-exp. Include only from
// code compiled for (or dispatched to) the instruction set of the function it calls.
//
// x = n ln2 + r with |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial (truncation error
// < 1.3e-7 relative), times 2^n built in the exponent bits. Lanes below -87.3 (e^x under the
// smallest normal float), -inf included, give 0.
#include <immintrin.h>

namespace tessera::cpu::detail {

namespace exp_poly {
inline constexpr float kLowest = -87.3f, kHighest = 88.3f, kLog2e = 1.44269504f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln2 split in two
// 1/6!, 1/5!, ..., 1/1!, 1/0!: Horner's order.
inline constexpr float kCoefficients[7] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
}  // namespace exp_poly

__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x) {
  using namespace exp_poly;
  const __m256 lo = _mm256_set1_ps(kLowest);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(kHighest));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kCoefficients[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kCoefficients[i]));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  return _mm256_andnot_ps(under, e);
}

__attribute__((target("avx512f"))) inline __m512 exp16(__m512 x) {
  using namespace exp_poly;
  const __m512 lo = _mm512_set1_ps(kLowest);
  const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(kHighest));
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kCoefficients[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kCoefficients[i]));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 e = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~under), e);
}

}  // namespace tessera::cpu::detail
