// The packed GEMM's driver (scheme in gemm_packed.h): packs x, splits the column panels
// across OpenMP threads, walks L2-sized chunks of panels × K blocks, and runs the
// micro-kernel over every (row tile, panel) pair of a chunk.
//
// Blocking, on cores with >= 32 KiB L1d and >= 512 KiB L2 (both kernels):
//  - K blocks of kKc = 256 steps: one x tile (AVX2 6 x 256 f32 = 6 KiB, AVX-512 8 KiB)
//    and one panel slice (AVX2 256 x 16 values: 16 KiB f32, 8 KiB f16/bf16; AVX-512 twice
//    that) fit in L1 together;
//  - a chunk is kChunkColumns = 256 output columns (16 AVX2 or 8 AVX-512 panels) of one K
//    block (256 KiB f32, 128 KiB f16/bf16) and stays in L2 while every row tile passes over
//    it, so each weight comes from DRAM once per call and from L2 once per row tile.
#include "kernels/cpu/gemm_packed.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "kernels/coded_bf16_layout.h"
#include "kernels/cpu/next_block_prefetcher.h"

namespace tessera::cpu::detail {
namespace {

constexpr int64_t kKc = 256;
constexpr int64_t kChunkColumns = 256;

// One instruction set's micro-kernel and the panel packer whose layout it reads.
struct Kernel {
  CpuIsa isa;
  int mr, nr;
  void (*pack)(const WeightSource&, PanelFormat, int64_t n0, int64_t k0, int64_t kc, void* dst);
  void (*run)(PanelFormat, const float* xp, const void* panel, int64_t kc, float* c, int64_t ldc, bool accumulate);
  int64_t chunk_panels() const { return kChunkColumns / nr; }
};
constexpr int kMaxMr = 8, kMaxNr = 32;

void pack_avx2_panel(const WeightSource& s, PanelFormat f, int64_t n0, int64_t k0, int64_t kc, void* dst) {
  pack_panel_avx2(s, f, n0, k0, kc, dst);
}

Kernel kernel_for(CpuIsa isa) {
  TESSERA_CHECK(gemm_packed_supported(isa)) << "no packed GEMM kernel for " << cpu_isa_name(isa);
  if (isa == CpuIsa::kAvx512) return {isa, kAvx512Mr, kAvx512Nr, pack_panel_avx512, microkernel_avx512};
  return {isa, kAvx2Mr, kAvx2Nr, pack_avx2_panel, microkernel_avx2};
}
static_assert(kAvx2Mr <= kMaxMr && kAvx512Mr <= kMaxMr && kAvx2Nr <= kMaxNr && kAvx512Nr <= kMaxNr);

// x rows [t * mr, t * mr + mr) as [K][mr] (rows past M as zeros), for every row tile t.
// Written in order (k outer), reading mr rows side by side; split over threads from 16K
// values (a batch-32 decode step's x: done on one core it idled the others).
void pack_x(const LinearArgs& a, int mr, int64_t tiles, float* xp) {
#pragma omp parallel for schedule(static) if (a.M * a.K >= 16 * 1024)
  for (int64_t t = 0; t < tiles; ++t) {
    float* dst = xp + t * a.K * mr;
    const float* src[kMaxMr];
    const int rows = static_cast<int>(std::min<int64_t>(mr, a.M - t * mr));
    for (int i = 0; i < rows; ++i) src[i] = a.x + (t * mr + i) * a.ldx;
    for (int64_t k = 0; k < a.K; ++k) {
      float* d = dst + k * mr;
      for (int i = 0; i < rows; ++i) d[i] = src[i][k];
      for (int i = rows; i < mr; ++i) d[i] = 0.0f;
    }
  }
}

// Packs a panel of `source` for `kernel`. int8 rows are first dequantized, K block by K
// block, into a small row-major f32 block (thread-local, L1/L2 sized) that the kernel's f32
// packer then transposes: one code path for every format's panel layout.
void pack_panel(const Kernel& kernel, const WeightSource& source, PanelFormat format, int64_t n0, int64_t k0,
                int64_t kc, void* dst) {
  if (source.dtype == DType::kU8) {
    // Coded bf16: the panel's rows of this K block back to bf16, then bf16's packer.
    thread_local std::vector<uint16_t> coded_buffer;
    const int64_t rows = std::max<int64_t>(0, std::min<int64_t>(kernel.nr, source.N - n0));
    uint16_t* block = scratch(coded_buffer, std::max<int64_t>(1, rows * kc));
    decode_coded_bf16_block(kernel.isa, source, n0, rows, k0, kc, block);
    kernel.pack(WeightSource{block, DType::kBF16, rows, kc}, format, 0, 0, kc, dst);
    return;
  }
  if (source.dtype != DType::kI8) {
    kernel.pack(source, format, n0, k0, kc, dst);
    return;
  }
  thread_local std::vector<float> block_buffer;
  const int64_t rows = std::max<int64_t>(0, std::min<int64_t>(kernel.nr, source.N - n0));
  float* block = scratch(block_buffer, std::max<int64_t>(1, rows * kc));
  const int8_t* w = static_cast<const int8_t*>(source.w);
  const int64_t groups = source.K / source.group;
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* q = w + (n0 + r) * source.K;
    const float* s = source.scales + (n0 + r) * groups;
    float* out = block + r * kc;
    for (int64_t k = k0; k < k0 + kc;) {
      const int64_t end = std::min(k0 + kc, (k / source.group + 1) * source.group);
      const float scale = s[k / source.group];
      for (int64_t i = k; i < end; ++i) out[i - k0] = static_cast<float>(q[i]) * scale;
      k = end;
    }
  }
  kernel.pack(WeightSource{block, DType::kF32, rows, kc}, PanelFormat::kF32, 0, 0, kc, dst);
}

// x rows as 32-bit words of two bf16 (k even in the low half, rounded to nearest even):
// [K / 2][mr] per row tile, for the bf16 dot-product kernel. K is even.
void pack_x_bf16_pairs(const LinearArgs& a, int mr, int64_t tiles, float* xp) {
  uint32_t* words = reinterpret_cast<uint32_t*>(xp);
  const int64_t pairs = a.K / 2;
#pragma omp parallel for schedule(static) if (a.M * a.K >= 16 * 1024)
  for (int64_t t = 0; t < tiles; ++t) {
    uint32_t* dst = words + t * pairs * mr;
    for (int i = 0; i < mr; ++i) {
      const int64_t m = t * mr + i;
      if (m < a.M) {
        const float* src = a.x + m * a.ldx;
        for (int64_t p = 0; p < pairs; ++p) {
          dst[p * mr + i] = uint32_t{f32_to_bf16(src[2 * p])} | (uint32_t{f32_to_bf16(src[2 * p + 1])} << 16);
        }
      } else {
        for (int64_t p = 0; p < pairs; ++p) dst[p * mr + i] = 0u;
      }
    }
  }
}

// One tile of y: rows [m0, m0 + rows), columns [n0, n0 + cols) (rows <= mr, cols <= nr).
// Partial tiles go through an mr x nr buffer so the kernel always writes a full tile.
void run_tile(const Kernel& kernel, const float* xp, const void* panel, int64_t kc, const LinearArgs& a, int64_t m0,
              int64_t rows, int64_t n0, int64_t cols, bool accumulate, PanelFormat format) {
  float* c = a.y + m0 * a.ldy + n0;
  if (rows == kernel.mr && cols == kernel.nr) {
    kernel.run(format, xp, panel, kc, c, a.ldy, accumulate);
    return;
  }
  const int nr = kernel.nr;
  alignas(64) float tile[kMaxMr * kMaxNr] = {};
  if (accumulate) {
    for (int64_t i = 0; i < rows; ++i) std::memcpy(tile + i * nr, c + i * a.ldy, cols * sizeof(float));
  }
  kernel.run(format, xp, panel, kc, tile, nr, accumulate);
  for (int64_t i = 0; i < rows; ++i) std::memcpy(c + i * a.ldy, tile + i * nr, cols * sizeof(float));
}

void finish_tile(const LinearArgs& a, int64_t m0, int64_t rows, int64_t n0, int64_t cols) {
  if (a.bias == nullptr && a.act == Activation::kNone) return;
  for (int64_t i = 0; i < rows; ++i) {
    float* row = a.y + (m0 + i) * a.ldy;
    for (int64_t n = n0; n < n0 + cols; ++n) row[n] = finish_output(row[n], a.bias, n, a.act);
  }
}

// Panels [p0, p1) on the calling thread.
void gemm_panels(const Kernel& kernel, const LinearArgs& a, const WeightSource& source, const float* xp, int64_t tiles,
                 int64_t p0, int64_t p1, PanelFormat format, const PackedWeights* prepacked) {
  const int mr = kernel.mr, nr = kernel.nr;
  const int64_t chunk_panels = kernel.chunk_panels();
  const int64_t elem = panel_element_bytes(format);
  const int64_t source_row_bytes = source.row_bytes();
  // x is packed as floats, or (bf16 pairs) as words of two k each.
  const int64_t x_per_word = format == PanelFormat::kBF16Pairs ? 2 : 1;
  thread_local std::vector<char> chunk_buffer;
  char* chunk = prepacked ? nullptr : scratch(chunk_buffer, chunk_panels * kKc * nr * elem);
  NextBlockPrefetcher prefetch;
  for (int64_t c0 = p0; c0 < p1; c0 += chunk_panels) {
    const int64_t c1 = std::min(p1, c0 + chunk_panels);
    for (int64_t k0 = 0; k0 < a.K; k0 += kKc) {
      const int64_t kc = std::min(kKc, a.K - k0);
      const bool last_k = k0 + kc == a.K;
      if (!prepacked) {
        // The block after this one: the next K block of this chunk, or the next chunk's first.
        const int64_t nc0 = last_k ? c1 : c0, nc1 = last_k ? std::min(p1, c1 + chunk_panels) : c1;
        const int64_t nk0 = last_k ? 0 : k0 + kc;
        const int64_t nk1 = std::min(a.K, nk0 + kKc);
        prefetch.start(source.w, source_row_bytes, nc0 * nr, std::min(a.N, nc1 * nr), source.k_bytes(nk0),
                       source.k_bytes(nk1) - source.k_bytes(nk0), tiles * (c1 - c0));
      }
      auto panel_at = [&](int64_t p) -> const void* {
        if (prepacked) return static_cast<const char*>(prepacked->panel(p)) + k0 * nr * elem;
        return chunk + (p - c0) * kc * nr * elem;
      };
      if (!prepacked) {
        for (int64_t p = c0; p < c1; ++p) pack_panel(kernel, source, format, p * nr, k0, kc, chunk + (p - c0) * kc * nr * elem);
      }
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t m0 = t * mr, rows = std::min<int64_t>(mr, a.M - m0);
        const float* xt = xp + (t * a.K + k0) / x_per_word * mr;
        for (int64_t p = c0; p < c1; ++p) {
          const int64_t n0 = p * nr, cols = std::min<int64_t>(nr, a.N - n0);
          if (!prepacked) prefetch.step();
          run_tile(kernel, xt, panel_at(p), kc, a, m0, rows, n0, cols, k0 > 0, format);
          if (last_k) finish_tile(a, m0, rows, n0, cols);
        }
      }
    }
  }
}

}  // namespace

