// Backend::lora_add on the CPU: each row of each segment, in parallel over rows, shrinks x's
// row to the adapter's rank (t = a · x) and expands it into out's row (out += scale · b · t),
// every sum in input order. The adapters' factors are small beside the base layer (r of its
// rows and columns), so a row's work is a few dot products of the base row's length.
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace tessera {

void CpuBackend::lora_add_impl(const TensorView& x, const std::vector<LoraSegment>& segments, const TensorView& out) {
  std::vector<std::pair<const LoraSegment*, int64_t>> rows;  // (its segment, the row)
  for (const LoraSegment& s : segments)
    for (int64_t r = s.begin; r < s.end; ++r) rows.emplace_back(&s, r);
  const int64_t in = x.dim(1), n = out.dim(1);
#pragma omp parallel if (rows.size() > 1)
  {
    std::vector<float> t;
#pragma omp for schedule(static)
    for (size_t i = 0; i < rows.size(); ++i) {
      const LoraSegment& s = *rows[i].first;
      const float* xr = x.as<float>() + rows[i].second * x.row_stride();
      float* orow = out.as<float>() + rows[i].second * out.row_stride();
      const int64_t rank = s.a.dim(0);
      t.assign(static_cast<size_t>(rank), 0.0f);
      const float* a = s.a.as<float>();
      for (int64_t k = 0; k < rank; ++k) {
        float sum = 0.0f;
        for (int64_t j = 0; j < in; ++j) sum += a[k * in + j] * xr[j];
        t[static_cast<size_t>(k)] = sum;
      }
      const float* b = s.b.as<float>();
      for (int64_t j = 0; j < n; ++j) {
        float sum = 0.0f;
        for (int64_t k = 0; k < rank; ++k) sum += b[j * rank + k] * t[static_cast<size_t>(k)];
        orow[j] += s.scale * sum;
      }
    }
  }
}

}  // namespace tessera
