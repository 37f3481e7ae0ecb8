#pragma once
// Enums shared by the configuration (common/config.h) and the parts it configures, so one
// concept has one type from the YAML file to the code that acts on it.
#include <cstdint>
#include <optional>
#include <string>

namespace tessera {

// How one weight is split across tensor-parallel ranks (the auto-TP plan, worker/tp_plan.h).
// A YAML rule may name column, row or keep; vocab is what column means for an embedding.
enum class TpRole {
  kColumn,  // output features split (rows of an [out, in] weight); no communication
  kRow,     // input features split (columns); partial sums all-reduced after the matmul
  kKeep,    // replicated whole on every rank (norms, MoE router, small linears)
  kVocab,   // vocabulary rows split: embedding (all-reduce) and LM head (all-gather)
};
const char* tp_role_name(TpRole role);  // "column", "row", "keep", "vocab"

// How the scheduler forms batches (coordinator/engine/scheduler.h, `scheduler.mode`).
enum class BatchingMode : uint8_t {
  kContinuous,  // sequences join and leave at every step
  kStatic,      // a batch forms only when nothing runs; nobody joins until all members finish
};

// The device a worker computes on (kernels/backend.h, `worker.backend`). The configuration
// holds std::optional<BackendKind>: nullopt is "auto" (CUDA when the build has it and a
// device is visible, else the CPU).
enum class BackendKind : uint8_t { kCpu, kCuda };
const char* backend_kind_name(BackendKind kind);                  // "cpu", "cuda"
const char* backend_choice_name(std::optional<BackendKind> kind);  // "auto", "cpu", "cuda"
// "cpu" / "cuda" / "auto" (nullopt); false for any other name.
bool parse_backend_choice(const std::string& name, std::optional<BackendKind>* out);

}  // namespace tessera
