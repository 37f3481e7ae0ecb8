// Element-wise, normalisation, embedding and routing ops of the CPU backend. The heavy ops
// live in their own files: linear (linear_cpu.cc) and paged attention (attention_cpu.cc).
#include "kernels/cpu/cpu_backend.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>
#include <numeric>
#include <string>

#include "common/cgroup_memory.h"
#include "common/gguf/ggml_dequant.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/gated_silu.h"
#include "kernels/cpu/linear_cpu.h"
#include "kernels/coded_bf16.h"
#include "kernels/cpu/linear_coded_bf16.h"
#include "kernels/cpu/linear_int4.h"
#include "kernels/cpu/linear_int8.h"
#include "kernels/cpu/linear_int8_panels.h"
#include "kernels/cpu/rejection_sample.h"
#include "kernels/cpu/sum_exp.h"

namespace tessera {
namespace {

// Reads element i of a float-storage tensor as f32.
inline float load_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
}

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelGrain = 1 << 14;

void layer_norm_row(const float* x, const TensorView& gamma, const TensorView& beta, float eps,
                    int64_t h, float* out) {
  // Two passes in double for the statistics: rows are short, and it keeps us within
  // float rounding of PyTorch's result whatever the summation order.
  double mean = 0;
  for (int64_t i = 0; i < h; ++i) mean += x[i];
  mean /= static_cast<double>(h);
  double var = 0;
  for (int64_t i = 0; i < h; ++i) {
    double d = x[i] - mean;
    var += d * d;
  }
  var /= static_cast<double>(h);
  const float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
  const float m = static_cast<float>(mean);
  for (int64_t i = 0; i < h; ++i) {
    out[i] = (x[i] - m) * inv * load_f32(gamma.data, gamma.dtype, i) + load_f32(beta.data, beta.dtype, i);
  }
}

void rms_norm_row(const float* x, const TensorView& gamma, float eps, int64_t h, float* out) {
  double ss = 0;
  for (int64_t i = 0; i < h; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(h) + eps));
  // Llama normalises in f32, then multiplies by the weight.
  for (int64_t i = 0; i < h; ++i) out[i] = load_f32(gamma.data, gamma.dtype, i) * (x[i] * inv);
}

}  // namespace

namespace {

// Pins each OpenMP thread to its own CPU of those this process may use (what
// OMP_PROC_BIND=close OMP_PLACES=cores would do). Unpinned, a busy host can leave two of
// our threads on one core while the others spin at a barrier: measured here as decode
// steps 30x slower whenever another process was runnable, against ~3x when pinned. Only
// when CpuKernelOptions::pin_threads (off when the user set OMP_PROC_BIND/OMP_PLACES).
void pin_threads() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  if (cpus.size() < 2) return;
#pragma omp parallel
  {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[omp_get_thread_num() % cpus.size()], &one);
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
  }
}

}  // namespace

static Status unavailable_memory_info(const std::string& why) {
  return Status(StatusCode::kUnavailable, "cpu backend: host memory unknown: " + why);
}

CpuBackend::CpuBackend(int num_threads, const CpuKernelOptions& options) : options_(options) {
  if (num_threads > 0) omp_set_num_threads(num_threads);
  static std::once_flag pinned;  // the OpenMP pool is per process
  if (options_.pin_threads) std::call_once(pinned, pin_threads);
}

bool CpuBackend::prefers_int8_panels() const { return cpu::int8_panels_preferred(options_); }

bool CpuBackend::codes_bf16_fast() const {
  return cpu::detail::coded_bf16_gemv_runs(cpu::detail::linear_options(options_), 1);
}

Tensor CpuBackend::alloc(const std::vector<int64_t>& dims, DType dtype) { return pool_->zeros(dims, dtype); }

Tensor CpuBackend::alloc_persistent(const std::vector<int64_t>& dims, DType dtype) {
  return Tensor::zeros(dims, dtype);
}

void CpuBackend::bound_activation_memory(int64_t bytes) {
  pool_->set_limit(static_cast<size_t>(std::max<int64_t>(bytes, 0)));
}

void CpuBackend::copy_to_host(const TensorView& src, void* dst) {
  TESSERA_CHECK(src.contiguous()) << "copy_to_host: " << src.shape_string() << " is strided, not one block of bytes";
  std::memcpy(dst, src.data, src.nbytes());
}

