#pragma once
// Streamed weights that need no file of their own (worker/weight_residency.h): where a unit's
// matrices were loaded without a copy (stored in the checkpoint in the dtype and layout the
// kernels read), the unit is streamed from the checkpoint file itself instead of being
// written to the spill file: mapped (model.weights_streaming map; and the embedding table,
// which every way reads a row per token through the mapping), or read with pread into a place
// of its own in the process's memory (read; direct too, with O_DIRECT, where the checkpoint's
// filesystem takes it). Not where model.weights_spill_dir names a folder for the streamed
// weights (a local disk for a checkpoint on a network volume), nor with
// model.weights_cache_dir, whose file holds every streamed unit so that a later start loads
// none of them.
//
// On the fused path a layer's q, k, v and gate, up are packed into one matrix each at load (a
// copy); a layer that will stream from the checkpoint is loaded as stored instead (separate
// matrices, which the fused path also runs), so the default path streams from the checkpoint
// too. That is decided before the layer loads (load_layers_as_stored, spill_streams_next_layer).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/checkpoint.h"
#include "worker/model_weights.h"
#include "worker/weight_units.h"

namespace tessera {

struct CheckpointSpan {
  std::shared_ptr<const WeightFile> file;  // whose whole mapping the unit lies in
  size_t offset = 0, span = 0;             // the page-aligned range covering its tensors there
  // Its tensors elsewhere (norms and biases converted at load): they stay resident.
  int64_t outside_bytes = 0;
  char* base() const { return const_cast<char*>(file->whole_mapping().base); }
};

// Where `tensors` (one unit) lie in one file of `checkpoint`: every matrix (two or more
// dimensions) inside that file's mapping, its elements on addresses a multiple of their size
// (not needed for a table read a row at a time: `rows_only`), and the range covering the unit's tensors
// there at most a quarter larger than they are (else a step would read other tensors' bytes
// besides). nullopt otherwise: the unit goes to the spill file.
std::optional<CheckpointSpan> checkpoint_span(const Checkpoint& checkpoint, const UnitTensors& tensors,
                                              bool rows_only = false);

// Gives every tensor of `weights` that still lies in one of `files` a copy of its own, except
// those of `streamed` (the units streamed from there) and the embedding table (read a row at
// a time from the mapping on purpose). Those left are small ones (norms, biases: under 64
// KiB, not copied at load) and a layer loaded as stored that then fitted the budget: read
// from the mapping, they would map the pages around them back into the process (with large
// page-cache folios, whole folios of the streamed units beside them) after those units were
// released. Returns the bytes copied.
int64_t copy_resident_from_files(ModelWeights& weights, const std::vector<const WeightFile*>& files,
                                 const std::vector<const Tensor*>& streamed);

// Whether layers streamed from this checkpoint can be read as stored, so that loading them
// as stored (no packing, no copy) lets them stream from it: one rank holds whole matrices,
// no quantization, and every matrix is stored in the compute dtype, its elements on a
// multiple of their size.
bool load_layers_as_stored(const Checkpoint& checkpoint, const WeightLoadOptions& options);

// Whether every file of `checkpoint` opens for O_DIRECT reads (model.weights_streaming direct
// reads its layers so; where the filesystem refuses, they go to the spill file).
bool checkpoint_takes_direct_reads(const Checkpoint& checkpoint);

}  // namespace tessera
