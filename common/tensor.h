#pragma once
// TensorView: a non-owning, trivially copyable view of contiguous row-major data on one
// device. Tensor: a view plus shared ownership of whatever backs it (a heap buffer, an
// mmap'd checkpoint file, later device memory). Slicing along the first dimension
// never allocates.
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
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  // Elements in one index of dimension 0 (product of the other dims).
  int64_t row_numel() const;

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // Rows [begin, begin + count) of dimension 0.
  TensorView rows(int64_t begin, int64_t count) const;
  TensorView row(int64_t i) const { return rows(i, 1).squeeze0(); }
  // Same data, new shape with the same element count.
  TensorView reshape(std::initializer_list<int64_t> dims) const;
  TensorView squeeze0() const;
  std::vector<int64_t> dims() const { return {shape.begin(), shape.begin() + ndim}; }
  std::string shape_string() const;  // "[4, 128]"
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
