#include "common/weight_file.h"

#include <sys/mman.h>
#include <unistd.h>

namespace tessera {

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool TensorInfo::contiguous() const {
  if (strides.empty()) return true;
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    // A dimension of size 1 may carry any stride without changing the layout.
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

void release_mapped_pages(const void* data, size_t nbytes) {
  if (data == nullptr || nbytes == 0) return;
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  // Only pages wholly inside the range: neighbouring tensors may share the edge pages.
  uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  uintptr_t end = begin + nbytes;
  uintptr_t first = (begin + page - 1) / page * page;
  uintptr_t last = end / page * page;
  if (last <= first) return;
  // Advisory: a failure only means the pages stay resident.
  ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

}  // namespace tessera
