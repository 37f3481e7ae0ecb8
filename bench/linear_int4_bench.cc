// 4-bit weight-only linear layer (linear_int4.h, `--quantize int4`'s q4_0 rule) against bf16
// weights, interleaved round by round in one process (the machine is shared: a load change
// hits both alike), in two settings:
//  - cold: the layer's weights rotate through ~6x the L3, so every call reads them from DRAM
//    as a decode step does, on every thread;
//  - hot: one thread, a slice of the layer that stays in L2, so the time is the kernel's own
//    instruction cost per weight byte (the ceiling on what it can stream).
// Prints, per M, the median time per call and the weight bytes per second of each, and the
// int4 / bf16 speed ratio. Then, at one row of x, the panels of the GGUF block types a q4_0
// and a q4_K_M file keep (q4_0, q4_K, q6_K, packed from random blocks) in the same two
// settings: the bytes per second each scheme's kernel streams.
//
//   build/bin/linear_int4_bench [ROUNDS] [N K]   (default 5632 x 2048: the ~1.1B Llama's up)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/kernel_options.h"
#include "kernels/cpu/linear_cpu.h"
#include "kernels/cpu/linear_int4.h"
#include "tests/kernels/int4_test_blocks.h"  // random ggml blocks, as the op tests make them

namespace {

using namespace tessera;
using Clock = std::chrono::steady_clock;
constexpr size_t kColdBytes = size_t{192} << 20;
constexpr size_t kHotBytes = size_t{256} << 10;  // of int4 weights (bf16: ~0.9 MiB): inside a 1 MiB L2

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `copies` copies of one matrix, in bf16 rows and in 4-bit panels.
struct Copies {
  int64_t N, K, copies;
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> nibbles, scales;
  int64_t nibble_bytes() const { return int4_nibble_bytes(Int4Scheme::kSymmetric, N, K); }
  int64_t scale_bytes() const { return int4_scale_bytes(Int4Scheme::kSymmetric, N, K); }
  const uint16_t* bf16_at(int64_t c) const { return bf16.data() + (c % copies) * N * K; }
  const uint8_t* nibbles_at(int64_t c) const { return nibbles.data() + (c % copies) * nibble_bytes(); }
  const uint8_t* scales_at(int64_t c) const { return scales.data() + (c % copies) * scale_bytes(); }
};

Copies make_copies(const std::vector<float>& w, int64_t N, int64_t K, int64_t copies) {
  Copies c{N, K, copies, {}, {}, {}};
  c.bf16.resize(static_cast<size_t>(copies * N * K));
  c.nibbles.resize(static_cast<size_t>(copies * c.nibble_bytes()));
  c.scales.resize(static_cast<size_t>(copies * c.scale_bytes()));
  // The first copy converted and quantized, the others copied from it.
  for (int64_t e = 0; e < N * K; ++e) c.bf16[static_cast<size_t>(e)] = f32_to_bf16(w[static_cast<size_t>(e)]);
  cpu::quantize_int4(w.data(), N, K, c.nibbles.data(), c.scales.data());
  for (int64_t i = 1; i < copies; ++i) {
    std::copy_n(c.bf16.begin(), N * K, c.bf16.begin() + i * N * K);
    std::copy_n(c.nibbles.begin(), c.nibble_bytes(), c.nibbles.begin() + i * c.nibble_bytes());
    std::copy_n(c.scales.begin(), c.scale_bytes(), c.scales.begin() + i * c.scale_bytes());
  }
  return c;
}

struct Timing {
  double bf16_s, int4_s;
};

// Median seconds per call of each over `rounds` (after one warm-up round), `calls` per round.
Timing time_both(const cpu::detail::LinearOptions& bf16_options, const cpu::Int4LinearOptions& int4_options,
                 const Copies& c, int64_t M, int rounds, int calls) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M * c.K)), y(static_cast<size_t>(M * c.N));
  for (float& v : x) v = u(rng);
  std::vector<double> tb, tq;
  int64_t nb = 0, nq = 0;
  for (int r = 0; r < rounds + 1; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i, ++nb)
      cpu::detail::linear_with(bf16_options, x.data(), M, c.K, c.K, c.bf16_at(nb), DType::kBF16, c.N, nullptr,
                               y.data(), c.N, Activation::kNone);
    const auto t1 = Clock::now();
    for (int i = 0; i < calls; ++i, ++nq)
      cpu::linear_int4(int4_options, Int4Scheme::kSymmetric, x.data(), M, c.K, c.K, c.nibbles_at(nq), c.scales_at(nq),
                       c.N, nullptr, y.data(), c.N, Activation::kNone);
    const auto t2 = Clock::now();
    if (r == 0) continue;
    tb.push_back(std::chrono::duration<double>(t1 - t0).count() / calls);
    tq.push_back(std::chrono::duration<double>(t2 - t1).count() / calls);
  }
  return {median(tb), median(tq)};
}

