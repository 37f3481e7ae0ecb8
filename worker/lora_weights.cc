#include "worker/lora_weights.h"

#include <map>
#include <memory>
#include <set>

#include "worker/model_checkpoint.h"

namespace tessera {
namespace lora_weights_internal {

// "….q_proj.weight" -> "….q_proj": the PEFT module a checkpoint weight belongs to.
std::string module_of(const std::string& weight) {
  const std::string suffix = ".weight";
  if (weight.size() > suffix.size() && weight.compare(weight.size() - suffix.size(), suffix.size(), suffix) == 0)
    return weight.substr(0, weight.size() - suffix.size());
  return weight;
}

// Columns [begin, begin + count) of a [rows, cols] f32 tensor (all of them when count < 0),
// transposed: [count, rows].
Tensor transposed_columns(const Tensor& t, int64_t begin, int64_t count) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  if (count < 0) count = cols;
  Tensor out = Tensor::zeros({count, rows}, DType::kF32);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < count; ++c) out.data<float>()[c * rows + r] = t.data<float>()[r * cols + begin + c];
  return out;
}

// An f32 tensor in `dtype` (f32: itself).
Tensor stored_as(const Tensor& f32, DType dtype) {
  if (dtype == DType::kF32) return f32;
  Tensor out = Tensor::zeros(f32.view().dims(), dtype);
  convert_elements(f32.data<float>(), DType::kF32, out.data<void>(), dtype, static_cast<size_t>(f32.numel()));
  return out;
}

// The parts of one linear: a part per run of consecutive source rows of one adapted module.
std::vector<LoraPart> site_parts(const LinearWeights& l, const std::map<std::string, const LoraModule*>& modules) {
  std::vector<LoraPart> parts;
  const LoraModule* current = nullptr;  // the module of the part being gathered
  std::vector<LinearSource::Rows> gathered;
  int64_t offset = 0, part_offset = 0;
  auto flush = [&] {
    if (current == nullptr) return;
    int64_t rows = 0;
    for (const LinearSource::Rows& r : gathered) rows += r.count;
    const int64_t rank = current->b.dim(1);
    LoraPart p;
    p.offset = part_offset;
    p.shrink = transposed_columns(current->a, l.source.in_begin, l.source.in_count);
    p.expand = Tensor::zeros({rank, rows}, DType::kF32);
    int64_t at = 0;  // the part's output column of r's first row
    for (const LinearSource::Rows& r : gathered) {
      for (int64_t i = 0; i < r.count; ++i)
        for (int64_t k = 0; k < rank; ++k)
          p.expand.data<float>()[k * rows + at + i] = current->b.data<float>()[(r.begin + i) * rank + k];
      at += r.count;
    }
    parts.push_back(std::move(p));
    current = nullptr;
    gathered.clear();
  };
  for (const LinearSource::Rows& r : l.source.rows) {
    const auto m = modules.find(module_of(r.weight));
    const LoraModule* module = m == modules.end() ? nullptr : m->second;
    if (module != current) {
      flush();
      current = module;
      part_offset = offset;
    }
    if (module != nullptr) gathered.push_back(r);
    offset += r.count;
  }
  flush();
  return parts;
}

}  // namespace lora_weights_internal

void place_lora(LoraWeights& adapter, Backend& backend) {
  if (adapter.resident) return;
  adapter.sites.clear();
  for (const std::vector<LoraPart>& site : adapter.host) {
    std::vector<LoraPart>& placed = adapter.sites.emplace_back();
    for (const LoraPart& p : site) placed.push_back(LoraPart{p.offset, backend.place_weight(p.shrink), backend.place_weight(p.expand)});
  }
  adapter.resident = true;
}

void evict_lora(LoraWeights& adapter) {
  adapter.sites.clear();
  adapter.resident = false;
}

StatusOr<LoraWeights> shard_lora_adapter(const LoraAdapter& adapter, const std::string& name,
                                         const ModelWeights& weights, DType model_dtype) {
  const DType factors = model_dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  namespace lwi = lora_weights_internal;
  LoraWeights out;
  out.name = name;
  out.path = adapter.path;
  out.rank = adapter.config.rank;
  out.scale = static_cast<float>(adapter.config.scale());
  out.host.resize(static_cast<size_t>(weights.lora_sites));
  std::map<std::string, const LoraModule*> modules;
  for (const LoraModule& m : adapter.modules) modules.emplace(m.target.name, &m);
  std::set<const LoraModule*> used;  // modules some linear of this rank takes rows of
  for (const LayerWeights& lw : weights.layers) {
    for_each_layer_linear(lw, [&](const LinearWeights& l) {
      if (l.lora_site < 0) return;
      std::vector<LoraPart> parts = lwi::site_parts(l, modules);
      for (LoraPart& p : parts) {
        p.shrink = lwi::stored_as(p.shrink, factors);
        p.expand = lwi::stored_as(p.expand, factors);
        out.bytes += static_cast<int64_t>(p.shrink.nbytes() + p.expand.nbytes());
      }
      for (const LinearSource::Rows& r : l.source.rows) {
        const auto m = modules.find(lwi::module_of(r.weight));
        if (m != modules.end()) used.insert(m->second);
      }
      out.host[static_cast<size_t>(l.lora_site)] = std::move(parts);
    });
  }
  // Every module was matched against the base's checkpoint names when the adapter was read;
  // one no linear here took rows of was read against another base.
  for (const LoraModule& m : adapter.modules)
    if (used.count(&m) == 0)
      return invalid_argument(adapter.path + ": " + m.target.name + " adapts no linear layer this model loaded");
  return out;
}

StatusOr<LoraWeights> load_lora_weights(const std::string& name, const std::string& dir, const std::string& model_path,
                                        const ModelWeights& weights, DType model_dtype, int max_rank) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> base, open_model_checkpoint(model_path));
  TESSERA_ASSIGN_OR_RETURN(ModelConfig config, parse_model_config(base->config(), base->config_source()));
  TESSERA_ASSIGN_OR_RETURN(LoraAdapter adapter, load_lora_adapter(dir, *base, config, max_rank));
  return shard_lora_adapter(adapter, name, weights, model_dtype);
}

}  // namespace tessera
