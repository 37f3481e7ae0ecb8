#pragma once
// The two AVX-512 VNNI dot-product instructions as inline assembly, for the int8 kernels
// (gemm_int8_vnni.cc, linear_int8_avx512.cc, linear_int8_panels.cc). GCC 12 compiles the
// intrinsics (_mm512_dpwssd_epi32, _mm512_dpbusd_epi32) with a register copy of the
// accumulator into and out of every use: in the GEMM's loop 64 moves per 16 products, which
// cost more than the products (4096 x 768 at 256 rows of x: 0.67x bf16's speed with the
// intrinsic, 0.93x with these; bench/linear_int8_bench.cc). "+v" ties the accumulator to one
// register. Include only from code compiled for AVX-512 VNNI.
#include <immintrin.h>

namespace tessera::cpu::detail {

// acc + the sums of pairwise products of a's and b's int16 words, per 32-bit lane.
__attribute__((target("avx512f,avx512vnni"))) inline __m512i dpwssd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// acc + the sums of products of u's unsigned bytes and s's signed bytes, four per 32-bit lane.
__attribute__((target("avx512f,avx512vnni"))) inline __m512i dpbusd(__m512i acc, __m512i u, __m512i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
}

}  // namespace tessera::cpu::detail
