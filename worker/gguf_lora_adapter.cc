#include "worker/gguf_lora_adapter.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "common/gguf/gguf_file.h"
#include "worker/arch_spec.h"
#include "worker/arch_tensors.h"
#include "worker/gguf_checkpoint.h"

namespace tessera {
namespace {

using R = TensorRole;

std::string peft_name(const std::string& module, char which) {
  return "base_model.model." + module + ".lora_" + which + ".weight";
}

// What a factor the adaptable roles did not claim adapts, for its refusal: the row's GGUF
// tensor it is named after (any layer), or nothing the row has.
std::string unclaimed_why(const std::string& name, const ModelConfig& c) {
  const ArchSpec& row = *c.arch;
  for (size_t r = 0; r < static_cast<size_t>(R::kCount); ++r) {
    const R role = static_cast<R>(r);
    const std::string pattern = row.gguf_name_of(role).empty() ? "" : layout_alternative(row.gguf_name_of(role), c);
    if (pattern.empty()) continue;
    const bool per_layer = pattern.find("{L}") != std::string::npos;
    for (int l = 0; l < (per_layer ? static_cast<int>(c.layers) : 1); ++l) {
      if (name.rfind(tensor_name(pattern, l) + ".", 0) != 0) continue;
      if (role == R::kEmbed) return "adapts the token embedding: adapters of the embedding are not implemented";
      if (role == R::kLmHead) return "adapts the LM head: adapters of the LM head are not implemented";
      return std::string("adapts the ") + tensor_role_name(role) + " tensor '" + tensor_name(pattern, l) +
             "': adapters are implemented for the linear layers of the blocks (attention, MLP, experts) only";
    }
  }
  return "is not the lora_a / lora_b factor of a tensor of a " + row.name + " model";
}

class FactorMapper {
 public:
  FactorMapper(const GgufFile& file, const ModelConfig& c, const std::map<std::string, LoraTargetModule>& targets)
      : file_(file), c_(c), row_(*c.arch), targets_(targets) {}

  StatusOr<std::vector<TensorInfo>> map() {
    for (R role : lora_adaptable_roles()) {
      if (row_.name_of(role).empty() || row_.gguf_name_of(role).empty()) continue;
      const std::string hf = layout_alternative(row_.name_of(role), c_);
      const std::string gguf = layout_alternative(row_.gguf_name_of(role), c_);
      for (int l = 0; l < static_cast<int>(c_.layers); ++l) {
        TESSERA_RETURN_IF_ERROR(add(role, tensor_name(gguf, l), hf, l));
      }
    }
    for (const GgufTensor& t : file_.tensors()) {
      if (used_.count(t.name) == 0) {
        return invalid_argument(file_.path() + ": tensor '" + t.name + "' " + unclaimed_why(t.name, c_));
      }
    }
    if (out_.empty()) return invalid_argument(file_.path() + ": holds no LoRA factors");
    return std::move(out_);
  }

  int64_t rank() const { return rank_; }

 private:
  StatusOr<const GgufTensor*> claim(const std::string& name) {
    const GgufTensor* t = file_.find_tensor(name);
    if (t == nullptr) return t;
    TESSERA_RETURN_IF_ERROR(gguf_check_decodable(file_, *t));
    used_.insert(t->name);
    return t;
  }

  // The factors of the base tensor `gguf_weight` (a layer's, or every expert's stacked).
  Status add(R role, const std::string& gguf_weight, const std::string& hf_pattern, int layer) {
    TESSERA_ASSIGN_OR_RETURN(const GgufTensor* a, claim(gguf_weight + ".lora_a"));
    TESSERA_ASSIGN_OR_RETURN(const GgufTensor* b, claim(gguf_weight + ".lora_b"));
    if (a == nullptr && b == nullptr) return Status::ok();
    if (a == nullptr || b == nullptr) {
      return invalid_argument(file_.path() + ": tensor '" + gguf_weight + (a == nullptr ? ".lora_b" : ".lora_a") +
                              "' has no " + (a == nullptr ? "lora_a" : "lora_b") + " to pair with");
    }
    const size_t dims = is_expert_role(role) ? 3 : 2;
    const int64_t experts = is_expert_role(role) ? c_.num_experts : 1;
    // ggml's shapes: lora_a [in, r(, experts)], lora_b [r, out(, experts)].
    if (a->dims.size() != dims || b->dims.size() != dims || a->dims[1] != b->dims[0] ||
        (dims == 3 && (a->dims[2] != experts || b->dims[2] != experts))) {
      return invalid_argument(file_.path() + ": tensors '" + a->name + "' and '" + b->name + "' are not a pair of " +
                              (dims == 3 ? "stacked expert " : "") + "LoRA factors (ggml shapes [in, r" +
                              (dims == 3 ? ", experts] and [r, out, experts]" : "] and [r, out]") + ")");
    }
    const int64_t r = a->dims[1];
    if (rank_ == 0) rank_ = r;
    if (r != rank_) {
      return invalid_argument(file_.path() + ": tensor '" + a->name + "' has rank " + std::to_string(r) + ", others " +
                              std::to_string(rank_) + ": per-module ranks are not implemented");
    }
    const std::string b_what = file_.path() + ": tensor '" + b->name + "'";
    TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> order, gguf_hf_row_order(row_, c_, role, b->dims[1], b_what));
    for (int64_t e = 0; e < experts; ++e) {
      const std::string module = tensor_name(hf_pattern, layer, is_expert_role(role) ? static_cast<int>(e) : -1);
      const std::string stem = module.substr(0, module.size() - std::string(".weight").size());
      if (e == 0) TESSERA_RETURN_IF_ERROR(check_base_shape(*a, *b, gguf_weight, stem));
      TensorInfo ai = dims == 3 ? gguf_expert_view(*a, experts, e, peft_name(stem, 'A'))
                                : gguf_tensor_view(*a, peft_name(stem, 'A'));
      TensorInfo bi = dims == 3 ? gguf_expert_view(*b, experts, e, peft_name(stem, 'B'))
                                : gguf_tensor_view(*b, peft_name(stem, 'B'));
      bi.row_order = order;
      out_.push_back(std::move(ai));
      out_.push_back(std::move(bi));
    }
    return Status::ok();
  }