int64_t WeightSource::row_bytes() const {
  return dtype == DType::kU8 ? coded_bf16_row_bytes(K) : K * static_cast<int64_t>(dtype_size(dtype));
}

int64_t WeightSource::k_bytes(int64_t k) const {
  return dtype == DType::kU8 ? coded_bf16_row_bytes(k) : k * static_cast<int64_t>(dtype_size(dtype));
}

PanelFormat panel_format_for(DType w_dtype) {
  switch (w_dtype) {
    case DType::kF32: return PanelFormat::kF32;
    case DType::kF16: return PanelFormat::kF16;
    case DType::kBF16: return PanelFormat::kBF16;
    case DType::kI8: return PanelFormat::kF32;
    default: TESSERA_CHECK(false) << "no panel format for " << dtype_name(w_dtype);
  }
  return PanelFormat::kF32;
}

int64_t panel_element_bytes(PanelFormat format) { return format == PanelFormat::kF32 ? 4 : 2; }

bool gemm_packed_supported(CpuIsa isa) { return isa == CpuIsa::kAvx2 || isa == CpuIsa::kAvx512; }

void PackedWeights::FreeDeleter::operator()(void* p) const { std::free(p); }

PackedWeights PackedWeights::pack(CpuIsa isa, const WeightSource& source) {
  const Kernel kernel = kernel_for(isa);
  const int64_t nr = kernel.nr;
  PackedWeights packed;
  packed.format_ = panel_format_for(source.dtype);
  packed.N_ = source.N;
  packed.K_ = source.K;
  packed.nr_ = nr;
  packed.isa_ = isa;
  const int64_t panels = (source.N + nr - 1) / nr;
  const int64_t elem = panel_element_bytes(packed.format_);
  packed.bytes_ = panels * source.K * nr * elem;
  const size_t alloc = static_cast<size_t>((packed.bytes_ + 63) / 64 * 64);
  packed.data_.reset(std::aligned_alloc(64, std::max<size_t>(alloc, 64)));
  TESSERA_CHECK(packed.data_ != nullptr) << "out of memory packing " << packed.bytes_ << " bytes of weights";
  char* base = static_cast<char*>(packed.data_.get());
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; ++p) {
    pack_panel(kernel, source, packed.format_, p * nr, 0, source.K, base + p * source.K * nr * elem);
  }
  return packed;
}

