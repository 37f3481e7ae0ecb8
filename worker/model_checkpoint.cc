#include "worker/model_checkpoint.h"

#include <vector>

#include "worker/arch_spec.h"
#include "worker/gguf_checkpoint.h"

namespace tessera {
namespace {

// The base model's prefix of a family's tensor names ("transformer." for BLOOM, "model." for
// Llama): the first component of its embedding's name, when that name has one.
std::string base_model_prefix(const ArchSpec& arch) {
  const std::string& embed = arch.name_of(TensorRole::kEmbed);
  const size_t dot = embed.find('.');
  if (dot == std::string::npos || embed.find('.', dot + 1) == std::string::npos) return "";
  return embed.substr(0, dot + 1);
}

}  // namespace

StatusOr<std::unique_ptr<Checkpoint>> open_model_checkpoint(const std::string& path) {
  if (is_gguf_path(path)) return open_gguf_checkpoint(path);
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::open(path));
  if (!ckpt->ds_type().empty() && !accepted_ds_type(ckpt->ds_type())) {
    return invalid_argument(path + ": unsupported checkpoint \"type\" \"" + ckpt->ds_type() + "\" (accepted: " +
                            accepted_ds_types() + "; case-insensitive)");
  }
  // A checkpoint saved from the base model (the original bigscience/bloom shards) lacks the
  // prefix the architecture's names carry; an unknown model_type is reported later, by
  // the config parser, with the list of served ones.
  const auto& config = ckpt->config();
  if (auto mt = config.find("model_type"); mt != config.end() && mt->is_string()) {
    if (const ArchSpec* arch = find_arch_spec(mt->get<std::string>())) {
      const std::string prefix = base_model_prefix(*arch);
      const std::string& head = arch->name_of(TensorRole::kLmHead);
      std::vector<std::string> outside;
      if (head.rfind(prefix, 0) != 0) outside.push_back(head);  // "lm_head.weight" is not in the base model
      if (!prefix.empty() && ckpt->find(arch->name_of(TensorRole::kEmbed)) == nullptr) ckpt->add_missing_prefix(prefix, outside);
    }
  }
  return ckpt;
}

}  // namespace tessera
