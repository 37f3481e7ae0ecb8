#include "worker/lora_adapter.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <tuple>

#include "common/checkpoint/torch_checkpoint.h"
#include "common/gguf/gguf_file.h"
#include "common/safetensors.h"
#include "worker/gguf_lora_adapter.h"

namespace tessera {
namespace lora_adapter_internal {

namespace fs = std::filesystem;

// Fields that change what the adapter computes and are not implemented, with the value that
// means "not used" in PEFT's files (null, false, empty or the string given).
bool unused_value(const nlohmann::json& v, const char* none) {
  if (v.is_null()) return true;
  if (v.is_boolean()) return !v.get<bool>();
  if (v.is_object() || v.is_array()) return v.empty();
  if (v.is_string() && none != nullptr) return v.get<std::string>() == none;
  return false;
}

struct Refused {
  const char* field;
  const char* none;  // the string value that means "not used", or nullptr
  const char* why;
};
constexpr Refused kRefused[] = {
    {"use_dora", nullptr, "DoRA is not implemented"},
    {"modules_to_save", nullptr, "modules trained whole beside the adapter are not implemented"},
    {"bias", "none", "trained biases are not implemented (only bias: \"none\")"},
    {"lora_bias", nullptr, "a bias on lora_B is not implemented"},
    {"rank_pattern", nullptr, "per-module ranks are not implemented"},
    {"alpha_pattern", nullptr, "per-module alphas are not implemented"},
    {"layers_to_transform", nullptr, "adapting only some layers by index is not implemented"},
    {"layers_pattern", nullptr, "adapting only some layers by index is not implemented"},
    {"layer_replication", nullptr, "layer replication is not implemented"},
    {"megatron_config", nullptr, "Megatron-parallel LoRA layers are not implemented"},
    {"exclude_modules", nullptr, "exclude_modules is not implemented"},
    {"trainable_token_indices", nullptr, "trainable token embeddings are not implemented"},
};

Status field_error(const std::string& source, const std::string& field, const std::string& why) {
  return invalid_argument(source + ": " + field + ": " + why);
}

// "base_model.model.<module>.lora_A[.<adapter name>].weight" -> module, 'A' or 'B'.
bool split_lora_name(const std::string& name, std::string* module, char* which) {
  static const std::string kPrefix = "base_model.model.";
  if (name.rfind(kPrefix, 0) != 0) return false;
  for (const char w : {'A', 'B'}) {
    const std::string tag = std::string(".lora_") + w;
    const size_t at = name.find(tag + ".");
    if (at == std::string::npos || name.size() < 7 || name.compare(name.size() - 7, 7, ".weight") != 0) continue;
    *module = name.substr(kPrefix.size(), at - kPrefix.size());
    *which = w;
    return true;
  }
  return false;
}

// The base layer's [out, in] (GPT-2's Conv1D weights are stored [in, out]).
std::pair<int64_t, int64_t> out_in(const Checkpoint& base, const ModelConfig& c, const std::string& weight) {
  const std::vector<int64_t>& s = base.find(weight)->shape;
  if (s.size() != 2) return {-1, -1};
  return c.arch->conv1d_weights && !base.from_gguf() ? std::make_pair(s[1], s[0]) : std::make_pair(s[0], s[1]);
}

}  // namespace lora_adapter_internal

const std::vector<TensorRole>& lora_adaptable_roles() {
  static const std::vector<TensorRole> roles = {
      TensorRole::kQ,          TensorRole::kK,        TensorRole::kV,          TensorRole::kQkv,
      TensorRole::kO,          TensorRole::kGate,     TensorRole::kUp,         TensorRole::kGateUp,
      TensorRole::kDown,       TensorRole::kSharedGate, TensorRole::kSharedUp, TensorRole::kSharedDown,
      TensorRole::kExpertGate, TensorRole::kExpertUp, TensorRole::kExpertDown};
  return roles;
}

// For each spelling the row accepts that the checkpoint holds.
std::vector<LoraTargetModule> lora_target_modules(const Checkpoint& base, const ModelConfig& c) {
  std::vector<LoraTargetModule> out;
  auto add = [&](TensorRole role, int layer, int expert) {
    for (const std::string& alt : name_alternatives(c.arch->name_of(role))) {
      if (alt.empty()) continue;
      const std::string weight = tensor_name(alt, layer, expert);
      const std::string suffix = ".weight";
      if (base.find(weight) == nullptr || weight.size() <= suffix.size() ||
          weight.compare(weight.size() - suffix.size(), suffix.size(), suffix) != 0)
        continue;
      const auto [rows, cols] = lora_adapter_internal::out_in(base, c, weight);
      if (rows > 0) out.push_back({weight.substr(0, weight.size() - suffix.size()), role, layer, expert, rows, cols});
    }
  };
  for (int l = 0; l < static_cast<int>(c.layers); ++l) {
    for (TensorRole role : lora_adaptable_roles())
      if (!is_expert_role(role)) add(role, l, -1);
    for (int e = 0; e < static_cast<int>(c.num_experts); ++e)
      for (TensorRole role : lora_adaptable_roles())
        if (is_expert_role(role)) add(role, l, e);
  }
  return out;
}

namespace lora_adapter_internal {

StatusOr<std::shared_ptr<WeightFile>> open_adapter_weights(const std::string& dir) {
  const std::string st = dir + "/adapter_model.safetensors", bin = dir + "/adapter_model.bin";
  if (fs::exists(st)) {
    TESSERA_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(st));
    return std::shared_ptr<WeightFile>(std::move(f));
  }
  if (fs::exists(bin)) {
    TESSERA_ASSIGN_OR_RETURN(auto f, TorchCheckpointFile::open(bin));
    return std::shared_ptr<WeightFile>(std::move(f));
  }
  return not_found(dir + ": no adapter_model.safetensors or adapter_model.bin");
}

}  // namespace lora_adapter_internal