void CpuBackend::copy_from_host(const void* src, const TensorView& dst) {
  TESSERA_CHECK(dst.contiguous()) << "copy_from_host: " << dst.shape_string() << " is strided, not one block of bytes";
  std::memcpy(dst.data, src, dst.nbytes());
}

Tensor CpuBackend::place_weight(const Tensor& host) { return host; }

StatusOr<MemoryInfo> CpuBackend::memory_info() const {
  // MemAvailable (not MemFree): the kernel's estimate of what can be allocated without
  // swapping, page cache it would drop included.
  std::ifstream in("/proc/meminfo");
  if (!in) return unavailable_memory_info("cannot read /proc/meminfo");
  MemoryInfo m;
  bool have_free = false, have_total = false;
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);  // " kB"
    if (key == "MemAvailable:") {
      m.free_bytes = kib * 1024;
      have_free = true;
    } else if (key == "MemTotal:") {
      m.total_bytes = kib * 1024;
      have_total = true;
    }
  }
  if (!have_free || !have_total) return unavailable_memory_info("/proc/meminfo has no MemAvailable or MemTotal line");
  // In a container the cgroup's limit is what this process may use, not the host's memory.
  if (const std::optional<CgroupMemory> cg = this_process_cgroup_memory()) {
    m.total_bytes = std::min(m.total_bytes, cg->limit_bytes);
    m.free_bytes = std::min(m.free_bytes, cg->available_bytes);
  }
  return m;
}

namespace {

// Each token's row of a table of `rows` rows of h values into out (f32 [T, h]) through
// copy_row(row, dst), row_offset as Backend::embedding says: zeros for another rank's ids.
template <typename CopyRow>
void gather_table_rows(const TensorView& ids, int64_t rows, int64_t row_offset, const TensorView& out,
                       CopyRow&& copy_row) {
  const int64_t h = out.dim(1);
  const int32_t* id = ids.as<int32_t>();
  float* o = out.as<float>();
  for (int64_t t = 0; t < ids.dim(0); ++t) {
    const int64_t row = id[t] - std::max<int64_t>(row_offset, 0);
    if (row_offset >= 0 && (row < 0 || row >= rows)) {  // another rank's part of the vocabulary
      std::fill(o + t * h, o + (t + 1) * h, 0.0f);
      continue;
    }
    TESSERA_CHECK(row >= 0 && row < rows) << "token id " << id[t] << " outside vocab " << rows;
    copy_row(row, o + t * h);
  }
}

}  // namespace

void CpuBackend::embedding_impl(const TensorView& ids, const TensorView& table, const TensorView& out,
                                int64_t row_offset) {
  const int64_t h = table.dim(1);
  gather_table_rows(ids, table.dim(0), row_offset, out, [&](int64_t row, float* dst) {
    const char* src = static_cast<const char*>(table.data) + row * h * dtype_size(table.dtype);
    convert_elements(src, table.dtype, dst, DType::kF32, h);
  });
}

void CpuBackend::embedding_coded_bf16_impl(const TensorView& ids, const TensorView& body, const TensorView& side,
                                           const TensorView& out, int64_t row_offset) {
  const int64_t h = out.dim(1), rows = body.dim(0);
  thread_local std::vector<uint16_t> row_buffer;
  if (static_cast<int64_t>(row_buffer.size()) < h) row_buffer.resize(static_cast<size_t>(h));
  gather_table_rows(ids, rows, row_offset, out, [&](int64_t row, float* dst) {
    decode_coded_bf16_rows(body.as<uint8_t>(), side.as<int32_t>(), rows, side.dim(0), h, row, row + 1, 0, h,
                           row_buffer.data());
    convert_elements(row_buffer.data(), DType::kBF16, dst, DType::kF32, h);
  });
}

void CpuBackend::embedding_ggml_impl(const TensorView& ids, const TensorView& table, uint32_t ggml_type,
                                     const TensorView& out, int64_t row_offset) {
  const int64_t h = out.dim(1), row_bytes = table.dim(1);
  gather_table_rows(ids, table.dim(0), row_offset, out, [&](int64_t row, float* dst) {
    // The front checked the type and the row's whole blocks.
    TESSERA_CHECK(dequantize_ggml(ggml_type, table.as<uint8_t>() + row * row_bytes, h, dst).is_ok());
  });
}

