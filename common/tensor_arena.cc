#include "common/tensor_arena.h"

#include <memory>

namespace tessera {

Tensor TensorArena::zeros(const std::vector<int64_t>& dims, DType dtype) {
  const TensorView shape(nullptr, dtype, dims);
  const size_t bytes = (shape.nbytes() + 63) / 64 * 64;
  if (bytes >= chunk_bytes_) return Tensor::zeros(dims, dtype);
  if (chunk_.empty() || used_ + bytes > chunk_bytes_) {
    chunk_ = Tensor::zeros({static_cast<int64_t>(chunk_bytes_)}, DType::kI8);
    used_ = 0;
  }
  TensorView view(chunk_.data<char>() + used_, dtype, dims);
  used_ += bytes;
  return Tensor::borrowed(view, std::make_shared<Tensor>(chunk_));
}

}  // namespace tessera