  // The factors against the base layer they adapt (`module`, its PEFT name), refused in the
  // file's own names: an adapter of another base model, or one whose converter got the
  // layer's orientation wrong (llama.cpp's refuses such a file too).
  Status check_base_shape(const GgufTensor& a, const GgufTensor& b, const std::string& gguf_weight,
                          const std::string& module) const {
    auto it = targets_.find(module);
    if (it == targets_.end()) return Status::ok();  // factor_names refuses what the base lacks
    const LoraTargetModule& t = it->second;
    if (a.dims[0] != t.in) {
      return invalid_argument(file_.path() + ": tensor '" + a.name + "' has ggml shape " + ggml_shape(a) + ", but '" +
                              gguf_weight + "' of the base takes " + std::to_string(t.in) +
                              " inputs (lora_a is [in, r]): an adapter of another base model?");
    }
    if (b.dims[1] != t.out) {
      return invalid_argument(file_.path() + ": tensor '" + b.name + "' has ggml shape " + ggml_shape(b) + ", but '" +
                              gguf_weight + "' of the base gives " + std::to_string(t.out) +
                              " outputs (lora_b is [r, out]): an adapter of another base model?");
    }
    return Status::ok();
  }
  static std::string ggml_shape(const GgufTensor& t) {
    std::string out;
    for (int64_t d : t.dims) out += (out.empty() ? "[" : ", ") + std::to_string(d);
    return out + "]";
  }

  const GgufFile& file_;
  const ModelConfig& c_;
  const ArchSpec& row_;
  const std::map<std::string, LoraTargetModule>& targets_;
  std::vector<TensorInfo> out_;
  std::set<std::string> used_;
  int64_t rank_ = 0;
};

// Metadata that must say "a LoRA adapter for this base", and what would change the
// computation beyond the factors.
Status check_adapter_keys(const GgufFile& file, const ModelConfig& c) {
  std::string type;
  if (file.has("general.type")) {
    TESSERA_ASSIGN_OR_RETURN(type, file.get_string("general.type"));
  }
  if (type != "adapter") {
    return invalid_argument(file.path() + ": general.type is '" + type +
                            "', not 'adapter': a GGUF model, not a LoRA adapter (llama.cpp's convert_lora_to_gguf.py "
                            "writes adapters)");
  }
  TESSERA_ASSIGN_OR_RETURN(const std::string kind, file.get_string("adapter.type"));
  if (kind != "lora") {
    return invalid_argument(file.path() + ": adapter.type is '" + kind + "'; only 'lora' adapters are served");
  }
  TESSERA_ASSIGN_OR_RETURN(const std::string arch, file.get_string("general.architecture"));
  const std::vector<std::string>& ours = c.arch->gguf_archs;
  if (std::find(ours.begin(), ours.end(), arch) == ours.end()) {
    return invalid_argument(file.path() + ": an adapter for a '" + arch + "' model; the base is a " + c.arch->name +
                            " model");
  }
  if (file.has("adapter.alora.invocation_tokens")) {
    return unimplemented(file.path() + ": adapter.alora.invocation_tokens: activated LoRA (the adapter switched on "
                                       "by tokens in the prompt) is not implemented");
  }
  if (file.has("adapter.lora.prompt_prefix")) {
    return unimplemented(file.path() + ": adapter.lora.prompt_prefix: a prefix the adapter's prompts take is not "
                                       "applied by Tessera (put it in the prompts)");
  }
  return Status::ok();
}

}  // namespace

StatusOr<GgufLoraAdapter> open_gguf_lora_adapter(const std::string& path, const ModelConfig& base,
                                                 const std::map<std::string, LoraTargetModule>& targets) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::open(path));
  TESSERA_RETURN_IF_ERROR(check_adapter_keys(*file, base));
  double alpha = 0;
  if (file->has("adapter.lora.alpha")) {
    TESSERA_ASSIGN_OR_RETURN(alpha, file->get_float("adapter.lora.alpha"));
  }
  FactorMapper mapper(*file, base, targets);
  TESSERA_ASSIGN_OR_RETURN(std::vector<TensorInfo> factors, mapper.map());
  GgufLoraAdapter out;
  out.config.rank = static_cast<int>(mapper.rank());
  // llama.cpp scales by alpha / r, and by 1 where the file's alpha is 0 (or absent).
  out.config.alpha = alpha != 0 ? alpha : static_cast<double>(mapper.rank());
  out.config.all_linear = true;  // the modules are those the file holds
  out.factors = gguf_weight_file(std::move(file), std::move(factors));
  return out;
}

}  // namespace tessera
