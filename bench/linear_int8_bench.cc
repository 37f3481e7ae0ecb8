// Int8 weight-only linear layer against bf16 weights, the two interleaved round by round in
// one process (the machine is shared: a load change hits both alike), on a 4096 x 4096 layer
// whose weights rotate through ~6x the L3 so they come from DRAM as in a decode step.
// Prints, per M, the median time per call of each, the weight bytes each streams (int8: the
// bytes plus one f32 scale per group) and the int8 / bf16 speed ratios: the weight-only
// kernels on row-major int8 (linear_int8.h), the same arithmetic on load-time panels
// (linear_int8_panels.h: what AVX-512 VNNI CPUs store and run; "-" elsewhere) and the
// int8-activation dot-product kernels (cpu::detail::Int8LinearOptions::int8_activations).
//
//   build/bin/linear_int8_bench [ROUNDS] [GROUP] [N K]   (GROUP 0 = auto; default 4096 x 4096)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/kernel_options.h"
#include "common/quantization.h"
#include "kernels/cpu/linear_cpu.h"
#include "kernels/cpu/linear_int8.h"
#include "kernels/cpu/linear_int8_panels.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kColdBytes = size_t{192} << 20;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  // The kernels' defaults with the TESSERA_CPU_* variables over them (A/B runs).
  const StatusOr<KernelOptions> kernels = kernel_options_from_environment();
  if (!kernels.is_ok()) {
    std::fprintf(stderr, "linear_int8_bench: %s\n", kernels.status().to_string().c_str());
    return 2;
  }
  const CpuKernelOptions& options = kernels.value().cpu;
  const cpu::detail::LinearOptions bf16_options = cpu::detail::linear_options(options);
  const cpu::detail::Int8LinearOptions int8_options = cpu::detail::int8_linear_options(options);
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  // The layer's shape: 4096 x 4096 unless both N and K are given.
  const int64_t N = argc > 4 ? std::atoll(argv[3]) : 4096, K = argc > 4 ? std::atoll(argv[4]) : 4096;
  const int64_t group = argc > 2 && std::atoi(argv[2]) > 0 ? std::atoi(argv[2]) : auto_quant_group(K);
  if (rounds < 1 || N < 1 || K < 1 || group < 1 || group % 32 != 0 || K % group != 0 || argc == 4) {
    std::fprintf(stderr, "usage: linear_int8_bench [ROUNDS>=1] [GROUP: a multiple of 32 dividing K, 0 = auto] [N K]\n");
    return 2;
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  std::vector<float> w(N * K);
  for (float& v : w) v = u(rng);
  // Copies of the same matrix so every call reads its weights from DRAM.
  const int64_t bf16_copies = std::max<int64_t>(1, static_cast<int64_t>(kColdBytes / (N * K * 2)));
  const int64_t int8_copies = std::max<int64_t>(1, static_cast<int64_t>(kColdBytes / (N * K)));
  std::vector<uint16_t> wb(static_cast<size_t>(bf16_copies * N * K));
  for (int64_t c = 0; c < bf16_copies; ++c)
    for (int64_t i = 0; i < N * K; ++i) wb[static_cast<size_t>(c * N * K + i)] = f32_to_bf16(w[i]);
  std::vector<int8_t> wq(static_cast<size_t>(int8_copies * N * K));
  std::vector<float> sq(static_cast<size_t>(int8_copies * N * (K / group)));
  for (int64_t c = 0; c < int8_copies; ++c)
    cpu::quantize_int8(w.data(), DType::kF32, N, K, group, wq.data() + c * N * K, sq.data() + c * N * (K / group));
  const bool panels = cpu::int8_panels_preferred(options);
  const int64_t panel_weights = cpu::int8_panel_count(N) * K * cpu::kInt8PanelColumns;
  const int64_t panel_scales = cpu::int8_panel_count(N) * (K / group) * cpu::kInt8PanelColumns;
  std::vector<int8_t> wp(panels ? static_cast<size_t>(int8_copies * panel_weights) : 0);
  std::vector<float> sp(panels ? static_cast<size_t>(int8_copies * panel_scales) : 0);
  for (int64_t c = 0; panels && c < int8_copies; ++c)
    cpu::pack_int8_panels(wq.data() + c * N * K, sq.data() + c * N * (K / group), N, K, group,
                          wp.data() + c * panel_weights, sp.data() + c * panel_scales);
  const double bf16_bytes = 2.0 * N * K, int8_bytes = 1.0 * N * K + 4.0 * N * (K / group);
  std::printf("linear %lld x %lld, group %lld, isa %s, %d rounds (medians)\n", static_cast<long long>(N),
              static_cast<long long>(K), static_cast<long long>(group), cpu::cpu_isa_name(bf16_options.isa), rounds);
  std::printf("| M | bf16 ms | int8 rows ms | int8 panels ms | int8 dot ms | bf16 weight GB/s | int8 panels weight GB/s "
              "| rows / bf16 | panels / bf16 | dot / bf16 |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (int64_t M : {1, 4, 8, 16, 32, 128}) {
    std::vector<float> x(M * K), y(M * N);
    for (float& v : x) v = u(rng);
    // Enough calls per round that one round reads every copy at least once.
    const int calls = static_cast<int>(std::max(bf16_copies, int8_copies));
    std::vector<double> tb, tq, tp, td;
    int64_t nb = 0, nq = 0, np = 0, nd = 0;
    cpu::detail::Int8LinearOptions dot = int8_options;
    dot.int8_activations = true;
    for (int r = 0; r < rounds + 1; ++r) {  // round 0 warms up
      auto t0 = Clock::now();
      for (int c = 0; c < calls; ++c, ++nb)
        cpu::detail::linear_with(bf16_options, x.data(), M, K, K, wb.data() + (nb % bf16_copies) * N * K, DType::kBF16,
                                 N, nullptr, y.data(), N, Activation::kNone);
      auto t1 = Clock::now();
      for (int c = 0; c < calls; ++c, ++nq)
        cpu::detail::linear_int8_with(int8_options, x.data(), M, K, K, wq.data() + (nq % int8_copies) * N * K,
                                      sq.data() + (nq % int8_copies) * N * (K / group), group, N, nullptr, y.data(),
                                      N, Activation::kNone);
      auto t2 = Clock::now();
      for (int c = 0; panels && c < calls; ++c, ++np)
        cpu::linear_int8_panels(x.data(), M, K, K, wp.data() + (np % int8_copies) * panel_weights,
                                sp.data() + (np % int8_copies) * panel_scales, group, N, nullptr, y.data(), N,
                                Activation::kNone);
      auto t2p = Clock::now();
      for (int c = 0; c < calls; ++c, ++nd)
        cpu::detail::linear_int8_with(dot, x.data(), M, K, K, wq.data() + (nd % int8_copies) * N * K,
                                      sq.data() + (nd % int8_copies) * N * (K / group), group, N, nullptr, y.data(),
                                      N, Activation::kNone);
      auto t3 = Clock::now();
      if (r == 0) continue;
      tb.push_back(std::chrono::duration<double>(t1 - t0).count() / calls);
      tq.push_back(std::chrono::duration<double>(t2 - t1).count() / calls);
      tp.push_back(std::chrono::duration<double>(t2p - t2).count() / calls);
      td.push_back(std::chrono::duration<double>(t3 - t2p).count() / calls);
    }
    const double b = median(tb), q = median(tq), pp = median(tp), dd = median(td);
    if (panels) {
      std::printf("| %lld | %.3f | %.3f | %.3f | %.3f | %.1f | %.1f | %.2fx | %.2fx | %.2fx |\n", static_cast<long long>(M),
                  b * 1e3, q * 1e3, pp * 1e3, dd * 1e3, bf16_bytes / b / 1e9, int8_bytes / pp / 1e9, b / q, b / pp, b / dd);
    } else {
      std::printf("| %lld | %.3f | %.3f | - | %.3f | %.1f | - | %.2fx | - | %.2fx |\n", static_cast<long long>(M), b * 1e3,
                  q * 1e3, dd * 1e3, bf16_bytes / b / 1e9, b / q, b / dd);
    }
  }
  return 0;
}
