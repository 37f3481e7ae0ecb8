#pragma once
// What every checkpoint file format (safetensors, PyTorch zip, PyTorch legacy) hands the
// Checkpoint: a list of tensors, each a view into the file's read-only mapping, and a way to
// drop a tensor's resident pages once a converted copy exists.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace tessera {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;  // meaningful only when dtype_supported
  std::vector<int64_t> shape;
  // Element strides, one per dimension. Empty means row-major contiguous (safetensors always,
  // PyTorch usually); a PyTorch tensor may be a transposed or strided view of its storage.
  std::vector<int64_t> strides;
  const void* data = nullptr;  // first element, inside the read-only mmap of `file`
  // Bytes from `data` to the end of the last element: numel * element size when contiguous.
  size_t nbytes = 0;
  std::string file;
  // The dtype as stored ("F32", "BF16", "BOOL" for safetensors; "FloatStorage",
  // "DoubleStorage" ... for PyTorch). Files may hold tensors whose type Tessera has no DType
  // for; they are listed (so sizes are still validated) but Checkpoint::load refuses them
  // with Unimplemented naming the tensor and this string.
  std::string stored_dtype;
  bool dtype_supported = true;
  // GGUF tensors: the ggml storage type (a GgmlType id, common/gguf/gguf_file.h); -1 for
  // every other format. Such a tensor is rows of shape.back() elements, each row whole ggml
  // blocks; a quantized one has `dtype` F32, the type it decodes to (dequantize_ggml).
  int32_t ggml_type = -1;
  // When not empty: logical row r (a row is shape.back() elements; rows are counted over all
  // the leading dimensions) is stored as row row_order[r]. How a GGUF tensor whose converter
  // permuted rows (Llama's Q/K, fused QKV groups) is read in its Hugging Face order.
  std::vector<int64_t> row_order;
  // Added to every element once decoded (GGUF stores Gemma's norm weights as 1 + w where
  // Hugging Face stores w: the reader sets -1).
  float value_offset = 0.0f;

  int64_t numel() const;
  // True when the elements lie row-major without gaps (strides empty or equal to the
  // row-major strides of `shape`).
  bool contiguous() const;
};

class WeightFile {
 public:
  virtual ~WeightFile() = default;
  virtual const std::string& path() const = 0;
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  // Drops the resident pages that lie wholly inside [data, data + nbytes) from this process
  // (madvise MADV_DONTNEED). The mapping stays valid: touching them again re-reads the file.
  virtual void release(const void* data, size_t nbytes) const = 0;
  // The read-only mapping of the whole file from its first byte, which every tensor's data
  // points into (so a tensor's file offset is data - base); {nullptr, 0} where the file is not
  // mapped that way. Weights streamed beyond a memory budget are read straight from it where
  // they are stored as the kernels read them (worker/checkpoint_backing.h).
  struct Mapping {
    const char* base = nullptr;
    size_t size = 0;
    // Whether [data, data + nbytes) lies inside it (compared as addresses: data need not
    // point into it at all).
    bool holds(const void* data, size_t nbytes) const {
      const auto at = reinterpret_cast<uintptr_t>(data), from = reinterpret_cast<uintptr_t>(base);
      return base != nullptr && at >= from && nbytes <= size && at - from <= size - nbytes;
    }
  };
  virtual Mapping whole_mapping() const { return {}; }
};

// The madvise behind WeightFile::release for any read-only file mapping.
void release_mapped_pages(const void* data, size_t nbytes);

}  // namespace tessera
