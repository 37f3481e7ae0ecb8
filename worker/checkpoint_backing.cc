#include "worker/checkpoint_backing.h"

#include <algorithm>
#include <unordered_set>

#include "worker/weight_quantization.h"
#include "worker/weight_spill.h"

namespace tessera {

std::optional<CheckpointSpan> checkpoint_span(const Checkpoint& checkpoint, const UnitTensors& tensors) {
  CheckpointSpan s;
  size_t begin = SIZE_MAX, end = 0;
  int64_t inside = 0;
  std::unordered_set<const void*> seen;  // a buffer shared by two views counts once
  for (const Tensor* t : tensors) {
    if (t->empty() || !seen.insert(t->view().data).second) continue;
    const auto bytes = static_cast<int64_t>(t->nbytes());
    std::shared_ptr<const WeightFile> file = checkpoint.file_holding(t->view().data, t->nbytes());
    if (file == nullptr || (s.file != nullptr && file != s.file)) {
      if (t->view().ndim >= 2) return std::nullopt;  // a matrix copied at load, or in another file
      s.outside_bytes += bytes;
      continue;
    }
    s.file = std::move(file);
    const size_t at = static_cast<size_t>(static_cast<const char*>(t->view().data) - s.file->whole_mapping().base);
    begin = std::min(begin, at);
    end = std::max(end, at + t->nbytes());
    inside += bytes;
  }
  if (s.file == nullptr) return std::nullopt;
  s.offset = begin / kSpillPage * kSpillPage;
  s.span = std::min(align_up(end, kSpillPage), s.file->whole_mapping().size) - s.offset;
  if (s.span > static_cast<size_t>(inside) + static_cast<size_t>(inside) / 4 + 2 * kSpillPage) return std::nullopt;
  return s;
}

bool load_layers_as_stored(const Checkpoint& checkpoint, const WeightLoadOptions& options) {
  if (options.shard.world != 1 || checkpoint.from_gguf()) return false;
  if (resolve_quantization(options.quant, checkpoint).enabled()) return false;
  for (const auto& file : checkpoint.files()) {
    if (file->whole_mapping().base == nullptr) return false;
    for (const TensorInfo& info : file->tensors())
      if (info.shape.size() >= 2 && (!info.dtype_supported || info.dtype != options.dtype || !info.contiguous()))
        return false;
  }
  return true;
}

}  // namespace tessera
