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

const char* backend_kind_name(BackendKind kind) {
  switch (kind) {
    case BackendKind::kCpu: return "cpu";
    case BackendKind::kCuda: return "cuda";
  }
  return "?";
}

const char* backend_choice_name(std::optional<BackendKind> kind) { return kind ? backend_kind_name(*kind) : "auto"; }

bool parse_backend_choice(const std::string& name, std::optional<BackendKind>* out) {
  if (name == "auto") {
    out->reset();
  } else if (name == "cpu") {
    *out = BackendKind::kCpu;
  } else if (name == "cuda") {
    *out = BackendKind::kCuda;
  } else {
    return false;
  }
  return true;
}

}  // namespace tessera
