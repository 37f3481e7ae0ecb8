#include "common/recycled_buffers.h"

#include <algorithm>
#include <mutex>

namespace tessera {

struct RecycledBuffers::Pool {
  std::mutex mu;
  std::vector<Tensor> free;  // u8 buffers, any size
};

RecycledBuffers::RecycledBuffers() : pool_(std::make_shared<Pool>()) {}

Tensor RecycledBuffers::take(const std::vector<int64_t>& dims, DType dtype) {
  const TensorView shape(nullptr, dtype, dims);
  const size_t bytes = std::max<size_t>(64, shape.nbytes());
  Tensor buffer;
  {
    std::lock_guard<std::mutex> lock(pool_->mu);
    // The smallest free buffer that is large enough, so large ones stay for large requests.
    auto best = pool_->free.end();
    for (auto it = pool_->free.begin(); it != pool_->free.end(); ++it) {
      if (it->nbytes() >= bytes && (best == pool_->free.end() || it->nbytes() < best->nbytes())) best = it;
    }
    if (best != pool_->free.end()) {
      buffer = std::move(*best);
      pool_->free.erase(best);
    }
  }
  if (buffer.empty()) buffer = Tensor::zeros({static_cast<int64_t>(bytes)}, DType::kU8);
  // The owner hands the buffer back when the last copy of the tensor goes (or frees it with
  // the pool gone).
  std::weak_ptr<Pool> weak = pool_;
  auto holder = std::make_shared<Tensor>(std::move(buffer));
  std::shared_ptr<const void> owner(holder->data<char>(), [holder, weak](const void*) {
    if (auto pool = weak.lock()) {
      std::lock_guard<std::mutex> lock(pool->mu);
      pool->free.push_back(std::move(*holder));
    }
  });
  return Tensor::borrowed(TensorView(holder->data<char>(), dtype, dims), std::move(owner));
}

size_t RecycledBuffers::free_bytes() const {
  std::lock_guard<std::mutex> lock(pool_->mu);
  size_t total = 0;
  for (const Tensor& t : pool_->free) total += t.nbytes();
  return total;
}

}  // namespace tessera
