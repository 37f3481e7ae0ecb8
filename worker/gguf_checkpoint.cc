#include "worker/gguf_checkpoint.h"

#include <algorithm>
#include <set>
#include <vector>

#include "common/gguf/ggml_dequant.h"
#include "common/gguf/gguf_file.h"
#include "worker/arch_spec.h"
#include "worker/arch_tensors.h"
#include "worker/gguf_model_config.h"
#include "worker/model_config.h"

namespace tessera {
namespace {

using R = TensorRole;

// The GGUF file's tensors under their Hugging Face names; the file stays mapped while any
// loaded tensor borrows from it.
class GgufWeightFile : public WeightFile {
 public:
  GgufWeightFile(std::unique_ptr<GgufFile> file, std::vector<TensorInfo> tensors)
      : file_(std::move(file)), tensors_(std::move(tensors)) {}
  const std::string& path() const override { return file_->path(); }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  void release(const void* data, size_t nbytes) const override { release_mapped_pages(data, nbytes); }

 private:
  std::unique_ptr<GgufFile> file_;
  std::vector<TensorInfo> tensors_;
};

// The row serving the file's general.architecture; a MoE row for a file with experts.
StatusOr<const ArchSpec*> gguf_row(const GgufFile& file, std::string* arch) {
  TESSERA_ASSIGN_OR_RETURN(*arch, file.get_string("general.architecture"));
  int64_t experts = 0;
  if (file.has(*arch + ".expert_count")) {
    TESSERA_ASSIGN_OR_RETURN(experts, file.get_int(*arch + ".expert_count"));
  }
  const ArchSpec* named = nullptr;
  for (const ArchSpec& row : arch_specs()) {
    if (std::find(row.gguf_archs.begin(), row.gguf_archs.end(), *arch) == row.gguf_archs.end()) continue;
    named = &row;
    if (row.moe == (experts > 0)) return &row;
  }
  if (named == nullptr) {
    return unimplemented(file.path() + ": GGUF architecture '" + *arch + "' is not supported (supported: " +
                         supported_gguf_archs() + ")");
  }
  return unimplemented(file.path() + ": GGUF architecture '" + *arch + "' " +
                       (experts > 0 ? "with " + std::to_string(experts) + " experts" : "without experts") +
                       " is not supported");
}

// llama.cpp's converter interleaves each head's rows for its rotary layout: Hugging Face row
// h*D + j*D/2 + i is stored as row h*D + 2i + j (LlamaModel.permute).
std::vector<int64_t> unpermuted_qk_rows(int64_t heads, int64_t head_dim) {
  std::vector<int64_t> order(static_cast<size_t>(heads * head_dim));
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t i = 0; i < half; ++i) order[h * head_dim + j * half + i] = h * head_dim + 2 * i + j;
  return order;
}

// A fused QKV stored [q heads | k heads | v heads] read in the grouped Hugging Face layout:
// per KV group its query heads, then its k head, then its v head (BLOOM, GPT-NeoX, Falcon's
// new decoder architecture).
std::vector<int64_t> grouped_qkv_rows(int64_t heads, int64_t kv_heads, int64_t head_dim) {
  const int64_t per_group = heads / kv_heads;
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>((heads + 2 * kv_heads) * head_dim));
  for (int64_t g = 0; g < kv_heads; ++g) {
    for (int64_t slot = 0; slot < per_group + 2; ++slot) {
      const int64_t stored_head = slot < per_group ? g * per_group + slot
                                  : slot == per_group ? heads + g
                                                      : heads + kv_heads + g;
      for (int64_t i = 0; i < head_dim; ++i) order.push_back(stored_head * head_dim + i);
    }
  }
  return order;
}

}  // namespace

TensorInfo gguf_tensor_view(const GgufTensor& t, const std::string& hf_name) {
  TensorInfo info;
  info.name = hf_name;
  const auto type = static_cast<GgmlType>(t.type);
  info.dtype = type == GgmlType::kF16 ? DType::kF16 : type == GgmlType::kBF16 ? DType::kBF16 : DType::kF32;
  info.shape.assign(t.dims.rbegin(), t.dims.rend());  // GGUF lists the innermost first
  info.data = t.data;
  info.nbytes = t.nbytes;
  info.file = t.file;
  info.stored_dtype = ggml_type_name(t.type);
  info.ggml_type = static_cast<int32_t>(t.type);
  return info;
}