namespace lai = lora_adapter_internal;

double LoraAdapterConfig::scale() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

bool LoraAdapterConfig::targets(const std::string& name) const {
  if (all_linear) return true;
  if (target_regex) return std::regex_match(name, *target_regex);
  for (const std::string& t : target_names) {
    if (name == t) return true;
    if (name.size() > t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0 &&
        name[name.size() - t.size() - 1] == '.')
      return true;
  }
  return false;
}

namespace lora_adapter_internal {

// target_modules: names, a regular expression or all-linear.
Status read_target_modules(const nlohmann::json& j, const std::string& source, LoraAdapterConfig* c) {
  const auto t = j.find("target_modules");
  if (t == j.end() || t->is_null()) return field_error(source, "target_modules", "missing: which modules the adapter changes");
  if (t->is_string() && t->get<std::string>() == "all-linear") {
    c->all_linear = true;
  } else if (t->is_string()) {
    try {
      c->target_regex = std::regex(t->get<std::string>());
    } catch (const std::regex_error& e) {
      return field_error(source, "target_modules", "not a regular expression: " + t->dump() + " (" + e.what() + ")");
    }
  } else if (t->is_array() && !t->empty()) {
    for (const auto& name : *t) {
      if (!name.is_string() || name.get<std::string>().empty())
        return field_error(source, "target_modules", "expected module names, got " + name.dump());
      c->target_names.push_back(name.get<std::string>());
    }
  } else {
    return field_error(source, "target_modules", "expected a list of module names or a regular expression, got " + t->dump());
  }
  return Status::ok();
}

using FactorNames = std::pair<std::string, std::string>;  // lora_A's tensor, lora_B's

// Linear layers of the blocks that take no adapter yet, by module name: the MoE routers
// (PEFT's all-linear targets them too) and Qwen2-MoE's shared-expert gate.
std::map<std::string, std::string> unadapted_modules(const Checkpoint& base, const ModelConfig& c) {
  std::map<std::string, std::string> out;
  const std::pair<TensorRole, const char*> kinds[] = {{TensorRole::kRouter, "the MoE router"},
                                                      {TensorRole::kSharedExpertGate, "the shared expert's gate"}};
  for (int l = 0; l < static_cast<int>(c.layers); ++l)
    for (const auto& [role, what] : kinds)
      for (const std::string& alt : name_alternatives(c.arch->name_of(role))) {
        const std::string weight = alt.empty() ? "" : tensor_name(alt, l);
        const size_t dot = weight.rfind(".weight");
        if (dot != std::string::npos && dot + 7 == weight.size() && base.find(weight) != nullptr)
          out.emplace(weight.substr(0, dot), what);
      }
  return out;
}

// The file's tensors by the module they adapt; each must be a LoRA factor of a targeted linear
// layer of the base.
StatusOr<std::map<std::string, FactorNames>> factor_names(const WeightFile& file,
                                                          const std::map<std::string, LoraTargetModule>& linears,
                                                          const std::map<std::string, std::string>& unadapted,
                                                          const LoraAdapterConfig& config, const std::string& arch) {
  std::map<std::string, FactorNames> pairs;
  for (const TensorInfo& t : file.tensors()) {
    std::string module;
    char which = 0;
    if (t.name.find("lora_magnitude_vector") != std::string::npos)
      return field_error(file.path(), t.name, "a DoRA magnitude vector: DoRA is not implemented");
    if (t.name.find("lora_embedding_") != std::string::npos)
      return field_error(file.path(), t.name, "an embedding adapter: adapters of the embedding are not implemented");
    if (!split_lora_name(t.name, &module, &which))
      return field_error(file.path(), t.name, "not a LoRA factor (expected base_model.model.<module>.lora_A/lora_B.weight)");
    if (const auto u = unadapted.find(module); u != unadapted.end())
      return field_error(file.path(), t.name, "'" + module + "' is " + u->second + ": adapters of it are not implemented");
    if (linears.find(module) == linears.end())
      return field_error(file.path(), t.name, "'" + module + "' is not a linear layer of the base's blocks (" + arch + ")");
    if (!config.targets(module))
      return field_error(file.path(), t.name, "'" + module + "' is not among adapter_config.json's target_modules");
    (which == 'A' ? pairs[module].first : pairs[module].second) = t.name;
  }
  if (pairs.empty()) return invalid_argument(file.path() + ": holds no LoRA factors");
  return pairs;
}

// A [rank, in] and B [out, rank] of one module, in f32, their shapes checked against the base's.
StatusOr<LoraModule> load_factors(const Checkpoint& weights, const LoraTargetModule& target, const FactorNames& names,
                                  int64_t rank) {
  const auto& [a_name, b_name] = names;
  if (a_name.empty() || b_name.empty()) {
    return field_error(weights.path(), target.name,
                       std::string("has lora_") + (a_name.empty() ? "B" : "A") + " without its pair");
  }
  LoraModule m;
  m.target = target;
  TESSERA_ASSIGN_OR_RETURN(m.a, weights.load(a_name, DType::kF32));
  TESSERA_ASSIGN_OR_RETURN(m.b, weights.load(b_name, DType::kF32));
  if (m.a.view().ndim != 2 || m.a.dim(0) != rank || m.a.dim(1) != target.in) {
    return field_error(weights.path(), a_name, "shape " + m.a.view().shape_string() + ", expected [" +
                                                   std::to_string(rank) + ", " + std::to_string(target.in) +
                                                   "] (r, the base layer's inputs)");
  }
  if (m.b.view().ndim != 2 || m.b.dim(0) != target.out || m.b.dim(1) != rank) {
    return field_error(weights.path(), b_name, "shape " + m.b.view().shape_string() + ", expected [" +
                                                   std::to_string(target.out) + ", " + std::to_string(rank) +
                                                   "] (the base layer's outputs, r)");
  }
  return m;
}

}  // namespace lora_adapter_internal

