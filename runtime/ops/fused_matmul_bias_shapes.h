#pragma once
// fused_matmul_bias's shape rules, shared by its CPU kernel
// (runtime/ops/fused_matmul_bias.cc), its CUDA launcher
// (runtime/ops/cuda/fused_matmul_bias.cu) and the pass that makes it
// (runtime/passes/fuse_matmul_bias.cc): X [..., M, K], a 2-D Y shared by the
// batch ([K, N], or [N, K] with transpose_Y), Bias [N], one dtype.
#include "runtime/core/check.h"
#include "runtime/core/dtype.h"
#include "runtime/core/tensor.h"
#include "runtime/ir/program.h"
#include "runtime/ops/gemm_shapes.h"

namespace mix::matmul_bias {

/// The product's dims (matmul's rule), after checking what the fused op
/// takes; build-time shapes may hold -1.
inline MatmulDims dims_of(const OpDesc& op, const Shape& x, const Shape& y, const Shape& bias, DType xt, DType yt,
                          DType bt) {
  MIX_CHECK(!op.attr<bool>("transpose_X", false), op.type << ": X cannot be transposed");
  MIX_CHECK(y.size() == 2, op.type << ": Y must be a 2-D weight, got " << shape_str(y));
  MIX_CHECK(xt == yt && xt == bt && is_floating(xt), op.type << ": X, Y and Bias must be of one float dtype, got "
                                                             << dtype_name(xt) << ", " << dtype_name(yt) << ", "
                                                             << dtype_name(bt));
  const MatmulDims d = matmul_dims(x, y, false, op.attr<bool>("transpose_Y", false));
  MIX_CHECK(bias.size() == 1 && (bias[0] < 0 || d.n < 0 || bias[0] == d.n),
            op.type << ": Bias must be [N] = [" << d.n << "], got " << shape_str(bias));
  return d;
}

}  // namespace mix::matmul_bias
