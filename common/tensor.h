#pragma once
// TensorView: a non-owning, trivially copyable view of row-major data on one device. The
// dimensions after the first are contiguous; rows of dimension 0 may lie further apart than
// their width (a column slice of a wider matrix: the q, k and v parts of a fused QKV
// output). Tensor: a view plus shared ownership of whatever backs it (a heap buffer, an
// mmap'd checkpoint file, later device memory). Slicing and viewing never allocate.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/dtype.h"

namespace tessera {

enum class DeviceKind : uint8_t { kCpu, kCuda };

constexpr int kMaxTensorDims = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  DeviceKind device = DeviceKind::kCpu;
  int ndim = 0;
  std::array<int64_t, kMaxTensorDims> shape{};
  // Elements from one index of dimension 0 to the next; 0 is contiguous (row_numel()).
  // Read it through row_stride().
  int64_t stride0 = 0;

  TensorView() = default;
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> dims,
             DeviceKind device = DeviceKind::kCpu);
  TensorView(void* data, DType dtype, const std::vector<int64_t>& dims,
             DeviceKind device = DeviceKind::kCpu);

  bool empty() const { return data == nullptr; }
  int64_t dim(int i) const {
    TESSERA_CHECK(i >= 0 && i < ndim) << "dim " << i << " of a " << ndim << "-d tensor";
    return shape[i];
  }
  int64_t numel() const;
  // Bytes of the elements (for a strided view, not the span they lie in).
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  // Elements in one index of dimension 0 (product of the other dims).
  int64_t row_numel() const;
  // Elements between consecutive indices of dimension 0 (>= row_numel()).
  int64_t row_stride() const { return stride0 > 0 ? stride0 : row_numel(); }
  // Whether the elements are one dense block (what a byte copy of nbytes() needs).
  bool contiguous() const { return ndim == 0 || shape[0] <= 1 || row_stride() == row_numel(); }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // Rows [begin, begin + count) of dimension 0 (the row stride is kept).
  TensorView rows(int64_t begin, int64_t count) const;
  TensorView row(int64_t i) const { return rows(i, 1).squeeze0(); }
  // Columns [begin, begin + count) of a 2-D view: same rows, same row stride, so the result
  // is strided unless it spans the whole row.
  TensorView columns(int64_t begin, int64_t count) const;
  // Same data, new shape with the same element count. A strided view can only be reshaped
  // within its rows (the new dimension 0 is the old one: [T, H * D] -> [T, H, D]).
  TensorView reshape(std::initializer_list<int64_t> dims) const;
  // The first index of dimension 0, with that dimension dropped (always contiguous).
  TensorView squeeze0() const;
  std::vector<int64_t> dims() const { return {shape.begin(), shape.begin() + ndim}; }
  std::string shape_string() const;  // "[4, 128]", or "[4, 128] (row stride 384)" when strided
};

// Transparent huge pages are 2 MiB on x86-64 and (with 4 KiB base pages) arm64. From this size
// on Tensor::zeros maps its tensors on huge pages where the kernel grants them (it says why).
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

class Tensor {
 public:
  Tensor() = default;
  // A zero-initialised, 64-byte-aligned host tensor.
  static Tensor zeros(const std::vector<int64_t>& dims, DType dtype);
  // A view kept alive by `owner` (e.g. an mmap'd file).
  static Tensor borrowed(TensorView view, std::shared_ptr<const void> owner);

  const TensorView& view() const { return view_; }
  TensorView& mutable_view() { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT(implicit)
  bool empty() const { return view_.empty(); }
  DType dtype() const { return view_.dtype; }
  int64_t dim(int i) const { return view_.dim(i); }
  int ndim() const { return view_.ndim; }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }
  template <typename T>
  T* data() const {
    return view_.as<T>();
  }

 private:
  TensorView view_;
  std::shared_ptr<const void> owner_;
};

}  // namespace tessera