StatusOr<LoraAdapterConfig> parse_lora_adapter_config(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) return invalid_argument(source + ": expected a JSON object");
  LoraAdapterConfig c;
  const auto peft_type = j.find("peft_type");
  if (peft_type != j.end() && (!peft_type->is_string() || peft_type->get<std::string>() != "LORA"))
    return lai::field_error(source, "peft_type", "only LORA adapters are served, got " + peft_type->dump());
  for (const lai::Refused& r : lai::kRefused) {
    const auto it = j.find(r.field);
    if (it != j.end() && !lai::unused_value(*it, r.none))
      return lai::field_error(source, r.field, std::string(r.why) + ", got " + it->dump());
  }
  const auto r = j.find("r");
  if (r == j.end() || !r->is_number_integer() || r->get<int64_t>() < 1 || r->get<int64_t>() > 65536) {
    return lai::field_error(source, "r",
                            "expected the rank, a whole number from 1, got " + (r == j.end() ? "nothing" : r->dump()));
  }
  c.rank = r->get<int>();
  if (const auto a = j.find("lora_alpha"); a != j.end()) {
    if (!a->is_number() || !std::isfinite(a->get<double>()))
      return lai::field_error(source, "lora_alpha", "expected a number, got " + a->dump());
    c.alpha = a->get<double>();
  }
  for (const auto& [field, flag] :
       {std::pair<const char*, bool*>{"use_rslora", &c.rslora}, {"fan_in_fan_out", &c.fan_in_fan_out}}) {
    const auto it = j.find(field);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_boolean()) return lai::field_error(source, field, "expected true or false, got " + it->dump());
    *flag = it->get<bool>();
  }
  TESSERA_RETURN_IF_ERROR(lai::read_target_modules(j, source, &c));
  return c;
}

