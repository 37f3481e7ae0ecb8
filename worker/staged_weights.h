#pragma once
// ZeRO-Inference's weight offload where the backend computes in memory of its own (CUDA):
// the units that model.weights_memory_budget leaves out stay in host memory the device
// copies from directly (pinned), and each step copies every streamed unit into one of
// model.weights_prefetch_layers device slots ahead of use (Backend::make_weight_stager;
// kernels/weight_stager.h), so that copying the next units overlaps computing this one.
// Units and which stay resident: worker/weight_units.h. Every streamed unit is copied whole,
// the embedding table too (its rows are gathered on the device).
//
// Made from the weights in host memory before they are placed: the streamed units' tensors
// then point at their host copies (which place_model_weights must leave alone:
// in_host_memory), and each step points them at the slot their unit was copied into.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/weight_stager.h"
#include "worker/weight_residency.h"
#include "worker/weight_units.h"

namespace tessera {

// A device streams from pinned host memory, not from a spill file: model.weights_spill_dir
// or a model.weights_streaming other than the default would be silently unused there, so
// they are refused naming the key.
Status check_device_streaming_options(const WeightResidencyOptions& options);

class StagedWeights {
 public:
  // Null when every weight fits the budget. Errors name the key: a budget below the tensors
  // that always stay resident, host or device memory that cannot be had.
  static StatusOr<std::unique_ptr<StagedWeights>> make(ModelWeights& weights, const WeightResidencyOptions& options,
                                                       Backend& backend);
  // The weights' tensors moved (into the Transformer): the units' tensors are found again
  // in `weights` (the same model, in the same order).
  void bind(ModelWeights& weights);
  // Whether `t` is a streamed tensor's host copy (not to be placed on the device).
  bool in_host_memory(const Tensor& t) const;

  // Around each part of a step, in order, as WeightResidency's.
  void before_embedding();
  void after_embedding();
  void before_layer(int layer);
  void after_layer(int layer);
  void before_lm_head();
  void after_lm_head();

  // Bytes of weights on the device: the resident set and the slots.
  int64_t device_bytes() const { return units_.resident_bytes() + slots_bytes(); }
  int64_t budget_bytes() const { return units_.budget_bytes; }
  int64_t slot_bytes() const { return static_cast<int64_t>(slot_bytes_); }
  int64_t slots_bytes() const { return static_cast<int64_t>(slot_bytes_) * static_cast<int64_t>(slot_unit_.size()); }
  int64_t streamed_bytes() const { return units_.streamed_bytes(); }
  // Units copied into a slot so far (a unit still in its slot from the last step is not
  // copied again).
  int64_t copies() const { return copies_; }
  std::string plan() const;

 private:
  StagedWeights() = default;
  // The unit and the streamed units after it, prefetch_layers in all.
  std::vector<int> window(int unit) const;
  // Copies the unit into a slot outside the window unless one still holds it.
  void fetch(int unit);
  // The unit's tensors point into `slot`, or at their host copy (-1).
  void point(int unit, int slot);
  void use(int unit);
  void done(int unit);

  WeightUnits units_;
  std::vector<size_t> host_offset_;                  // per unit, into the stager's host memory
  std::vector<std::vector<size_t>> tensor_offset_;   // per unit, per tensor (within the unit)
  std::vector<size_t> unit_bytes_;                   // per unit, its span (aligned)
  std::shared_ptr<WeightStager> stager_;  // the tensors pointing into its memory keep it too
  size_t slot_bytes_ = 0, host_bytes_ = 0;
  int prefetch_ = 2;
  std::vector<int> slot_unit_;      // per slot: the unit it holds, or -1
  std::vector<bool> slot_busy_;     // per slot: holds a unit of the current window
  std::vector<int64_t> slot_freed_; // per slot: when it was last done with (least recent is reused)
  std::vector<int> unit_slot_;      // per unit: its slot, or -1
  int64_t clock_ = 0, copies_ = 0;
  DeviceKind device_ = DeviceKind::kCpu;
};

}  // namespace tessera
