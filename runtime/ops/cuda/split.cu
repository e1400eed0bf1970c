// CUDA launchers of split and split_grad (concat along the same axis, zeros for
// parts without a gradient). X is [outer, dim, inner] around the axis
// (split_rules::strips_of), so part k is a 2-D block of `outer` rows of
// size_k·inner elements, at column offset start_k·inner of X's rows of
// dim·inner elements: one cudaMemcpy2DAsync per part on the compute stream
// (cudaMemset2DAsync for a missing gradient; a plain copy for one row), bytes
// copied as they are, so every dtype works and the result is identical to the
// CPU's memcpy loops. There is no kernel of our own: the copies are the CUDA
// runtime's. A pitch beyond what the 2-D calls take (rows over 2 GiB) goes row
// by row instead (cuda::set_large_tensor_paths makes tests take that way).
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/ops/cuda/device_ops.cuh"
#include "runtime/ops/split_shapes.h"

namespace mix::cuda {
namespace {

using split_rules::Strips;

// The largest pitch cudaMemcpy2DAsync and cudaMemset2DAsync accept
// (cudaDevAttrMaxPitch: 2^31 - 1 bytes on every GPU to date).
constexpr size_t kMaxPitch = (size_t{1} << 31) - 1;

// Whether a 2-D copy or memset takes these pitches (cuda::large_tensor_paths:
// tests run the row-by-row path at any size).
bool fits_2d(size_t dpitch, size_t spitch) {
  return dpitch <= kMaxPitch && spitch <= kMaxPitch && !large_tensor_paths();
}

// `rows` rows of `width` bytes from `src` (rows `spitch` apart) to `dst`
// (rows `dpitch` apart), on `stream`: one 2-D copy, or one copy when there is
// a single row, or a copy per row when a pitch is too large for a 2-D copy.
void copy_rows(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows,
               cudaStream_t stream) {
  if (rows == 1) {
    MIX_CUDA_CHECK(cudaMemcpyAsync(dst, src, width, cudaMemcpyDeviceToDevice, stream));
  } else if (fits_2d(dpitch, spitch)) {
    MIX_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, stream));
  } else {
    for (size_t r = 0; r < rows; ++r)
      MIX_CUDA_CHECK(cudaMemcpyAsync(static_cast<unsigned char*>(dst) + r * dpitch,
                                     static_cast<const unsigned char*>(src) + r * spitch, width,
                                     cudaMemcpyDeviceToDevice, stream));
  }
}

// Zeroes `rows` rows of `width` bytes, `pitch` apart, from `dst`, as copy_rows copies.
void zero_rows(void* dst, size_t pitch, size_t width, size_t rows, cudaStream_t stream) {
  if (rows == 1) {
    MIX_CUDA_CHECK(cudaMemsetAsync(dst, 0, width, stream));
  } else if (fits_2d(pitch, pitch)) {
    MIX_CUDA_CHECK(cudaMemset2DAsync(dst, pitch, 0, width, rows, stream));
  } else {
    for (size_t r = 0; r < rows; ++r)
      MIX_CUDA_CHECK(cudaMemsetAsync(static_cast<unsigned char*>(dst) + r * pitch, 0, width, stream));
  }
}

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
      copy_rows(out.raw(), part, src + static_cast<size_t>(start) * s.inner_bytes, row, part,
                static_cast<size_t>(s.outer), stream);
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
        copy_rows(d, row, parts[k]->raw(), part, part, static_cast<size_t>(s.outer), stream);
      else  // all-zero bytes are 0 in every dtype
        zero_rows(d, row, part, static_cast<size_t>(s.outer), stream);
    }
    start += g.sizes[k];
  }
}

const bool registered = OpRegistry::instance().add_cuda_kernel("split", split_cuda) &&
                        OpRegistry::instance().add_cuda_kernel("split_grad", split_grad_cuda);

}  // namespace
}  // namespace mix::cuda
