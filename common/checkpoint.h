#pragma once
// A model checkpoint on disk: a Hugging Face folder (config.json + model.safetensors, or
// shards listed by model.safetensors.index.json, or any *.safetensors in the folder; else
// pytorch_model.bin or the shards listed by pytorch_model.bin.index.json), a single
// .safetensors/.bin/.pt file with config.json beside it, or a DeepSpeed checkpoint JSON
// ({"type", "checkpoints", "version"[, "base_dir"]}) listing safetensors or PyTorch files,
// or a GGUF file (worker/gguf_checkpoint.h maps its tensors to the names used here).
// All files are mmap'd; loading converts a tensor (or only the slice a tensor-parallel rank
// needs) to the requested dtype, borrowing the mapping when no conversion is needed.
// docs/checkpoints.md lists every accepted form and what is refused.
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "common/recycled_buffers.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "common/tensor.h"
#include "common/weight_file.h"

namespace tessera {

class Checkpoint {
 public:
  static StatusOr<std::unique_ptr<Checkpoint>> open(const std::string& path);
  // A checkpoint of one weight file whose tensors already carry Hugging Face names and shapes,
  // with the config.json they imply: a GGUF file as worker/gguf_checkpoint.h presents it.
  static std::unique_ptr<Checkpoint> from_weight_file(const std::string& path, nlohmann::json config,
                                                      std::shared_ptr<WeightFile> file);
  // Whether the tensors come from a GGUF file: its linear weights are [out, in] whatever
  // the family (GPT-2's Conv1D weights were transposed by llama.cpp's converter).
  bool from_gguf() const { return from_gguf_; }

  const std::string& path() const { return path_; }        // as given to open()
  const std::string& config_dir() const { return config_dir_; }  // folder holding config.json
  const nlohmann::json& config() const { return config_; }       // parsed config.json
  // What errors about config() name: the config.json, or the GGUF file whose metadata it is.
  std::string config_source() const { return from_gguf_ ? path_ : config_dir_ + "/config.json"; }
  // A DeepSpeed checkpoint JSON's "type" ("BLOOM-176B"); empty for a folder or a file.
  const std::string& ds_type() const { return ds_type_; }
  const std::vector<std::shared_ptr<WeightFile>>& files() const { return files_; }

  std::vector<std::string> tensor_names() const;  // sorted
  const TensorInfo* find(const std::string& name) const;  // nullptr when absent

  // Whole tensor converted to `dtype` (f32/f16/bf16; other stored types only unconverted).
  // When the stored dtype matches and the data is element-aligned the result borrows the
  // mapping (zero copy, read-only memory; the Tensor keeps the file mapped).
  StatusOr<Tensor> load(const std::string& name, DType dtype) const;
  // [begin, begin + count) along `axis`, converted to `dtype`, touching only those bytes.
  // Axis 0 slices are contiguous and borrowed like load(); other axes are gathered. A
  // non-contiguous (strided) PyTorch tensor is always gathered into a contiguous copy.
  StatusOr<Tensor> load_slice(const std::string& name, DType dtype, int axis, int64_t begin,
                              int64_t count) const;
  // A 2-D GGUF tensor stored in ggml blocks, kept as blocks (ggml_block_rows,
  // common/gguf/gguf_tensor_rows.h): the whole of it (axis -1) or a slice of rows (axis 0)
  // or of inputs (axis 1, on block boundaries). Rows that must be copied (a row order, a
  // slice of inputs) are copied into `scratch` where given.
  StatusOr<Tensor> load_blocks(const std::string& name, int axis, int64_t begin, int64_t count,
                               RecycledBuffers* scratch = nullptr) const;
  // Drops the mapped pages of `name` from this process once a converted copy exists, so
  // that peak RSS stays near the model size. Borrowed tensors stay valid (pages re-read).
  void release(const std::string& name) const;
  // release() for every tensor, one call per file over the span its tensors cover.
  void release_all() const;
  // The file whose whole mapping (WeightFile::whole_mapping) holds [data, data + nbytes):
  // a tensor loaded without a copy; null for memory of any other kind.
  std::shared_ptr<const WeightFile> file_holding(const void* data, size_t nbytes) const;
  // Sum of tensor bytes on disk (a PyTorch storage shared by several tensors counts once
  // per tensor).
  int64_t total_bytes() const { return total_bytes_; }

  // Checkpoints saved from a base model (BloomModel rather than BloomForCausalLM, as the
  // original bigscience/bloom shards are) name tensors without the base model's prefix
  // ("h.0.mlp..." for "transformer.h.0.mlp..."). When no tensor name starts with `prefix`,
  // this prepends it to every name except those in `outside` (the LM head, which lives
  // outside the base model), so that the architecture's names find them; otherwise it
  // changes nothing. Returns whether it renamed.
  bool add_missing_prefix(const std::string& prefix, const std::vector<std::string>& outside = {});

 private:
  struct Entry {
    const TensorInfo* info;
    const WeightFile* file;
    std::shared_ptr<const void> owner;  // keeps the file mapped for borrowed tensors
  };
  Checkpoint() = default;
  // `presharded_tp`: the file is one of a DeepSpeed JSON's "tp" files, where a tensor name
  // met twice means DeepSpeed's per-rank cut, refused with what to use instead.
  Status add_file(const std::string& file_path, bool presharded_tp = false);
  Status load_config(const std::string& dir);
  Status add_indexed_files(const std::string& dir, const std::string& index_name);
  Status open_deepspeed_json(const std::string& path);
  StatusOr<const Entry*> entry(const std::string& name, DType dtype) const;

  std::string path_;
  std::string config_dir_;
  nlohmann::json config_;
  std::string ds_type_;
  std::vector<std::shared_ptr<WeightFile>> files_;
  std::unordered_map<std::string, Entry> tensors_;
  int64_t total_bytes_ = 0;
  bool from_gguf_ = false;
};

}  // namespace tessera