const void* PackedWeights::panel(int64_t p) const {
  return static_cast<const char*>(data_.get()) + p * K_ * nr_ * panel_element_bytes(format_);
}

namespace {

void run_gemm_packed(CpuIsa isa, const LinearArgs& a, const WeightSource& source, const PackedWeights* prepacked,
                     bool bf16_dot) {
  const Kernel kernel = kernel_for(isa);
  const int mr = kernel.mr, nr = kernel.nr;
  PanelFormat format = panel_format_for(a.w_dtype);
  if (bf16_dot && format == PanelFormat::kBF16 && isa == CpuIsa::kAvx512 && a.K % 2 == 0 && prepacked == nullptr &&
      cpu_has_bf16_dot()) {
    format = PanelFormat::kBF16Pairs;
  }
  if (prepacked != nullptr) {
    TESSERA_CHECK(prepacked->N() == a.N && prepacked->K() == a.K && prepacked->format() == format &&
                  prepacked->isa() == isa)
        << "prepacked weights [" << prepacked->N() << ", " << prepacked->K() << "] for " << cpu_isa_name(prepacked->isa())
        << " do not match the call [" << a.N << ", " << a.K << "] for " << cpu_isa_name(isa);
  }
  const int64_t tiles = (a.M + mr - 1) / mr;
  thread_local std::vector<float> x_buffer;
  float* xp = scratch(x_buffer, tiles * a.K * mr);
  if (format == PanelFormat::kBF16Pairs) {
    pack_x_bf16_pairs(a, mr, tiles, xp);
  } else {
    pack_x(a, mr, tiles, xp);
  }
  const int64_t panels = (a.N + nr - 1) / nr;
  const int threads = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), panels));
  if (threads <= 1 || a.M * a.N * a.K < 256 * 1024) {
    gemm_panels(kernel, a, source, xp, tiles, 0, panels, format, prepacked);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
    // Contiguous, equal shares of panels (the first ones get the remainder).
    const int64_t base = panels / nt, extra = panels % nt;
    const int64_t p0 = tid * base + std::min(tid, extra);
    const int64_t p1 = p0 + base + (tid < extra ? 1 : 0);
    gemm_panels(kernel, a, source, xp, tiles, p0, p1, format, prepacked);
  }
}

}  // namespace

