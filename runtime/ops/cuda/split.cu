// CUDA launchers of split and split_grad (concat along the same axis, zeros for
// parts without a gradient). X is [outer, dim, inner] around the axis
// (split_rules::strips_of), so part k is a 2-D block of `outer` rows of
// size_k·inner elements, at column offset start_k·inner of X's rows of
// dim·inner elements: one cudaMemcpy2DAsync per part on the compute stream
// (cudaMemset2DAsync for a missing gradient), bytes copied as they are, so
// every dtype works and the result is identical to the CPU's memcpy loops.
// There is no kernel of our own: the copies are the CUDA runtime's.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/split_shapes.h"

namespace mix::cuda {
namespace {

using split_rules::Strips;

void split_cuda(OpContext& ctx) {
  const Tensor x = ctx.in("X");  // by value: an output may replace X's scope entry
  check_on_device(ctx, x, "X");
  const size_t axis = split_rules::split_axis(ctx.op, x.shape());
  const std::vector<int64_t> sizes = split_rules::part_sizes(ctx.op, x.shape(), axis);
  split_rules::check_out_count(ctx.op, ctx.op.outs("Out").size(), sizes.size());
  const Strips s = split_rules::strips_of(x.shape(), axis, x.dtype());
  const cudaStream_t stream = compute_stream(ctx);
  const auto* src = static_cast<const unsigned char*>(x.raw());
  const size_t row = static_cast<size_t>(s.dim) * s.inner_bytes;  // X's bytes per outer index
  int64_t start = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    Tensor& out = ctx.out("Out", split_rules::with_dim(x.shape(), axis, sizes[k]), x.dtype(), k);
    const size_t part = static_cast<size_t>(sizes[k]) * s.inner_bytes;
    if (part > 0 && s.outer > 0)
      MIX_CUDA_CHECK(cudaMemcpy2DAsync(out.raw(), part, src + static_cast<size_t>(start) * s.inner_bytes, row, part,
                                       static_cast<size_t>(s.outer), cudaMemcpyDeviceToDevice, stream));
    start += sizes[k];
  }
}

void split_grad_cuda(OpContext& ctx) {
  // By value: X@GRAD may replace an input's scope entry.
  const std::vector<std::string>& names = ctx.op.ins("Out@GRAD");
  std::vector<Tensor> held;
  for (const std::string& n : names) held.push_back(n.empty() ? Tensor() : ctx.scope.get(n));
  std::vector<const Tensor*> parts;  // null where a part has no gradient
  for (size_t k = 0; k < names.size(); ++k) parts.push_back(names[k].empty() ? nullptr : &held[k]);
  for (size_t k = 0; k < parts.size(); ++k)
    if (parts[k]) check_on_device(ctx, *parts[k], "Out@GRAD[" + std::to_string(k) + "]");
  const split_rules::GradParts g = split_rules::grad_parts(ctx.op, parts, ctx.in_opt("X"));
  Tensor& dx = ctx.out("X@GRAD", g.x_shape, g.dtype);
  const Strips s = split_rules::strips_of(g.x_shape, g.axis, g.dtype);
  const cudaStream_t stream = compute_stream(ctx);
  auto* dst = static_cast<unsigned char*>(dx.raw());
  const size_t row = static_cast<size_t>(s.dim) * s.inner_bytes;  // X@GRAD's bytes per outer index
  int64_t start = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const size_t part = static_cast<size_t>(g.sizes[k]) * s.inner_bytes;
    unsigned char* d = dst + static_cast<size_t>(start) * s.inner_bytes;
    if (part > 0 && s.outer > 0) {
      if (parts[k])
        MIX_CUDA_CHECK(cudaMemcpy2DAsync(d, row, parts[k]->raw(), part, part, static_cast<size_t>(s.outer),
                                         cudaMemcpyDeviceToDevice, stream));
      else  // all-zero bytes are 0 in every dtype
        MIX_CUDA_CHECK(cudaMemset2DAsync(d, row, 0, part, static_cast<size_t>(s.outer), stream));
    }
    start += g.sizes[k];
  }
}

const bool registered = OpRegistry::instance().add_cuda_kernel("split", split_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("split_grad", split_grad_cuda);

}  // namespace
}  // namespace mix::cuda
