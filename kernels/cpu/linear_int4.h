#pragma once
// The 4-bit weight-only linear layer: y = x · dequant(W)^T (+ bias) (then an activation),
// W [N, K] stored in 4-bit panels made once at load (from a GGUF file's q4_0 / q4_1 / q4_K
// blocks, value for value, or by quantizing a float matrix: `--quantize int4`), or in the 5-
// and 6-bit panels of its q5_0 / q5_1 / q5_K / q6_K blocks (the same kernels with 1 or 2 more
// bits per weight).
//
// Values and layout: kernels/int4_layout.h.
//
// Arithmetic. x is quantized per group of 32 to 8 bits (scale max|x| / 127, llama.cpp's q8
// activations for these types, with an f32 scale), so a weight group's products are exact
// integer sums: sum_k w_k x_k = xs (s P - m X), where P = sum q_k xq_k and X = sum xq_k over
// the group (32 inputs, or 16 for kSixBit), or xs s (P - o X) where m = o s
// (int4_q_offset). Every M
// runs this one arithmetic (decode and prefill alike): kernels for AVX-512 VNNI (vpdpbusd),
// AVX2 (vpmaddubsw + vpmaddwd) and a scalar reference, each tested against the others and
// against the dequantized float product (tests/kernels/linear_int4_test.cc).
#include <cstdint>

#include "kernels/activation.h"
#include "kernels/cpu/linear_cpu.h"
#include "kernels/int4_layout.h"

namespace tessera::cpu {


// Packing. Every packer writes int4_nibble_bytes(scheme, ...) into `nibbles` and int4_scale_bytes into
// `scales`, zeroed first by the caller or not (every byte is written).
// From ggml blocks of the type `scheme` holds (kernels/int4_layout.h: q4_0, q5_0, q4_1, q5_1,
// q4_K, q5_K, q6_K), value for value: N rows of K / block_elems blocks, `row_bytes` apart.
void pack_int4_from_blocks(Int4Scheme scheme, const uint8_t* rows, int64_t row_bytes, int64_t N, int64_t K,
                           uint8_t* nibbles, uint8_t* scales);
// Quantizes f32 W [N, K] (rows K apart) as kSymmetric by llama.cpp's q4_0 rule: per group,
// d = v / -8 where v is the first value of largest magnitude, q = min(15, trunc(w / d + 8.5))
// (w times the f32 reciprocal of d), then s = d rounded to f16; an all-zero group has s = 0.
// q4_0 weights decoded to f32 thus come back as the same blocks.
void quantize_int4(const float* w, int64_t N, int64_t K, uint8_t* nibbles, uint8_t* scales);
// The float matrix the panels stand for: out [N, K] (tests, and the loader's fallback).
void dequantize_int4(Int4Scheme scheme, const uint8_t* nibbles, const uint8_t* scales, int64_t N, int64_t K,
                     float* out);

// Options: the ISA flavour (clamped to the CPU's), from the backend's CpuKernelOptions.
struct Int4LinearOptions {
  CpuIsa isa = detected_cpu_isa();
};

// y[M, N] = x[M, K] · dequant(W)^T (+ bias[N]) (then `act`), W in the panels above.
// Strides and aliasing as linear() in linear_cpu.h. K % int4_k_multiple(scheme) == 0.
void linear_int4(const Int4LinearOptions& options, Int4Scheme scheme, const float* x, int64_t M, int64_t K,
                 int64_t ldx, const uint8_t* nibbles, const uint8_t* scales, int64_t N, const float* bias, float* y,
                 int64_t ldy, Activation act);

}  // namespace tessera::cpu
