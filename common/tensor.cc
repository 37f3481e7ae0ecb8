#include "common/tensor.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "common/huge_pages.h"

namespace tessera {

TensorView::TensorView(void* d, DType t, std::initializer_list<int64_t> dims, DeviceKind dev)
    : data(d), dtype(t), device(dev), ndim(static_cast<int>(dims.size())) {
  // No temporary vector: views are built on the decode path.
  TESSERA_CHECK_LE(ndim, kMaxTensorDims);
  int i = 0;
  for (int64_t d0 : dims) shape[i++] = d0;
}

TensorView::TensorView(void* d, DType t, const std::vector<int64_t>& dims, DeviceKind dev)
    : data(d), dtype(t), device(dev), ndim(static_cast<int>(dims.size())) {
  TESSERA_CHECK_LE(ndim, kMaxTensorDims);
  for (int i = 0; i < ndim; ++i) shape[i] = dims[i];
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

int64_t TensorView::row_numel() const {
  int64_t n = 1;
  for (int i = 1; i < ndim; ++i) n *= shape[i];
  return n;
}

TensorView TensorView::rows(int64_t begin, int64_t count) const {
  TESSERA_CHECK_GE(ndim, 1);
  TESSERA_CHECK(begin >= 0 && count >= 0 && begin + count <= shape[0])
      << "rows [" << begin << ", " << begin + count << ") of " << shape_string();
  TensorView v = *this;
  v.shape[0] = count;
  v.data = static_cast<char*>(data) + begin * row_stride() * static_cast<int64_t>(dtype_size(dtype));
  return v;
}

TensorView TensorView::columns(int64_t begin, int64_t count) const {
  TESSERA_CHECK_EQ(ndim, 2) << "columns of a " << ndim << "-d view " << shape_string();
  TESSERA_CHECK(begin >= 0 && count >= 0 && begin + count <= shape[1])
      << "columns [" << begin << ", " << begin + count << ") of " << shape_string();
  TensorView v = *this;
  v.stride0 = row_stride();
  v.shape[1] = count;
  v.data = static_cast<char*>(data) + begin * static_cast<int64_t>(dtype_size(dtype));
  return v;
}

TensorView TensorView::reshape(std::initializer_list<int64_t> dims) const {
  TensorView v(data, dtype, dims, device);
  TESSERA_CHECK_EQ(v.numel(), numel()) << "reshape " << shape_string() << " to " << v.shape_string();
  if (!contiguous()) {
    TESSERA_CHECK(v.ndim >= 1 && v.shape[0] == shape[0])
        << "reshape " << shape_string() << " to " << v.shape_string()
        << ": a strided view can only be reshaped within its rows (dimension 0 kept)";
    v.stride0 = row_stride();
  }
  return v;
}

TensorView TensorView::squeeze0() const {
  TESSERA_CHECK_GE(ndim, 1);
  TensorView v = *this;
  for (int i = 1; i < ndim; ++i) v.shape[i - 1] = shape[i];
  v.shape[ndim - 1] = 0;
  v.ndim = ndim - 1;
  v.stride0 = 0;  // one row of the old view: its dimensions were contiguous
  return v;
}

std::string TensorView::shape_string() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  if (!contiguous()) os << " (row stride " << row_stride() << ")";
  return os.str();
}

namespace {
// From this size on zeros() maps fresh pages rather than allocating and clearing them.
constexpr size_t kLazyZeroBytes = kHugePageBytes;
}  // namespace

Tensor Tensor::zeros(const std::vector<int64_t>& dims, DType dtype) {
  Tensor t;
  t.view_ = TensorView(nullptr, dtype, dims);
  size_t bytes = t.view_.nbytes();
  size_t padded = (bytes + 63) / 64 * 64;
  if (padded == 0) padded = 64;
  if (padded >= kLazyZeroBytes) {
    // Large buffers (a KV pool, weights) come straight from the kernel: its anonymous pages
    // read as zero until first written, so a pool of 65,536 blocks costs no set-up time and
    // resident memory grows with the blocks actually used, instead of a memset touching
    // every page up front. On huge pages where the kernel grants them (advice only), because
    // weights are read whole every step: on 4 KiB pages (the ~100M model's 55,000 of them),
    // the first step after a second of idling took 78–117 ms for a 128-token prefill that
    // takes 55–60 when steps run back to back (address translation gone cold: the time went
    // to the memory-bound loops, with no page faults); on 2 MiB pages, 60–68 ms. The range
    // starts on a huge-page boundary so all of it can be.
    const size_t reserved = padded + kHugePageBytes;
    void* m = mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TESSERA_CHECK(m != MAP_FAILED) << "out of memory allocating " << padded << " bytes: " << std::strerror(errno);
    const uintptr_t aligned = (reinterpret_cast<uintptr_t>(m) + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    t.view_.data = reinterpret_cast<void*>(aligned);
    t.owner_ = std::shared_ptr<const void>(m, [reserved](const void* q) { munmap(const_cast<void*>(q), reserved); });
    // Under a HugePageDeferral (weights loaded with model.weights_huge_pages after_start) the
    // advice waits until the pages are written (common/huge_pages.h says why).
    const size_t windows = (reinterpret_cast<uintptr_t>(m) + reserved - aligned) / kHugePageBytes * kHugePageBytes;
    if (!HugePageDeferral::defer(t.owner_, t.view_.data, windows)) madvise(t.view_.data, padded, MADV_HUGEPAGE);
    return t;
  }
  void* p = std::aligned_alloc(64, padded);
  TESSERA_CHECK(p != nullptr) << "out of memory allocating " << padded << " bytes";
  std::memset(p, 0, padded);
  t.view_.data = p;
  t.owner_ = std::shared_ptr<const void>(p, [](const void* q) { std::free(const_cast<void*>(q)); });
  return t;
}

Tensor Tensor::borrowed(TensorView view, std::shared_ptr<const void> owner) {
  Tensor t;
  t.view_ = view;
  t.owner_ = std::move(owner);
  return t;
}

}  // namespace tessera
