#pragma once
// Streaming safetensors writer: every tensor (name, dtype, shape) is declared up front, so the
// header can be written first; then the data follows tensor by tensor, in declaration order,
// in chunks of any size. A generator therefore never holds more than one chunk in memory.
// The files follow the format the Python `safetensors` library reads: 8-byte little-endian
// header length, a JSON header padded with spaces to a multiple of 8 bytes, and contiguous
// data with no gaps. Declare wider dtypes first (or use one dtype) to keep every tensor's data
// aligned to its element size, which lets readers borrow it without copying.
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "common/tensor.h"

namespace tessera {

class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
  };

  // Creates (truncates) `path` and writes the header. `metadata` becomes "__metadata__"
  // (string to string, as the format requires), e.g. {{"format", "pt"}}.
  static StatusOr<std::unique_ptr<SafetensorsWriter>> create(
      const std::string& path, std::vector<Entry> entries,
      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends the next `nbytes` of data; they may end inside a tensor or span several.
  Status append(const void* data, size_t nbytes);
  // Writes the whole of the next declared tensor; `name` must be that tensor.
  Status write(const std::string& name, const void* data, size_t nbytes);
  // Checks that every declared byte was written, then flushes and closes the file.
  Status finish();

  // The tensor the next appended byte belongs to ("" when all data is written).
  std::string next_tensor() const;
  const std::string& path() const { return path_; }
  // Bytes of the whole file (header included) once finished.
  uint64_t file_bytes() const { return data_start_ + total_data_; }

 private:
  SafetensorsWriter() = default;
  uint64_t entry_begin(size_t i) const { return i == 0 ? 0 : ends_[i - 1]; }

  std::string path_;
  std::FILE* file_ = nullptr;
  std::vector<Entry> entries_;
  std::vector<uint64_t> ends_;  // cumulative data end offset of each entry
  uint64_t data_start_ = 0;
  uint64_t total_data_ = 0;
  uint64_t written_ = 0;
  size_t cursor_ = 0;  // first entry not completely written
  bool finished_ = false;
};

// Writes whole tensors in one go (tests, small converters).
Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, TensorView>>& tensors,
                         const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace tessera