void report(const char* setting, const Copies& c, int64_t M, Timing t) {
  const double bf16_bytes = 2.0 * c.N * c.K, int4_bytes = static_cast<double>(c.nibble_bytes() + c.scale_bytes());
  std::printf("| %s | %lld x %lld | %lld | %.3f | %.3f | %.1f | %.1f | %.2fx |\n", setting, static_cast<long long>(c.N),
              static_cast<long long>(c.K), static_cast<long long>(M), t.bf16_s * 1e3, t.int4_s * 1e3,
              bf16_bytes / t.bf16_s / 1e9, int4_bytes / t.int4_s / 1e9, t.bf16_s / t.int4_s);
}

// `copies` copies of one N x K matrix packed as `scheme` from random blocks of its ggml type.
struct SchemeCopies {
  Int4Scheme scheme;
  int64_t N, K, copies, bytes;
  std::vector<uint8_t> nibbles, scales;
};

SchemeCopies scheme_copies(Int4Scheme scheme, int64_t N, int64_t K, int64_t copies) {
  std::mt19937 rng(11);
  const std::vector<uint8_t> blocks = random_block_rows(rng, scheme, N, K);
  const BlockType bt = block_type_of(scheme);
  const int64_t nb = int4_nibble_bytes(scheme, N, K), sb = int4_scale_bytes(scheme, N, K);
  SchemeCopies c{scheme, N, K, copies, nb + sb, std::vector<uint8_t>(static_cast<size_t>(copies * nb)),
                 std::vector<uint8_t>(static_cast<size_t>(copies * sb))};
  cpu::pack_int4_from_blocks(scheme, blocks.data(), K / bt.elems * bt.bytes, N, K, c.nibbles.data(),
                             c.scales.data());
  for (int64_t i = 1; i < copies; ++i) {
    std::copy_n(c.nibbles.begin(), nb, c.nibbles.begin() + i * nb);
    std::copy_n(c.scales.begin(), sb, c.scales.begin() + i * sb);
  }
  return c;
}

// Median weight GB/s of one row of x through `c`'s copies in turn.
double scheme_gb_s(const cpu::Int4LinearOptions& options, const SchemeCopies& c, int rounds, int calls) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(c.K)), y(static_cast<size_t>(c.N));
  for (float& v : x) v = u(rng);
  const int64_t nb = int4_nibble_bytes(c.scheme, c.N, c.K), sb = int4_scale_bytes(c.scheme, c.N, c.K);
  std::vector<double> rates;
  int64_t n = 0;
  for (int r = 0; r < rounds + 1; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i, ++n) {
      const int64_t at = n % c.copies;
      cpu::linear_int4(options, c.scheme, x.data(), 1, c.K, c.K, c.nibbles.data() + at * nb, c.scales.data() + at * sb,
                       c.N, nullptr, y.data(), c.N, Activation::kNone);
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count() / calls;
    if (r > 0) rates.push_back(static_cast<double>(c.bytes) / s / 1e9);
  }
  return median(rates);
}