void CpuBackend::layer_norm_impl(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                                 float eps, const TensorView& out) {
  const int64_t rows = x.dim(0), h = x.dim(1);
#pragma omp parallel for if (rows * h > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) layer_norm_row(x.as<float>() + r * h, gamma, beta, eps, h, out.as<float>() + r * h);
}

void CpuBackend::rms_norm_impl(const TensorView& x, const TensorView& gamma, float eps,
                               const TensorView& out) {
  const int64_t rows = x.dim(0), h = x.dim(1);
#pragma omp parallel for if (rows * h > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) rms_norm_row(x.as<float>() + r * h, gamma, eps, h, out.as<float>() + r * h);
}

void CpuBackend::residual_add_norm_impl(const TensorView& residual, const TensorView& delta,
                                        const TensorView& gamma, const TensorView& beta, float eps,
                                        bool rms, const TensorView& out) {
  const int64_t rows = residual.dim(0), h = residual.dim(1);
#pragma omp parallel for if (rows * h > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    float* res = residual.as<float>() + r * h;
    const float* d = delta.as<float>() + r * h;
    for (int64_t i = 0; i < h; ++i) res[i] += d[i];
    if (rms) {
      rms_norm_row(res, gamma, eps, h, out.as<float>() + r * h);
    } else {
      layer_norm_row(res, gamma, beta, eps, h, out.as<float>() + r * h);
    }
  }
}

namespace {
// A linear's bias as f32: itself, or widened into *storage (biases are tiny: once per call).
const float* f32_bias(const TensorView& bias, Tensor* storage) {
  if (bias.empty()) return nullptr;
  if (bias.dtype == DType::kF32) return bias.as<float>();
  *storage = Tensor::zeros({bias.numel()}, DType::kF32);
  convert_elements(bias.data, bias.dtype, storage->data<float>(), DType::kF32, bias.numel());
  return storage->data<float>();
}
}  // namespace

void CpuBackend::linear_int8_impl(const TensorView& x, const TensorView& w, const TensorView& scales,
                                  const TensorView& bias, const TensorView& out, Activation act) {
  Tensor bias_f32;
  const float* b = f32_bias(bias, &bias_f32);
  if (w.ndim == 3) {
    cpu::linear_int8_panels(x.as<float>(), x.dim(0), x.dim(1), x.dim(1), w.as<int8_t>(), scales.as<float>(),
                            x.dim(1) / scales.dim(1), out.dim(1), b, out.as<float>(), out.dim(1), act);
    return;
  }
  cpu::detail::linear_int8_with(cpu::detail::int8_linear_options(options_), x.as<float>(), x.dim(0), x.dim(1),
                                x.dim(1), w.as<int8_t>(), scales.as<float>(), w.dim(1) / scales.dim(1), w.dim(0), b,
                                out.as<float>(), out.dim(1), act);
}

void CpuBackend::linear_int4_impl(const TensorView& x, const TensorView& w, const TensorView& scales,
                                  const TensorView& bias, const TensorView& out, Activation act) {
  Tensor bias_f32;
  const float* b = f32_bias(bias, &bias_f32);
  cpu::linear_int4(cpu::Int4LinearOptions{usable_cpu_isa(options_.isa)}, *int4_scheme_of(w, scales), x.as<float>(),
                   x.dim(0), x.dim(1), x.dim(1), w.as<uint8_t>(), scales.as<uint8_t>(), out.dim(1), b,
                   out.as<float>(), out.dim(1), act);
}

void CpuBackend::linear_coded_bf16_impl(const TensorView& x, const TensorView& body, const TensorView& side,
                                        const TensorView& bias, const TensorView& out, Activation act) {
  Tensor bias_f32;
  const float* b = f32_bias(bias, &bias_f32);
  cpu::linear_coded_bf16(cpu::detail::linear_options(options_), x.as<float>(), x.dim(0), x.dim(1), x.dim(1),
                         body.as<uint8_t>(), side.as<int32_t>(), side.dim(0), out.dim(1), b, out.as<float>(),
                         out.dim(1), act);
}

