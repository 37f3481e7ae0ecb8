#pragma once
// Internal to the CPU linear layer: the packed, cache-blocked GEMM for M > 1 rows of x
// (prefill and batched decode), y[M, N] = x[M, K] · W[N, K]^T, reading the weights in their
// own dtype.
//
// Scheme (GotoBLAS/BLIS style, specialised for x · W^T with few rows):
//  - W is read as column panels of `nr` output columns: panel p holds, for each k, the
//    nr weights W[p*nr + j][k] side by side (widened to f32 in registers by the
//    micro-kernel; bf16 in an even/odd order that needs one shift and one AND per nr
//    values). Panels are packed per call, one L2-sized chunk of panels × one K block at a
//    time, by the thread that uses them (or taken from a PackedWeights made once).
//  - x is packed once per call into tiles of `mr` rows, k-major ([K][mr] per tile), so a
//    micro-kernel step broadcasts mr consecutive floats.
//  - The micro-kernel keeps an mr × nr tile of y in registers over a K block; K blocks
//    accumulate in y. Every output is one ascending-k chain of fused multiply-adds, so the
//    result does not depend on blocking, threading or the tile an output falls in (tests
//    compare it bit for bit with a plain fmaf loop).
//  - Threads split the column panels (OpenMP), each working through its own panels: no
//    shared writes, both cores busy from the first to the last panel.
//
// Weight formats. The packer is the only code that reads W's source layout and the
// micro-kernel's load step the only code that reads a packed panel, both chosen by
// PanelFormat. Another format (e.g. int8 with per-group scales) is a new PanelFormat: its
// packer writes the int8 panel plus one row of nr scales per group of k, and its load step
// widens nr int8 values and multiplies them by the group's scales.
#include <cstdint>
#include <memory>

#include "common/dtype.h"
#include "kernels/cpu/linear_cpu.h"
#include "kernels/cpu/linear_kernels.h"

