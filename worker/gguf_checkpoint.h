#pragma once
// A GGUF file (llama.cpp's model format; split files open from their first part) as a
// Checkpoint: the ArchSpec row that serves its general.architecture names each tensor in
// Hugging Face terms, its metadata becomes config.json (worker/gguf_model_config.h), and each
// tensor is presented with its Hugging Face name and shape, in the Hugging Face row order
// (the rows llama.cpp's converter permuted are read through TensorInfo::row_order), decoded
// from its ggml blocks when loaded. Every GGUF tensor must find its place: one that no role
// claims, or of a type Tessera does not decode, is refused by name.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/gguf/gguf_file.h"  // is_gguf_path
#include "common/status.h"
#include "worker/arch_spec.h"
#include "worker/model_config.h"

namespace tessera {

StatusOr<std::unique_ptr<Checkpoint>> open_gguf_checkpoint(const std::string& path);

// The pieces the model and its LoRA adapters (worker/gguf_lora_adapter.h) are read with:
// a GGUF tensor as the TensorInfo of `hf_name` (shape outermost first, its ggml type kept);
// the Hugging Face order of the `rows` rows of a tensor of `role` (TensorInfo::row_order:
// Llama's Q/K un-permuted, a grouped QKV regrouped; empty when stored in order), `what`
// naming it in the error of a row count that does not fit `c`; and the file with its tensors
// as a WeightFile that keeps it mapped.
TensorInfo gguf_tensor_view(const GgufTensor& t, const std::string& hf_name);
// Expert e's slice of a tensor stacking `experts` in its outermost dimension, as a 2-D view.
TensorInfo gguf_expert_view(const GgufTensor& t, int64_t experts, int64_t e, const std::string& hf_name);
// Refused naming the tensor and its type when Tessera does not decode that type.
Status gguf_check_decodable(const GgufFile& file, const GgufTensor& t);
StatusOr<std::vector<int64_t>> gguf_hf_row_order(const ArchSpec& row, const ModelConfig& c, TensorRole role,
                                                 int64_t rows, const std::string& what);
std::shared_ptr<WeightFile> gguf_weight_file(std::unique_ptr<GgufFile> file, std::vector<TensorInfo> tensors);

}  // namespace tessera