TensorInfo gguf_expert_view(const GgufTensor& t, int64_t experts, int64_t e, const std::string& hf_name) {
  TensorInfo info = gguf_tensor_view(t, hf_name);
  info.shape = {t.dims[1], t.dims[0]};
  info.nbytes = t.nbytes / static_cast<size_t>(experts);
  info.data = t.data + info.nbytes * static_cast<size_t>(e);
  return info;
}

Status gguf_check_decodable(const GgufFile& file, const GgufTensor& t) {
  if (ggml_type_dequantizable(t.type)) return Status::ok();
  return unimplemented(file.path() + ": tensor '" + t.name + "' has type " + ggml_type_name(t.type) +
                       ", which is not supported (supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, "
                       "q5_K, q6_K)");
}

StatusOr<std::vector<int64_t>> gguf_hf_row_order(const ArchSpec& row, const ModelConfig& c, TensorRole role,
                                                 int64_t rows, const std::string& what) {
  if (row.gguf_permuted_qk && (role == R::kQ || role == R::kK)) {
    const int64_t heads = role == R::kQ ? c.heads : c.kv_heads;
    if (rows != heads * c.head_dim || c.head_dim % 2 != 0) {
      return invalid_argument(what + " has " + std::to_string(rows) + " rows; " + std::to_string(heads) +
                              " heads of " + std::to_string(c.head_dim) + " were expected");
    }
    return unpermuted_qk_rows(heads, c.head_dim);
  }
  if (role == R::kQkv && c.qkv == QkvLayout::kGrouped) {
    if (rows != (c.heads + 2 * c.kv_heads) * c.head_dim) {
      return invalid_argument(what + " has " + std::to_string(rows) + " rows; q, k and v of " +
                              std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " heads of " +
                              std::to_string(c.head_dim) + " were expected");
    }
    return grouped_qkv_rows(c.heads, c.kv_heads, c.head_dim);
  }
  return std::vector<int64_t>{};
}

std::shared_ptr<WeightFile> gguf_weight_file(std::unique_ptr<GgufFile> file, std::vector<TensorInfo> tensors) {
  return std::make_shared<GgufWeightFile>(std::move(file), std::move(tensors));
}

namespace {

bool is_norm_role(R role) {
  switch (role) {
    case R::kEmbedNorm: case R::kFinalNorm: case R::kAttnNorm: case R::kQNorm: case R::kKNorm:
    case R::kPostAttnNorm: case R::kMlpNorm: case R::kPostMlpNorm: return true;
    default: return false;
  }
}

// Builds the Hugging Face view of every GGUF tensor a role of the row claims.
class GgufTensorMapper {
 public:
  // `consumed`: tensors the config already read as metadata.
  GgufTensorMapper(const GgufFile& file, const ArchSpec& row, const ModelConfig& c,
                   const std::vector<std::string>& consumed)
      : file_(file), row_(row), c_(c), used_(consumed.begin(), consumed.end()) {}

  StatusOr<std::vector<TensorInfo>> map() {
    for (size_t r = 0; r < static_cast<size_t>(R::kCount); ++r) {
      const R role = static_cast<R>(r);
      if (row_.name_of(role).empty() || row_.gguf_name_of(role).empty()) continue;
      const std::string hf = layout_alternative(row_.name_of(role), c_);
      const std::string gguf = layout_alternative(row_.gguf_name_of(role), c_);
      const bool per_layer = gguf.find("{L}") != std::string::npos;
      for (int64_t l = 0; l < (per_layer ? c_.layers : 1); ++l) {
        const int layer = static_cast<int>(l);
        if (is_expert_role(role)) {
          TESSERA_RETURN_IF_ERROR(add_experts(tensor_name(gguf, layer), hf, layer));
          continue;
        }
        TESSERA_RETURN_IF_ERROR(add(role, tensor_name(hf, layer), tensor_name(gguf, layer)));
        TESSERA_RETURN_IF_ERROR(add(role, bias_name(tensor_name(hf, layer)), bias_name(tensor_name(gguf, layer))));
      }
    }
    for (const GgufTensor& t : file_.tensors()) {
      if (used_.count(t.name) == 0) {
        return unimplemented(file_.path() + ": tensor '" + t.name + "' has no place in a " + row_.name +
                             " model as Tessera computes it (not read: refusing rather than ignoring it)");
      }
    }
    return std::move(out_);
  }