void CpuBackend::linear_impl(const TensorView& x, const TensorView& w, const TensorView& bias,
                             const TensorView& out, Activation act) {
  Tensor bias_f32;
  const float* b = f32_bias(bias, &bias_f32);
  cpu::detail::linear_with(cpu::detail::linear_options(options_), x.as<float>(), x.dim(0), x.dim(1), x.dim(1),
                           w.data, w.dtype, w.dim(0), b, out.as<float>(), out.dim(1), act);
}

void CpuBackend::activate_impl(const TensorView& x, Activation act) {
  float* p = x.as<float>();
  const int64_t n = x.numel();
#pragma omp parallel for if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) p[i] = cpu::activate(p[i], act);
}

void CpuBackend::gated_act_impl(const TensorView& gate_v, const TensorView& up_v, const TensorView& out_v,
                                Activation act) {
  const float* gate = gate_v.as<float>();
  const float* up = up_v.as<float>();
  float* out = out_v.as<float>();
  const int64_t tokens = gate_v.dim(0), width = gate_v.dim(1), in_stride = gate_v.row_stride();
  const cpu::CpuIsa isa = usable_cpu_isa(options_.isa);
#pragma omp parallel for if (tokens * width > kParallelGrain)
  for (int64_t t = 0; t < tokens; ++t) {
    const float* g = gate + t * in_stride;
    const float* u = up + t * in_stride;
    float* o = out + t * width;
    // The common case gets its own kernel (vector exp), so the compiler sees no switch inside it.
    if (act == Activation::kSilu) {
      cpu::gated_silu_row(isa, g, u, width, o);
    } else {
      for (int64_t i = 0; i < width; ++i) o[i] = cpu::activate(g[i], act) * u[i];
    }
  }
}

void CpuBackend::add_impl(const TensorView& a, const TensorView& b, const TensorView& out) {
  const float* pa = a.as<float>();
  const float* pb = b.as<float>();
  float* po = out.as<float>();
  const int64_t n = a.numel();
#pragma omp parallel for if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
}

void CpuBackend::scale_impl(const TensorView& x, float factor) {
  float* p = x.as<float>();
  const int64_t n = x.numel();
#pragma omp parallel for if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) p[i] *= factor;
}

void CpuBackend::greedy_rows_impl(const TensorView& logits, const TensorView& ids, const TensorView& logprobs) {
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  const float* l = logits.as<float>();
  int32_t* id = ids.as<int32_t>();
  float* lp = logprobs.as<float>();
  // A pass over the vocabulary per row: rows spread over the cores, as the sampler spreads them.
#pragma omp parallel for schedule(dynamic, 1) if (rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = l + r * vocab;
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; ++i)
      if (row[i] > row[best]) best = i;
    const float mx = row[best];
    id[r] = static_cast<int32_t>(best);
    lp[r] = static_cast<float>(row[best] - (mx + std::log(cpu::sum_exp_shifted(row, vocab, mx))));
  }
}

void CpuBackend::rejection_sample_rows_impl(const TensorView& p, const TensorView& q, const TensorView& proposals,
                                            const TensorView& uniforms, const TensorView& tokens,
                                            const TensorView& accepted) {
  const int64_t rows = p.dim(0), vocab = p.dim(1);
  const int64_t* n = uniforms.as<int64_t>();
#pragma omp parallel for schedule(dynamic, 1) if (rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const cpu::RowVerdict verdict =
        cpu::rejection_sample_row(p.as<float>() + r * vocab, q.as<float>() + r * vocab, vocab, proposals.as<int32_t>()[r],
                             static_cast<double>(n[2 * r]) * 0x1.0p-53, static_cast<double>(n[2 * r + 1]) * 0x1.0p-53);
    tokens.as<int32_t>()[r] = verdict.token;
    accepted.as<int32_t>()[r] = verdict.accepted ? 1 : 0;
  }
}

void CpuBackend::softcap_impl(const TensorView& x, float cap) {
  float* p = x.as<float>();
  const int64_t n = x.numel();
#pragma omp parallel for if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) p[i] = cap * std::tanh(p[i] / cap);
}

