#include "worker/lora_weights.h"

#include <cstring>
#include <map>
#include <memory>

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

// Columns [begin, begin + count) of a [rows, cols] f32 tensor (all of it when count < 0).
Tensor f32_columns(const Tensor& t, int64_t begin, int64_t count) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  if (count < 0 || (begin == 0 && count == cols)) return t;
  Tensor out = Tensor::zeros({rows, count}, DType::kF32);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data<float>() + r * count, t.data<float>() + r * cols + begin, static_cast<size_t>(count) * 4);
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
    p.a = f32_columns(current->a, l.source.in_begin, l.source.in_count);
    p.b = Tensor::zeros({rows, rank}, DType::kF32);
    float* dst = p.b.data<float>();
    for (const LinearSource::Rows& r : gathered) {
      std::memcpy(dst, current->b.data<float>() + r.begin * rank, static_cast<size_t>(r.count * rank) * 4);
      dst += r.count * rank;
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

StatusOr<LoraWeights> shard_lora_adapter(const LoraAdapter& adapter, const std::string& name,
                                         const ModelWeights& weights, Backend& backend) {
  namespace lwi = lora_weights_internal;
  LoraWeights out;
  out.name = name;
  out.path = adapter.path;
  out.rank = adapter.config.rank;
  out.scale = static_cast<float>(adapter.config.scale());
  out.sites.resize(static_cast<size_t>(weights.lora_sites));
  std::map<std::string, const LoraModule*> modules;
  for (const LoraModule& m : adapter.modules) modules.emplace(m.target.name, &m);
  size_t used = 0;  // modules some linear of this rank takes rows of
  std::map<const LoraModule*, bool> seen;
  for (const LayerWeights& lw : weights.layers) {
    for_each_layer_linear(lw, [&](const LinearWeights& l) {
      if (l.lora_site < 0) return;
      std::vector<LoraPart> parts = lwi::site_parts(l, modules);
      for (LoraPart& p : parts) {
        out.bytes += static_cast<int64_t>(p.a.nbytes() + p.b.nbytes());
        p.a = backend.place_weight(p.a);
        p.b = backend.place_weight(p.b);
      }
      for (const LinearSource::Rows& r : l.source.rows) {
        const auto m = modules.find(lwi::module_of(r.weight));
        if (m != modules.end() && !seen[m->second]) {
          seen[m->second] = true;
          ++used;
        }
      }
      out.sites[static_cast<size_t>(l.lora_site)] = std::move(parts);
    });
  }
  if (used != adapter.modules.size()) {
    // Every module was matched against the base's checkpoint names when the adapter was read;
    // one no linear here took rows of was read against another base.
    for (const LoraModule& m : adapter.modules)
      if (!seen[&m])
        return invalid_argument(adapter.path + ": " + m.target.name + " adapts no linear layer this model loaded");
  }
  return out;
}

StatusOr<LoraWeights> load_lora_weights(const std::string& name, const std::string& dir, const std::string& model_path,
                                        const ModelWeights& weights, int max_rank, Backend& backend) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> base, open_model_checkpoint(model_path));
  TESSERA_ASSIGN_OR_RETURN(ModelConfig config, parse_model_config(base->config(), base->config_source()));
  TESSERA_ASSIGN_OR_RETURN(LoraAdapter adapter, load_lora_adapter(dir, *base, config, max_rank));
  return shard_lora_adapter(adapter, name, weights, backend);
}

}  // namespace tessera