 private:
  StatusOr<const GgufTensor*> claim(const std::string& gguf_name) {
    const GgufTensor* t = file_.find_tensor(gguf_name);
    if (t == nullptr) return t;
    TESSERA_RETURN_IF_ERROR(gguf_check_decodable(file_, *t));
    used_.insert(t->name);
    return t;
  }

  Status add(R role, const std::string& hf_name, const std::string& gguf_name) {
    TESSERA_ASSIGN_OR_RETURN(const GgufTensor* t, claim(gguf_name));
    if (t == nullptr) return Status::ok();  // absent: the loader says whether it was needed
    TensorInfo info = gguf_tensor_view(*t, hf_name);
    const int64_t rows = info.shape[0];  // a bias's elements are its rows
    TESSERA_ASSIGN_OR_RETURN(info.row_order,
                             gguf_hf_row_order(row_, c_, role, rows, file_.path() + ": tensor '" + gguf_name + "'"));
    if (is_norm_role(role) && row_.norm_weight_offset != 0.0f && hf_name.find(".bias") == std::string::npos) {
      info.value_offset = -row_.norm_weight_offset;  // the converter stored 1 + w
    }
    out_.push_back(std::move(info));
    return Status::ok();
  }

  // A stacked [experts, rows, in] GGUF tensor as one [rows, in] tensor per expert.
  Status add_experts(const std::string& gguf_name, const std::string& hf_pattern, int layer) {
    TESSERA_ASSIGN_OR_RETURN(const GgufTensor* t, claim(gguf_name));
    if (t == nullptr) return Status::ok();
    if (t->dims.size() != 3 || t->dims[2] != c_.num_experts) {
      return invalid_argument(file_.path() + ": tensor '" + gguf_name + "' should stack " +
                              std::to_string(c_.num_experts) + " experts in its outermost dimension");
    }
    for (int64_t e = 0; e < c_.num_experts; ++e) {
      out_.push_back(gguf_expert_view(*t, c_.num_experts, e, tensor_name(hf_pattern, layer, static_cast<int>(e))));
    }
    return Status::ok();
  }

  const GgufFile& file_;
  const ArchSpec& row_;
  const ModelConfig& c_;
  std::vector<TensorInfo> out_;
  std::set<std::string> used_;
};

}  // namespace

StatusOr<std::unique_ptr<Checkpoint>> open_gguf_checkpoint(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::open(path));
  if (file->has("general.type")) {
    TESSERA_ASSIGN_OR_RETURN(const std::string type, file->get_string("general.type"));
    if (type == "adapter") {
      return invalid_argument(path + ": a LoRA adapter (general.type adapter), not a model: serve it beside its base "
                              "model (lora.adapters, --lora NAME=PATH)");
    }
  }
  std::string arch;
  TESSERA_ASSIGN_OR_RETURN(const ArchSpec* row, gguf_row(*file, &arch));
  const GgufTensor* embed = file->find_tensor(row->gguf_name_of(R::kEmbed));
  if (embed == nullptr || embed->dims.size() != 2) {
    return invalid_argument(path + ": no 2-D " + row->gguf_name_of(R::kEmbed) + " (the token embedding)");
  }
  const bool tied = file->find_tensor(row->gguf_name_of(R::kLmHead)) == nullptr;
  std::vector<std::string> consumed;
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json config,
                           gguf_model_config(*file, *row, arch, embed->dims[1], tied, &consumed));
  TESSERA_ASSIGN_OR_RETURN(ModelConfig c, parse_model_config(config, path));
  GgufTensorMapper mapper(*file, *row, c, consumed);
  TESSERA_ASSIGN_OR_RETURN(std::vector<TensorInfo> tensors, mapper.map());
  std::shared_ptr<WeightFile> weights = gguf_weight_file(std::move(file), std::move(tensors));
  return Checkpoint::from_weight_file(path, std::move(config), std::move(weights));
}

}  // namespace tessera
