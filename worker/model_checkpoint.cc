#include "worker/model_checkpoint.h"

#include "worker/arch_spec.h"

namespace tessera {

StatusOr<std::unique_ptr<Checkpoint>> open_model_checkpoint(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::open(path));
  if (!ckpt->ds_type().empty() && !accepted_ds_type(ckpt->ds_type())) {
    return invalid_argument(path + ": unsupported checkpoint \"type\" \"" + ckpt->ds_type() + "\" (accepted: " +
                            accepted_ds_types() + "; case-insensitive)");
  }
  return ckpt;
}

}  // namespace tessera
