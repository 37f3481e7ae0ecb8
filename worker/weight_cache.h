#pragma once
// The persistent form of the CPU's streamed weights (model.weights_cache_dir): a cache file per
// model, rank and set of options that decide the compute layout, holding the streamed units
// as they were computed at load (converted dtypes, int8 or 4-bit panels), so a later start
// maps them back instead of loading, converting and quantizing those layers again
// (worker/weight_spill.h writes and reads it; worker/weight_residency.h streams from it).
//
// The file: the units' bytes from offset 0, then a trailer: a JSON text, its length (8 bytes,
// little-endian), its FNV-1a 64 checksum (8 bytes) and the magic "TSWCACHE". The JSON holds
// the identity the file was written for and every streamed tensor's place:
//   {"identity": {"format", "model", "files": [{"path", "bytes", "modified_ns"}], "layout": {...}},
//    "layers": L, "units": {"layer 3": {"offset", "span", "tensors": [...], "fields": {...}},
//                           "LM head": {...}, "embedding table": {...}}}
// A file written for another identity (the checkpoint's files changed since, another cache
// format) or damaged is refused by name, never used and never silently replaced.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/checkpoint.h"
#include "common/status.h"
#include "common/tensor.h"
#include "common/weights_budget.h"
#include "worker/model_weights.h"

namespace tessera {

// Bumped whenever what a cache file holds changes meaning: the trailer, a tensor's record, the
// order for_each_layer_tensor visits a layer's tensors in, a compute layout (int8 or 4-bit
// panels), or which tensors the same options quantize (2: model.quantization int4 makes the
// LM head int8; 3: a GGUF file's untied embedding stays in its blocks). The file's name
// hashes the format too, so a start finds no file of another format (it writes its own).
inline constexpr int kWeightCacheFormat = 3;

// What a cache file is for: the model (its folder or file, and each weight file's size and
// modification time), this rank, and every option that decides the streamed units' bytes;
// budget_bytes decides which units stream.
nlohmann::json weight_cache_identity(const Checkpoint& checkpoint, const WeightLoadOptions& options,
                                     WeightStreaming streaming);

// The cache file's name in its folder for `identity` (with "layout" complete, budget included):
// "<model>-<hash of the model's path and the layout>-rank<R>of<W>.tessera-weights". The files'
// times and the format are left out of the hash, so a file written before the checkpoint or
// the format changed is found, and refused, rather than left beside a new one.
std::string weight_cache_file_name(const nlohmann::json& identity);

// Empty when `written` (a file's identity) is `ours`; else what differs, for the refusal:
// "written by cache format 0 (this build reads and writes format 1)".
std::string weight_cache_difference(const nlohmann::json& written, const nlohmann::json& ours);

// The trailer of a cache file whose JSON is `contents`.
std::string encode_weight_cache_trailer(const nlohmann::json& contents);
// Reads the trailer of the open file `fd` of `file_bytes` bytes: its JSON and where the units'
// bytes end (where the trailer starts). Errors say why the file is not a usable cache file.
struct WeightCacheTrailer {
  nlohmann::json contents;
  size_t data_end = 0;
};
StatusOr<WeightCacheTrailer> read_weight_cache_trailer(int fd, size_t file_bytes);

// One tensor's record: null when empty, else [dtype, [shape...], stride0, offset from `base`].
nlohmann::json weight_cache_tensor(const Tensor& tensor, const char* base);
// The view a record describes, its data at `base` + offset; errors for a record that is not
// one, or whose bytes fall outside [begin, end) of the file.
StatusOr<TensorView> weight_cache_view(const nlohmann::json& record, char* base, size_t begin, size_t end);

// A layer's fields beside its tensors (splits, experts, each linear's origin), and back:
// restore_weight_cache_fields sizes the layer (its experts) before its tensors are restored.
nlohmann::json weight_cache_fields(LayerWeights& layer);
Status restore_weight_cache_fields(const nlohmann::json& fields, LayerWeights* layer);

}  // namespace tessera