void CpuBackend::rotary_impl(const TensorView& x_v, const TensorView& positions_v, const TensorView& inv_freq,
                             float magnitude) {
  float* x = x_v.as<float>();
  const int32_t* positions = positions_v.as<int32_t>();
  const int64_t tokens = x_v.dim(0), heads = x_v.dim(1), head_dim = x_v.dim(2), row_stride = x_v.row_stride();
  const int64_t half = inv_freq.numel();
  const float* freq = inv_freq.as<float>();
#pragma omp parallel for if (tokens * heads * head_dim > kParallelGrain)
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> cos_v(half), sin_v(half);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[t]) * freq[i];
      cos_v[i] = magnitude * std::cos(angle);
      sin_v[i] = magnitude * std::sin(angle);
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * row_stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * cos_v[i] - x1 * sin_v[i];
        v[i + half] = x1 * cos_v[i] + x0 * sin_v[i];
      }
    }
  }
}

void CpuBackend::head_rms_norm_impl(const TensorView& x_v, const TensorView& gamma, float eps) {
  float* x = x_v.as<float>();
  const int64_t tokens = x_v.dim(0), heads = x_v.dim(1), head_dim = x_v.dim(2), row_stride = x_v.row_stride();
#pragma omp parallel for if (tokens * heads * head_dim > kParallelGrain)
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * row_stride + h * head_dim;
      rms_norm_row(v, gamma, eps, head_dim, v);  // in place: each element is read before it is written
    }
  }
}

void CpuBackend::write_kv_impl(const TensorView& k_v, const TensorView& v_v, const AttentionBatch& batch,
                               const TensorView& k_cache, const TensorView& v_cache) {
  const float* k = k_v.as<float>();
  const float* v = v_v.as<float>();
  const int64_t tokens = k_v.dim(0), row_stride = k_v.row_stride();
  const int64_t width = k_cache.dim(2) * k_cache.dim(3);
  const int64_t slots = k_cache.dim(0) * k_cache.dim(1);
  const size_t esize = dtype_size(k_cache.dtype);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = batch.slot_mapping[t];
    TESSERA_CHECK(slot >= 0 && slot < slots) << "slot " << slot;
    // Rounded to the cache dtype here, once; attention widens back to f32.
    convert_elements(k + t * row_stride, DType::kF32, static_cast<char*>(k_cache.data) + slot * width * esize,
                     k_cache.dtype, width);
    convert_elements(v + t * row_stride, DType::kF32, static_cast<char*>(v_cache.data) + slot * width * esize,
                     v_cache.dtype, width);
  }
}

void CpuBackend::copy_block_impl(const TensorView& pool, int64_t src, int64_t dst) {
  const size_t bytes = static_cast<size_t>(pool.row_numel()) * dtype_size(pool.dtype);
  char* base = static_cast<char*>(pool.data);
  std::memcpy(base + dst * bytes, base + src * bytes, bytes);
}

void CpuBackend::moe_topk_impl(const TensorView& logits, int top_k, bool normalize, const TensorView& weights,
                               const TensorView& ids) {
  const int64_t tokens = logits.dim(0), experts = logits.dim(1);
  std::vector<float> prob(experts);
  std::vector<int32_t> order(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits.as<float>() + t * experts;
    const float mx = *std::max_element(l, l + experts);
    float sum = 0;
    for (int64_t e = 0; e < experts; ++e) sum += prob[e] = std::exp(l[e] - mx);
    for (int64_t e = 0; e < experts; ++e) prob[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    // Stable: among equal probabilities the lower expert id wins.
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return prob[a] > prob[b]; });
    float chosen = 0;
    for (int k = 0; k < top_k; ++k) chosen += prob[order[k]];
    for (int k = 0; k < top_k; ++k) {
      weights.as<float>()[t * top_k + k] = normalize ? prob[order[k]] / chosen : prob[order[k]];
      ids.as<int32_t>()[t * top_k + k] = order[k];
    }
  }
}

void CpuBackend::gather_rows_impl(const TensorView& x, const std::vector<int32_t>& rows,
                                  const TensorView& out) {
  const int64_t h = x.dim(1);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(out.as<float>() + i * h, x.as<float>() + rows[i] * h, h * sizeof(float));
  }
}

void CpuBackend::scatter_add_scaled_impl(const TensorView& x, const std::vector<int32_t>& rows,
                                         const std::vector<float>& scale, const TensorView& out) {
  const int64_t h = x.dim(1);
  for (size_t i = 0; i < rows.size(); ++i) {
    float* o = out.as<float>() + rows[i] * h;
    const float* xi = x.as<float>() + i * h;
    for (int64_t j = 0; j < h; ++j) o[j] += scale[i] * xi[j];
  }
}

}  // namespace tessera
