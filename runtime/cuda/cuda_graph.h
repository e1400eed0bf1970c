#pragma once
// The CUDA DeviceGraph (runtime/core/device_backend.h): stream capture of a
// device's compute stream into a CUDA graph, its memory from a pool of the
// caching allocator's that belongs to the graph alone.
#include <memory>

#include "runtime/core/device_backend.h"
#include "runtime/cuda/device_allocator.h"

namespace mix::cuda {

/// An empty recording of `device`'s compute stream, its memory from a new pool of `allocator` (the device's).
std::unique_ptr<DeviceGraph> make_cuda_graph(int device, CudaCachingAllocator& allocator);

}  // namespace mix::cuda
