#pragma once
// fuse_matmul_bias, a pass over the whole training program (after autodiff
// and gradient sync), for linear layers: each
//   t = matmul(X, W);  out = elementwise_add(t, b)   (b a 1-D bias over t's last dim)
// becomes one
//   out = fused_matmul_bias(X, W, b)                 (runtime/ops/fused_matmul_bias.cc)
// and so does each t = mul(X, W) with a 2-D X (the MLP's layers: X W^T, so
// fused with transpose_Y), when W is a 2-D weight shared by the batch, X is not transposed, t has no
// other reader, is neither persistable nor kept by the caller, and nothing but
// collective ops lies between the two (runtime/passes/fuse_pairs.h).
//
// Why: the product is never written and read back. On CUDA the bias is added
// in the GEMM's epilogue (cuBLASLt), as PyTorch's addmm adds a linear layer's
// bias: one kernel and one [rows, N] write and read fewer per linear layer
// (what that is worth for GPT-2: docs/design.md, "Fused matmul + bias").
//
// Values: the same in FP32; in FP16 and BF16 one rounding instead of two (the
// sum of product and bias is rounded once, not the product first), nearer the
// exact value (runtime/ops/fused_matmul_bias.cc).
//
// Run after autodiff: the backward's matmul_grad and elementwise_add_grad read
// neither t nor out, so t has one reader there. Under AMP, run it after
// amp::fuse_param_casts: until then each bias's FP16 cast sits between its
// matmul and add (so with --no-fuse-param-casts no AMP pair fuses). mixtrain runs it unless
// `--no-fuse-matmul-bias`; `--print-program` shows the fused ops.
#include <set>
#include <string>

#include "runtime/ir/program.h"

namespace mix {

/// Fuses the pairs described above in `p`; `keep` names variables the caller
/// reads after a run (never fused away). Returns how many it fused.
int fuse_matmul_bias(Program& p, const std::set<std::string>& keep);

}  // namespace mix
