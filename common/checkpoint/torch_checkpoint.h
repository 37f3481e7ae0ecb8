#pragma once
// A PyTorch checkpoint (`torch.save` of a state dict: pytorch_model.bin, *.pt, *.pth) read
// without Python: the zip format of torch >= 1.6 (`<name>/data.pkl` + one stored member per
// storage) and the legacy format before it (magic number, protocol version and system-info
// pickles, the state-dict pickle, the list of storage keys, then each storage as an 8-byte
// element count and its raw bytes). The file is mapped read-only and each tensor becomes a
// view (dtype, shape, strides, storage offset) into its storage's bytes, checked to lie
// inside the storage; several tensors may share one storage (tied weights, views).
//
// The state-dict pickle is read by the restricted unpickler (pickle_reader.h) with an
// allow-list of exactly what torch.save writes for tensors: collections.OrderedDict,
// torch._utils._rebuild_tensor(_v2), torch._utils._rebuild_parameter(_with_state) and the
// torch.<Type>Storage classes. Anything else is refused, naming the global.
#include <memory>
#include <string>
#include <vector>

#include "common/checkpoint/mapped_file.h"
#include "common/status.h"
#include "common/weight_file.h"

namespace tessera {

class TorchCheckpointFile : public WeightFile {
 public:
  // Errors name the file and, where there is one, the tensor or storage.
  static StatusOr<std::shared_ptr<TorchCheckpointFile>> open(const std::string& path);

  const std::string& path() const override { return file_->path(); }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  void release(const void* data, size_t nbytes) const override;
  Mapping whole_mapping() const override { return {file_->data(), file_->size()}; }
  bool legacy_format() const { return legacy_; }

 private:
  TorchCheckpointFile() = default;
  Status read_zip();
  Status read_legacy();

  std::unique_ptr<MappedFile> file_;
  std::vector<TensorInfo> tensors_;
  bool legacy_ = false;
};

// Whether the first bytes look like a PyTorch checkpoint (a zip archive, or the legacy
// format's pickled magic number), so that a file of another kind gets a clear message.
bool looks_like_torch_checkpoint(const char* data, size_t size);

}  // namespace tessera
