#include "common/parallel_roles.h"

namespace tessera {

const char* tp_role_name(TpRole role) {
  switch (role) {
    case TpRole::kColumn: return "column";
    case TpRole::kRow: return "row";
    case TpRole::kKeep: return "keep";
    case TpRole::kVocab: return "vocab";
  }
  return "?";
}

}  // namespace tessera
