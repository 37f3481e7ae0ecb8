#pragma once
// Streaming writer of PyTorch zip checkpoints, the layout torch.save uses by default
// (archive/data.pkl, archive/byteorder, archive/data/<key> per storage, archive/version;
// stored members, each data start padded to 64 bytes, CRC-32s, zip64 records when an
// offset or size needs them), so that a state dict of contiguous tensors written here loads
// with torch.load and with TorchCheckpointFile. As with SafetensorsWriter every tensor is
// declared up front and the data follows tensor by tensor in chunks, so a generator of a
// large model never holds more than one chunk. Each tensor gets its own storage.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace tessera {

class TorchZipWriter {
 public:
  struct Entry {
    std::string name;
    DType dtype = DType::kF32;  // f32, f16, bf16, i32, i64 or u8
    std::vector<int64_t> shape;
  };

  // Creates (truncates) `path` and writes the state-dict pickle.
  static StatusOr<std::unique_ptr<TorchZipWriter>> create(const std::string& path, std::vector<Entry> entries);
  ~TorchZipWriter();
  TorchZipWriter(const TorchZipWriter&) = delete;
  TorchZipWriter& operator=(const TorchZipWriter&) = delete;

  // Appends the next `nbytes` of tensor data (in declaration order; may span tensors).
  Status append(const void* data, size_t nbytes);
  // Checks that every declared byte was written, then writes the central directory and closes.
  Status finish();
  uint64_t file_bytes() const { return file_bytes_; }  // once finished

 private:
  struct Member {
    std::string name;
    uint64_t local_at = 0;
    uint64_t size = 0;
    uint32_t crc = 0;
  };
  TorchZipWriter() = default;
  Status write_raw(const void* data, size_t n);
  Status begin_member(const std::string& name, uint64_t size);
  Status end_member();
  Status write_member(const std::string& name, const std::string& bytes);

  std::string path_;
  std::FILE* file_ = nullptr;
  std::vector<Entry> entries_;
  std::vector<uint64_t> sizes_;  // bytes of each entry
  std::vector<Member> members_;
  uint64_t offset_ = 0;       // bytes written to the file
  uint64_t member_left_ = 0;  // bytes of the open storage member still to come
  size_t cursor_ = 0;         // next entry to open
  bool open_ = false;
  bool finished_ = false;
  uint64_t file_bytes_ = 0;
};

}  // namespace tessera