StatusOr<LoraAdapter> load_lora_adapter(const std::string& dir, const Checkpoint& base, const ModelConfig& c,
                                        int max_rank) {
  LoraAdapter adapter;
  adapter.path = dir;
  // A GGUF base presents its tensors under the row's Hugging Face names, in the Hugging Face
  // row order (worker/gguf_checkpoint.h: Llama's Q/K rows un-permuted, fused QKVs regrouped
  // back), so an adapter's modules and lora_B rows match it as they match the folder.
  std::map<std::string, LoraTargetModule> linears;
  for (LoraTargetModule& m : lora_target_modules(base, c)) linears.emplace(m.name, std::move(m));
  std::shared_ptr<WeightFile> file;
  std::string rank_source;  // where the rank was read, for the max_rank refusal
  if (lai::fs::is_regular_file(dir)) {
    if (!is_gguf_path(dir)) {
      return invalid_argument(dir + ": is a file; a LoRA adapter is a PEFT folder (adapter_config.json with "
                              "adapter_model.safetensors or adapter_model.bin) or a GGUF adapter file (.gguf, "
                              "llama.cpp's convert_lora_to_gguf.py)");
    }
    TESSERA_ASSIGN_OR_RETURN(GgufLoraAdapter gguf, open_gguf_lora_adapter(dir, c, linears));
    adapter.config = std::move(gguf.config);
    file = std::move(gguf.factors);
    rank_source = dir + ": its factors' rank";
  } else {
    const std::string config_path = dir + "/adapter_config.json";
    std::ifstream in(config_path);
    if (!in) return not_found(config_path + ": cannot be read (a PEFT adapter folder holds adapter_config.json)");
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return invalid_argument(config_path + ": not valid JSON");
    TESSERA_ASSIGN_OR_RETURN(adapter.config, parse_lora_adapter_config(j, config_path));
    TESSERA_ASSIGN_OR_RETURN(file, lai::open_adapter_weights(dir));
    rank_source = config_path + ": r:";
  }
  if (adapter.config.rank > max_rank) {
    return invalid_argument(rank_source + " " + std::to_string(adapter.config.rank) + " is above lora.max_rank " +
                            std::to_string(max_rank));
  }
  const std::unique_ptr<Checkpoint> weights = Checkpoint::from_weight_file(file->path(), nlohmann::json::object(), file);
  TESSERA_ASSIGN_OR_RETURN(const auto pairs, lai::factor_names(*file, linears, lai::unadapted_modules(base, c),
                                                               adapter.config, c.arch->name));
  for (const auto& [module, names] : pairs) {
    TESSERA_ASSIGN_OR_RETURN(LoraModule m, lai::load_factors(*weights, linears.at(module), names, adapter.config.rank));
    adapter.modules.push_back(std::move(m));
  }
  std::sort(adapter.modules.begin(), adapter.modules.end(), [](const LoraModule& x, const LoraModule& y) {
    return std::tie(x.target.layer, x.target.expert, x.target.role) <
           std::tie(y.target.layer, y.target.expert, y.target.role);
  });
  return adapter;
}

}  // namespace tessera
