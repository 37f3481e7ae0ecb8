#include "worker/checkpoint_backing.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "worker/weight_quantization.h"
#include "worker/weight_spill.h"

namespace tessera {

namespace {

// Where the kernels compute from a matrix in place, its elements must lie on their own size,
// as C++ reads them; nothing more. The kernels load weights unaligned, and decode streamed from
// a file whose data began 8 bytes off 64 ran as fast as from one on 64 (~1.1B bf16, 25%, map:
// 12.0 and 14.0 tok/s against 9.8 and 10.1, 2026-12-06, both on 2 MiB pages,
// worker/checkpoint_huge_pages.h; a third of the speed measured earlier was of a copy just
// written, whose page cache mapped on 4 KiB pages).
bool aligned(const void* data, DType dtype) { return reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) == 0; }

}  // namespace

std::optional<CheckpointSpan> checkpoint_span(const Checkpoint& checkpoint, const UnitTensors& tensors,
                                              bool rows_only) {
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
    if (t->view().ndim >= 2 && !rows_only && !aligned(t->view().data, t->view().dtype)) return std::nullopt;
    s.file = std::move(file);
    const size_t at = static_cast<size_t>(static_cast<const char*>(t->view().data) - s.file->whole_mapping().base);
    begin = std::min(begin, at);
    end = std::max(end, at + t->nbytes());
    inside += bytes;
  }
  if (s.file == nullptr) return std::nullopt;
  s.offset = begin / kSpillPage * kSpillPage;
  s.span = align_up(end, kSpillPage) - s.offset;  // (the mapping takes the file's last page whole)
  if (s.span > static_cast<size_t>(inside) + static_cast<size_t>(inside) / 4 + 2 * kSpillPage) return std::nullopt;
  return s;
}

int64_t copy_resident_from_files(ModelWeights& w, const std::vector<const WeightFile*>& files,
                                 const std::vector<const Tensor*>& streamed) {
  auto in_files = [&](const Tensor& t) {
    return std::any_of(files.begin(), files.end(),
                       [&](const WeightFile* f) { return f->whole_mapping().holds(t.view().data, t.nbytes()); });
  };
  const std::unordered_set<const Tensor*> skip(streamed.begin(), streamed.end());
  int64_t copied = 0;
  auto own = [&](Tensor& t) {
    if (t.empty() || skip.contains(&t) || t.view().data == w.embed.view().data || !in_files(t)) return;
    const TensorView v = t.view();
    Tensor copy = Tensor::zeros(v.dims(), v.dtype);
    // Row by row: a row view of a fused tensor may be strided.
    const size_t row = static_cast<size_t>(v.row_numel()) * dtype_size(v.dtype);
    const int64_t rows = v.ndim == 0 ? 1 : v.dim(0);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(copy.data<char>() + static_cast<size_t>(r) * row,
                  static_cast<const char*>(v.data) + static_cast<size_t>(r * v.row_stride()) * dtype_size(v.dtype), row);
    }
    copied += static_cast<int64_t>(copy.nbytes());
    t = std::move(copy);
  };
  for (Tensor* t : {&w.pos_embed, &w.embed_norm_w, &w.embed_norm_b, &w.final_norm_w, &w.final_norm_b, &w.lm_head.w,
                    &w.lm_head.b, &w.lm_head.scales})
    own(*t);
  for (LayerWeights& lw : w.layers) for_each_layer_tensor(lw, own);
  return copied;
}

bool load_layers_as_stored(const Checkpoint& checkpoint, const WeightLoadOptions& options) {
  if (options.shard.world != 1 || checkpoint.from_gguf()) return false;
  if (resolve_quantization(options.quant, checkpoint).enabled()) return false;
  if (options.quant.bf16_coding == Bf16Coding::kOn) return false;  // coded layers are not as stored
  for (const auto& file : checkpoint.files()) {
    if (file->whole_mapping().base == nullptr) return false;
    for (const TensorInfo& info : file->tensors())
      if (info.shape.size() >= 2 &&
          (!info.dtype_supported || info.dtype != options.dtype || !info.contiguous() || !aligned(info.data, info.dtype)))
        return false;
  }
  return true;
}

bool checkpoint_takes_direct_reads(const Checkpoint& checkpoint) {
  for (const auto& file : checkpoint.files()) {
    const int fd = ::open(file->path().c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) return false;
    ::close(fd);
  }
  return true;
}

}  // namespace tessera