namespace tessera::cpu::detail {

// How a panel stores its weights: the weight's own dtype, or (kBF16Pairs, AVX-512 BF16
// only) bf16 weights as pairs of consecutive k for the bf16 dot-product kernel, whose x is
// rounded to bf16 too (bf16_dot below).
enum class PanelFormat : uint8_t { kF32, kF16, kBF16, kBF16Pairs };
// The panel format for a linear weight dtype (f32, f16, bf16; int8 is widened to f32).
PanelFormat panel_format_for(DType w_dtype);
int64_t panel_element_bytes(PanelFormat format);

// The source a panel is packed from: row-major W[N, K] of `dtype`, rows exactly K apart.
// dtype kI8: int8 weights with one f32 scale per `group` inputs of a row (scales[N, K /
// group], linear_int8.h), packed as f32 panels of q * scale. dtype kU8: coded bf16
// (kernels/coded_bf16_layout.h: w the body, coded_side its side tensor of
// coded_side_elements), decoded a panel's K block at a time and packed as bf16.
struct WeightSource {
  const void* w;
  DType dtype;
  int64_t N, K;
  const float* scales = nullptr;
  int64_t group = 0;
  const int32_t* coded_side = nullptr;
  int64_t coded_side_elements = 0;
  // Bytes from one row of the source to the next, and the offset of input k in a row.
  int64_t row_bytes() const;
  int64_t k_bytes(int64_t k) const;
};

// Whether the packed GEMM has a micro-kernel for this instruction set (AVX2 and AVX-512).
bool gemm_packed_supported(CpuIsa isa);

// W packed whole, once, for repeated calls (weights packed at load time): panel p's K
// steps at data + p * K * nr elements.
class PackedWeights {
 public:
  static PackedWeights pack(CpuIsa isa, const WeightSource& source);
  PanelFormat format() const { return format_; }
  int64_t N() const { return N_; }
  int64_t K() const { return K_; }
  int nr() const { return nr_; }
  CpuIsa isa() const { return isa_; }
  const void* panel(int64_t p) const;
  int64_t bytes() const { return bytes_; }

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  PanelFormat format_ = PanelFormat::kF32;
  int64_t N_ = 0, K_ = 0, bytes_ = 0;
  int nr_ = 0;
  CpuIsa isa_ = CpuIsa::kScalar;
  std::unique_ptr<void, FreeDeleter> data_;
};

// The whole linear call (bias and activation included) on the packed GEMM. `prepacked`
// (optional) must have been packed from a.w for this isa.
//
// bf16_dot (bf16 weights, even K, AVX-512 CPUs with AVX512_BF16; otherwise ignored): x is
// rounded to bf16 and each pair of k is one vdpbf16ps step, twice the multiply-adds per
// instruction of f32 FMAs — llama.cpp's arithmetic for bf16 models, and transformers' when a
// model runs in bf16. Products are exact; sums stay f32. linear() asks for it unless
// CpuKernelOptions::bf16_dot is off (linear_cpu.h); callers here choose.
void gemm_packed(CpuIsa isa, const LinearArgs& a, const PackedWeights* prepacked = nullptr, bool bf16_dot = false);
// The same for coded bf16 weights (a.w the body, a.w_dtype kBF16: the panels' format is
// bf16's, or bf16 pairs with bf16_dot).
void gemm_packed_coded_bf16(CpuIsa isa, const LinearArgs& a, const int32_t* side, int64_t side_elements,
                            bool bf16_dot);
// Rows [n0, n0 + rows) of a coded source, inputs [k0, k0 + kc) (multiples of 64), decoded to
// bf16 into out (rows kc apart), escapes included (linear_coded_bf16.cc).
void decode_coded_bf16_block(CpuIsa isa, const WeightSource& source, int64_t n0, int64_t rows, int64_t k0, int64_t kc,
                             uint16_t* out);
// Whether this CPU (and build) can run the bf16 dot-product kernel.
bool cpu_has_bf16_dot();
// The same for int8 weights (a.w_dtype kI8, a.w the int8 rows, `scales` and `group` as in
// linear_int8.h): each panel's K block is dequantized (q * scale, rounded to f32 once) into
// an f32 panel as it is packed, then runs the f32 micro-kernel, so every output is one
// ascending-k FMA chain over the dequantized weights.
void gemm_packed_int8(CpuIsa isa, const LinearArgs& a, const float* scales, int64_t group);

// --- the per-ISA pieces (gemm_microkernel_<isa>.cc) ---

// Tile shape of the AVX2 micro-kernel: 6 rows x 16 columns = 12 ymm accumulators.
inline constexpr int kAvx2Mr = 6;
inline constexpr int kAvx2Nr = 16;
// Packs rows [n0, n0 + 16) of W (rows >= N as zeros), k in [k0, k0 + kc), into dst: kc
// steps of 16 values in the AVX2 panel order of `format`, dst_stride values apart.
void pack_panel_avx2(const WeightSource& source, PanelFormat format, int64_t n0, int64_t k0, int64_t kc,
                     void* dst, int64_t dst_stride = kAvx2Nr);
// c[6][16] (rows ldc apart) = (accumulate ? c : 0) + xp · panel over kc steps; xp is
// [kc][6] floats, panel [kc][16] values of `format`.
void microkernel_avx2(PanelFormat format, const float* xp, const void* panel, int64_t kc, float* c,
                      int64_t ldc, bool accumulate);

// Tile shape of the AVX-512 micro-kernel: 8 rows x 32 columns = 16 zmm accumulators (a
// multiple of 8 rows, so the usual batch sizes and prompt chunks leave no idle rows).
inline constexpr int kAvx512Mr = 8;
inline constexpr int kAvx512Nr = 32;
// An AVX-512 panel step is two AVX2 panel steps side by side: columns 0..15 then 16..31,
// each in the AVX2 order of `format` (gemm_microkernel_avx512.cc says why that suits it).
void pack_panel_avx512(const WeightSource& source, PanelFormat format, int64_t n0, int64_t k0, int64_t kc,
                       void* dst);
// c[8][32] = (accumulate ? c : 0) + xp · panel; xp is [kc][8] floats, panel [kc][32].
// kBF16Pairs: kc even, xp is [kc / 2][8] 32-bit words of two bf16 (k even in the low half),
// the panel [kc / 2][32] words of W[n][k], W[n][k + 1] (a bf16 row read as 32-bit words).
void microkernel_avx512(PanelFormat format, const float* xp, const void* panel, int64_t kc, float* c,
                        int64_t ldc, bool accumulate);

}  // namespace tessera::cpu::detail
