// Backend::lora_add on the CPU: blocks of up to four rows of one adapter (of one segment, or of
// several segments with the same factors: a batch's sequences of one adapter are rarely
// neighbours), in parallel over the blocks, shrink x's rows to the adapter's rank (t = x · shrink) and expand them into out's
// rows (out += scale · t · expand), the factors in f32 or bf16 (widened as they are read).
// Both products run along contiguous rows of the factors
// ([in, r] and [r, out]) sixteen lanes at a time: the shrink keeps sixteen of the r sums of
// each row in a register while it walks the inputs, the expand sixteen of the out sums while it
// walks the rank, so a factor's vector, loaded once, serves every row of the block. Every sum
// adds its terms in a fixed order the CUDA twin follows too: the shrink's as two halves of the
// inputs, each in order, then added; the expand's over the rank in order.
#include <algorithm>
#include <tuple>
#include <vector>

#include "common/dtype.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/linear_cpu.h"

namespace tessera {
namespace lora_cpu_internal {

constexpr int kLanes = 16;
constexpr int kBlockRows = 4;
// Sixteen floats: one AVX-512 register, two AVX2 ones, four SSE ones, as the caller's target
// allows (GCC's vector extension); moved from and to memory by memcpy (unaligned moves), and
// passed by reference (a vector by value would change the ABI across targets).
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));
typedef uint16_t Halves __attribute__((vector_size(kLanes * sizeof(uint16_t))));
typedef uint32_t Words __attribute__((vector_size(kLanes * sizeof(uint32_t))));

// Sixteen factor elements as f32: f32 as they are, bf16 widened (its bits are an f32's top half).
inline __attribute__((always_inline)) void load_lanes(Lanes& v, const float* p) { __builtin_memcpy(&v, p, sizeof(v)); }
inline __attribute__((always_inline)) void load_lanes(Lanes& v, const uint16_t* p) {
  Halves h;
  __builtin_memcpy(&h, p, sizeof(h));
  const Words w = __builtin_convertvector(h, Words) << 16;
  v = (Lanes)w;  // a vector cast between same-sized vectors reinterprets the bits
}
inline __attribute__((always_inline)) void store_lanes(float* p, const Lanes& v) { __builtin_memcpy(p, &v, sizeof(v)); }
inline __attribute__((always_inline)) float to_f32(float v) { return v; }
inline __attribute__((always_inline)) float to_f32(uint16_t v) { return bf16_to_f32(v); }

struct Block {
  const float* x[kBlockRows] = {};  // the rows' inputs
  float* out[kBlockRows] = {};      // and outputs
  int rows = 0;
};