void report_schemes(const cpu::Int4LinearOptions& options, int64_t N, int64_t K, int rounds, int threads) {
  std::printf("\n| scheme (ggml type) | N x K | cold GB/s (%d threads) | hot GB/s (1 thread) |\n| --- | --- | --- | --- |\n",
              threads);
  for (const Int4Scheme scheme : {Int4Scheme::kSymmetric, Int4Scheme::kSuperBlock, Int4Scheme::kSixBit}) {
    const char* name = ggml_type_traits(static_cast<uint32_t>(block_type_of(scheme).type))->name;
    if (K % int4_k_multiple(scheme) != 0) continue;
    const int64_t bytes = int4_nibble_bytes(scheme, N, K) + int4_scale_bytes(scheme, N, K);
    const SchemeCopies cold = scheme_copies(scheme, N, K, std::max<int64_t>(1, static_cast<int64_t>(kColdBytes) / bytes));
    const int64_t hot_rows = std::clamp<int64_t>(N * static_cast<int64_t>(kHotBytes) / bytes / 32 * 32, 32, N);
    const SchemeCopies hot = scheme_copies(scheme, hot_rows, K, 1);
    omp_set_num_threads(threads);
    const double cold_rate = scheme_gb_s(options, cold, rounds, static_cast<int>(cold.copies));
    omp_set_num_threads(1);
    const double hot_rate = scheme_gb_s(options, hot, rounds, 200);
    std::printf("| %s (%s) | %lld x %lld | %.1f | %.1f |\n", int4_scheme_name(scheme), name, static_cast<long long>(N),
                static_cast<long long>(K), cold_rate, hot_rate);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const StatusOr<KernelOptions> kernels = kernel_options_from_environment();
  if (!kernels.is_ok()) {
    std::fprintf(stderr, "linear_int4_bench: %s\n", kernels.status().to_string().c_str());
    return 2;
  }
  const cpu::detail::LinearOptions bf16_options = cpu::detail::linear_options(kernels.value().cpu);
  const cpu::Int4LinearOptions int4_options{bf16_options.isa};
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const int64_t N = argc > 3 ? std::atoll(argv[2]) : 5632, K = argc > 3 ? std::atoll(argv[3]) : 2048;
  if (rounds < 1 || N < 32 || K < 32 || K % 32 != 0 || argc == 3) {
    std::fprintf(stderr, "usage: linear_int4_bench [ROUNDS>=1] [N>=32 K: a multiple of 32]\n");
    return 2;
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  std::vector<float> w(static_cast<size_t>(N * K));
  for (float& v : w) v = u(rng);
  const Copies cold = make_copies(w, N, K, std::max<int64_t>(1, static_cast<int64_t>(kColdBytes / (N * K * 2))));
  // The hot slice: whole panels of the first rows, within kHotBytes of 4-bit weights.
  const int64_t hot_rows = std::clamp<int64_t>(static_cast<int64_t>(kHotBytes / (K * 9 / 16)) / 32 * 32, 32, N);
  const Copies hot = make_copies(w, hot_rows, K, 1);
  std::printf("linear_int4_bench: isa %s, %d threads cold, 1 hot, %d rounds (medians)\n",
              cpu::cpu_isa_name(bf16_options.isa), omp_get_max_threads(), rounds);
  std::printf("| setting | N x K | M | bf16 ms | int4 ms | bf16 weight GB/s | int4 weight GB/s | int4 / bf16 |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  const int threads = omp_get_max_threads();
  for (const int64_t M : {1, 8}) {
    omp_set_num_threads(threads);
    report("cold", cold, M, time_both(bf16_options, int4_options, cold, M, rounds, static_cast<int>(cold.copies)));
    omp_set_num_threads(1);
    report("hot", hot, M, time_both(bf16_options, int4_options, hot, M, rounds, 200));
  }
  report_schemes(int4_options, N, K, rounds, threads);
  return 0;
}