void gemm_packed(CpuIsa isa, const LinearArgs& a, const PackedWeights* prepacked, bool bf16_dot) {
  run_gemm_packed(isa, a, WeightSource{a.w, a.w_dtype, a.N, a.K}, prepacked, bf16_dot);
}

void gemm_packed_coded_bf16(CpuIsa isa, const LinearArgs& a, const int32_t* side, int64_t side_elements,
                            bool bf16_dot) {
  TESSERA_CHECK(a.w_dtype == DType::kBF16 && coded_bf16_codable(a.K)) << "coded bf16 GEMM: K=" << a.K;
  WeightSource source{a.w, DType::kU8, a.N, a.K};
  source.coded_side = side;
  source.coded_side_elements = side_elements;
  run_gemm_packed(isa, a, source, nullptr, bf16_dot);
}

bool cpu_has_bf16_dot() {
  static const bool has = [] {
    __builtin_cpu_init();
    return detected_cpu_isa() == CpuIsa::kAvx512 && __builtin_cpu_supports("avx512bf16");
  }();
  return has;
}

void gemm_packed_int8(CpuIsa isa, const LinearArgs& a, const float* scales, int64_t group) {
  TESSERA_CHECK(a.w_dtype == DType::kI8 && group > 0 && a.K % group == 0) << "int8 GEMM: K=" << a.K << " group=" << group;
  run_gemm_packed(isa, a, WeightSource{a.w, DType::kI8, a.N, a.K, scales, group}, nullptr, false);
}

}  // namespace tessera::cpu::detail