// One block of R rows: out_i += scale · (x_i · shrink) · expand, the factors' elements E (f32,
// or bf16 as uint16_t); `t` holds R × r floats (and, for one row, the block's columns after). R is a constant so that the R accumulators
// stay in registers.
template <int R, typename E>
inline __attribute__((always_inline)) void lora_rows(const Block& b, const E* shrink, const E* expand, int64_t in,
                                                     int64_t rank, int64_t n, float scale, float* t) {
  // Shrink: t[i][k] = (sum over j < in/2) + (sum over j >= in/2) of x_i[j] · shrink[j][k], each
  // half in input order: two independent chains of FMAs instead of one as long as the input
  // (the CUDA twin sums the same halves).
  const int64_t half = in / 2;
  int64_t k0 = 0;
  for (; k0 + kLanes <= rank; k0 += kLanes) {
    Lanes lo[R] = {}, hi[R] = {};
    for (int64_t j = 0; j < half; ++j) {
      Lanes s, s2;
      load_lanes(s, shrink + j * rank + k0);
      load_lanes(s2, shrink + (j + half) * rank + k0);
      for (int i = 0; i < R; ++i) lo[i] += s * b.x[i][j];
      for (int i = 0; i < R; ++i) hi[i] += s2 * b.x[i][j + half];
    }
    for (int64_t j = 2 * half; j < in; ++j) {  // an odd input's last
      Lanes s;
      load_lanes(s, shrink + j * rank + k0);
      for (int i = 0; i < R; ++i) hi[i] += s * b.x[i][j];
    }
    for (int i = 0; i < R; ++i) {
      const Lanes sum = lo[i] + hi[i];
      store_lanes(t + i * rank + k0, sum);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int64_t k = k0; k < rank; ++k) {
      float lo = 0.0f, hi = 0.0f;
      for (int64_t j = 0; j < half; ++j) lo += b.x[i][j] * to_f32(shrink[j * rank + k]);
      for (int64_t j = half; j < in; ++j) hi += b.x[i][j] * to_f32(shrink[j * rank + k]);
      t[i * rank + k] = lo + hi;
    }
  // Expand: out_i[c] += scale · sum over k in order of t[i][k] · expand[k][c].
  int64_t c0 = 0;
  if (R == 1) {
    // One row: expand's rows one after another (one memory stream, not r strided ones), the
    // sums kept in `u` (in L1) rather than in registers.
    float* u = t + rank;
    std::fill(u, u + n, 0.0f);
    for (int64_t k = 0; k < rank; ++k) {
      const float tk = t[k];
      const E* e = expand + k * n;
      int64_t c = 0;
      for (; c + kLanes <= n; c += kLanes) {
        Lanes v, s;
        load_lanes(v, e + c);
        load_lanes(s, u + c);
        s += v * tk;
        store_lanes(u + c, s);
      }
      for (; c < n; ++c) u[c] += to_f32(e[c]) * tk;
    }
    for (int64_t c = 0; c < n; ++c) b.out[0][c] += scale * u[c];
    return;
  }
  for (; c0 + kLanes <= n; c0 += kLanes) {
    Lanes acc[R] = {};
    for (int64_t k = 0; k < rank; ++k) {
      Lanes e;
      load_lanes(e, expand + k * n + c0);
      for (int i = 0; i < R; ++i) acc[i] += e * t[i * rank + k];
    }
    for (int i = 0; i < R; ++i) {
      Lanes o;
      load_lanes(o, b.out[i] + c0);
      o += acc[i] * scale;
      store_lanes(b.out[i] + c0, o);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int64_t c = c0; c < n; ++c) {
      float sum = 0.0f;
      for (int64_t k = 0; k < rank; ++k) sum += t[i * rank + k] * to_f32(expand[k * n + c]);
      b.out[i][c] += scale * sum;
    }
}

template <typename E>
inline __attribute__((always_inline)) void lora_block(const Block& b, const void* shrink, const void* expand,
                                                      int64_t in, int64_t rank, int64_t n, float scale, float* t) {
  const E* s = static_cast<const E*>(shrink);
  const E* e = static_cast<const E*>(expand);
  switch (b.rows) {
    case 4: return lora_rows<4>(b, s, e, in, rank, n, scale, t);
    case 3: return lora_rows<3>(b, s, e, in, rank, n, scale, t);
    case 2: return lora_rows<2>(b, s, e, in, rank, n, scale, t);
    default: return lora_rows<1>(b, s, e, in, rank, n, scale, t);
  }
}

// `bf16`: the factors are bf16 (else f32).
using BlockFn = void (*)(const Block&, const void*, const void*, int64_t, int64_t, int64_t, float, float*, bool);

void lora_block_generic(const Block& b, const void* shrink, const void* expand, int64_t in, int64_t rank, int64_t n,
                        float scale, float* t, bool bf16) {
  if (bf16) return lora_block<uint16_t>(b, shrink, expand, in, rank, n, scale, t);
  lora_block<float>(b, shrink, expand, in, rank, n, scale, t);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void lora_block_avx2(const Block& b, const void* shrink, const void* expand,
                                                         int64_t in, int64_t rank, int64_t n, float scale, float* t,
                                                         bool bf16) {
  if (bf16) return lora_block<uint16_t>(b, shrink, expand, in, rank, n, scale, t);
  lora_block<float>(b, shrink, expand, in, rank, n, scale, t);
}

__attribute__((target("avx512f,avx512bw,fma"))) void lora_block_avx512(const Block& b, const void* shrink,
                                                                       const void* expand, int64_t in, int64_t rank,
                                                                       int64_t n, float scale, float* t, bool bf16) {
  if (bf16) return lora_block<uint16_t>(b, shrink, expand, in, rank, n, scale, t);
  lora_block<float>(b, shrink, expand, in, rank, n, scale, t);
}
#endif

BlockFn block_kernel(cpu::CpuIsa isa) {
#if defined(__x86_64__)
  if (isa >= cpu::CpuIsa::kAvx512) return lora_block_avx512;
  if (isa >= cpu::CpuIsa::kAvx2) return lora_block_avx2;
#endif
  (void)isa;
  return lora_block_generic;
}

}  // namespace lora_cpu_internal

void CpuBackend::lora_add_impl(const TensorView& x, const std::vector<LoraSegment>& segments, const TensorView& out) {
  namespace lci = lora_cpu_internal;
  const lci::BlockFn kernel = lci::block_kernel(cpu::usable_cpu_isa(options_.isa));
  struct Work {
    const LoraSegment* segment;  // one of the segments with these factors and scale
    lci::Block block;
  };
  std::vector<Work> work;
  int64_t max_rank = 0;
  // The segments in groups of the same factors and scale (each group's in plan order).
  const auto key = [](const LoraSegment& s) {
    return std::make_tuple(s.shrink.data, s.expand.data, s.scale, s.column);
  };
  std::vector<size_t> order(segments.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return key(segments[a]) < key(segments[b]); });
  Work w{nullptr, {}};
  for (size_t i : order) {
    const LoraSegment& s = segments[i];
    max_rank = std::max(max_rank, s.shrink.dim(1));
    if (w.segment != nullptr && (key(*w.segment) != key(s) || w.block.rows == lci::kBlockRows)) {
      if (w.block.rows > 0) work.push_back(w);
      w.block.rows = 0;
    }
    w.segment = &s;
    for (int64_t r = s.begin; r < s.end; ++r) {
      if (w.block.rows == lci::kBlockRows) {
        work.push_back(w);
        w.block.rows = 0;
      }
      w.block.x[w.block.rows] = x.as<float>() + r * x.row_stride();
      w.block.out[w.block.rows] = out.as<float>() + r * out.row_stride() + s.column;
      ++w.block.rows;
    }
  }
  if (w.block.rows > 0) work.push_back(w);
  const int64_t in = x.dim(1);
  const auto run = [&](const Work& piece, std::vector<float>& scratch) {
    const LoraSegment& s = *piece.segment;
    const int64_t n = s.expand.dim(1);  // its columns (of out, from s.column on)
    scratch.resize(static_cast<size_t>(lci::kBlockRows * max_rank + n));
    kernel(piece.block, s.shrink.data, s.expand.data, in, s.shrink.dim(1), n, s.scale, scratch.data(),
           s.shrink.dtype == DType::kBF16);
  };
  // A decode step of one sequence is one block: run here, with no parallel region (starting
  // one costs more than the block on a VM) and no allocation per call.
  thread_local std::vector<float> scratch;
  if (work.size() == 1) return run(work[0], scratch);
#pragma omp parallel
  {
    std::vector<float> mine;
#pragma omp for schedule(static)
    for (size_t i = 0; i < work.size(); ++i) run(work[i], mine);
  }
}

}  // namespace tessera
