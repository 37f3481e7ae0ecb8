#pragma once
// The CUDA backend's WeightStager (kernels/weight_stager.h): pinned host memory, device slots,
// copies on a stream of their own ordered against the compute stream by events.
#include <memory>

#include "common/status.h"
#include "kernels/weight_stager.h"

struct CUstream_st;

namespace tessera::cuda {

StatusOr<std::unique_ptr<WeightStager>> make_cuda_weight_stager(int device, CUstream_st* compute, size_t host_bytes,
                                                                size_t slot_bytes, int slots);

}  // namespace tessera::cuda
