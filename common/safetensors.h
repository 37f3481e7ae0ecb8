#pragma once
// Reader for one safetensors file (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__"},
// then the raw tensor bytes. The whole file is mapped read-only; tensors are views into the
// mapping, so opening a file costs only its header and pages are read when touched.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "common/status.h"
#include "common/weight_file.h"

namespace tessera {

class SafetensorsFile : public WeightFile {
 public:
  // Maps `path` and validates the header: every tensor's dtype is known, its shape is
  // non-negative, its data_offsets lie inside the file and span exactly numel * dtype size,
  // and no two tensors overlap. Errors name the file and the tensor.
  static StatusOr<std::shared_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile() override;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const override { return path_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  const nlohmann::json& metadata() const { return metadata_; }  // "__metadata__" or {}
  size_t file_size() const { return size_; }

  // Drops the resident pages that lie wholly inside [data, data + nbytes) from this process
  // (madvise MADV_DONTNEED). The mapping stays valid: touching them again re-reads the file.
  void release(const void* data, size_t nbytes) const override;
  Mapping whole_mapping() const override { return {static_cast<const char*>(base_), size_}; }

 private:
  SafetensorsFile() = default;
  Status parse_header(size_t header_len);

  std::string path_;
  void* base_ = nullptr;
  size_t size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
  nlohmann::json metadata_ = nlohmann::json::object();
};

// Safetensors dtype strings for the DTypes Tessera stores ("F32", "F16", "BF16", "I32", "I64", "U8").
const char* safetensors_dtype_name(DType dtype);

}  // namespace tessera
