#pragma once
// Memory layout of image tensors for conv2d, pool2d and batch_norm:
// channels first (NCHW, the default, PyTorch's) or channels last (NHWC, the
// layout cuDNN's FP16 tensor-core kernels read without converting). The
// attribute names follow Paddle: `data_format` on conv2d and pool2d,
// `data_layout` on batch_norm; both take "NCHW" or "NHWC".
//
// Only activations change layout. Filters stay [OC, C/groups, KH, KW] and the
// batch_norm vectors stay [C] in both, so checkpoints do not depend on it.
//
// The CPU kernels compute channels last by permuting to channels first,
// running the channels-first loops and permuting the result back: the same
// arithmetic in the same order, so both layouts give the same bits. They are
// the oracle of the cuDNN kernels, which read NHWC natively.
#include <cstddef>
#include <string>

#include "runtime/core/check.h"
#include "runtime/core/tensor.h"
#include "runtime/ir/program.h"
#include "runtime/ops/transpose2_shapes.h"

namespace mix {

/// Whether the op's `attr` (data_format or data_layout) says channels last; NCHW when absent.
inline bool channels_last_attr(const OpDesc& op, const char* attr) {
  const std::string f = op.attr<std::string>(attr, "NCHW");
  MIX_CHECK(f == "NCHW" || f == "NHWC", op.type << ": " << attr << " must be NCHW or NHWC, got '" << f << "'");
  return f == "NHWC";
}

namespace layout {

/// [N, spatial..., C] -> [N, C, spatial...]: the channel axis moves from last to 1.
inline transpose_rules::Perm to_channels_first(size_t ndim) {
  transpose_rules::Perm p{0, static_cast<int64_t>(ndim) - 1};
  for (size_t k = 1; k + 1 < ndim; ++k) p.push_back(static_cast<int64_t>(k));
  return p;
}

/// [N, C, spatial...] -> [N, spatial..., C], the inverse of to_channels_first.
inline transpose_rules::Perm to_channels_last(size_t ndim) { return transpose_rules::inverse(to_channels_first(ndim)); }

/// A channels-last shape seen channels first.
inline Shape channels_first_shape(const Shape& s) { return transpose_rules::permuted(s, to_channels_first(s.size())); }

/// A copy of host tensor x permuted by `perm`.
inline Tensor permuted_copy(const Tensor& x, const transpose_rules::Perm& perm) {
  Tensor out = Tensor::empty(transpose_rules::permuted(x.shape(), perm), x.dtype());
  transpose_rules::permute_into_cpu(x, perm, out);
  return out;
}

/// A channels-first copy of a channels-last host tensor, and the reverse
/// (rank 2 is a plain copy either way).
inline Tensor channels_first_copy(const Tensor& x) { return permuted_copy(x, to_channels_first(x.shape().size())); }
inline Tensor channels_last_copy(const Tensor& x) { return permuted_copy(x, to_channels_last(x.shape().size())); }

/// out (channels last, already shaped) = host tensor x (channels first) permuted.
inline void store_channels_last(const Tensor& x, Tensor& out) {
  transpose_rules::permute_into_cpu(x, to_channels_last(x.shape().size()), out);
}

}  // namespace layout
}  // namespace mix
