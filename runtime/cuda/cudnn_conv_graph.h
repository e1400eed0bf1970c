#pragma once
// Convolutions through cuDNN's graph (backend) API, each pass's execution
// plan built once per shape and reused: mixtrain's default
// (--no-cudnn-graph-conv gives the legacy calls back).
//
// Why: the host's time to queue each legacy
// cudnnConvolution{Forward,BackwardData,BackwardFilter} call, with the
// algorithm already chosen and cached by runtime/ops/cuda/conv2d.cu, set the
// pace of a ResNet-50 AMP step: the GPU waited for the host (the host
// profile, MIX_PROFILE_OPS=host, and the figures are in docs/gpu.md). cuDNN 9
// runs the legacy calls on its graph API; a plan made once and run with a
// fresh variant pack each call leaves only the launch to pay.
//
// The choice: cuDNN's heuristics (mode A, then the fallback list) rank the
// engine configurations; those whose numerical notes break conv2d.cu's rules
// are dropped (inputs rounded to a narrower type, reduced-precision sums, and
// for strict FP32 any tensor-core engine, which would be TF32); deterministic
// engines come first (the forward pass may fall back to a nondeterministic
// one, with a warning; a backward pass with none runs on the legacy API,
// which prefers deterministic algorithms as well), and precompiled engines
// before runtime-compiled ones (whose plans take long to build). The first
// whose plan cuDNN builds, with a workspace within the limit that the device
// can give, is cached per shape. When none builds, or none's workspace fits
// at that moment, the caller runs the legacy API.
#include <cudnn.h>

#include <cstddef>
#include <cstdint>

#include "runtime/core/tensor.h"
#include "runtime/kernels/conv_dims.h"

namespace mix::cuda {

/// One pass of a convolution with the shapes `dims` (runtime/kernels/conv_dims.h:
/// channels last stores the data NHWC and the filter [oc, kh, kw, c / groups]).
struct ConvGraphShape {
  ConvPass pass = ConvPass::forward;
  DType dtype = DType::f32;
  bool allow_tf32 = false;
  ConvDims dims;
};

/// Runs the pass on `handle`'s stream with beta 0 (the result overwritten):
/// forward y = conv(x, w); backward data x = dInput from y = dOutput and w;
/// backward filter w = dFilter from x and y = dOutput. The workspace comes
/// from `device`'s allocator, at most `workspace_limit` bytes. False when
/// cuDNN's graph API has no plan for these shapes (warned once per shape):
/// the caller then runs the legacy API.
bool run_conv_graph(cudnnHandle_t handle, Device device, const ConvGraphShape& shape, void* x, void* w, void* y,
                    size_t workspace_limit);

/// Passes run_conv_graph has run on the graph API (true returned) in this
/// process: tests tell by it that the graph path ran, not its fallback to the
/// legacy calls, which computes the same result.
uint64_t conv_graph_runs();

}  // namespace mix::cuda
