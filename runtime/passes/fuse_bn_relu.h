#pragma once
// fuse_bn_relu, a pass over the whole training program (after autodiff and
// gradient sync), for the batch norms followed by a relu: in a ResNet every
// convolution's batch_norm but a block's last (whose relu follows the
// residual add, runtime/passes/fuse_add_relu.h). It rewrites each pair
//   forward    t = batch_norm(x, ...);           y = relu(t)
//   backward   dt = relu_grad(y, dy);            dx, dscale, dbias = batch_norm_grad(x, ..., dt)
// into batch_norm and batch_norm_grad with Paddle's attr fuse_with_relu
// (runtime/ops/batch_norm.cc):
//   y = batch_norm(x, ...) [fuse_with_relu]
//   dx, dscale, dbias = batch_norm_grad(x, ..., Bias, Y = y, Y@GRAD = dy) [fuse_with_relu]
// and, where fuse_add_relu has run, a residual block's end
//   forward    t = batch_norm(x, ...);           y = fused_add_relu(t, shortcut)
// into y = batch_norm(x, ..., Z = shortcut) [fuse_with_relu] (its gradient
// stays as it was: fused_sum_relu_grad, elementwise_add_grad, then
// batch_norm_grad, which read y and x, never t),
// under the conditions of runtime/passes/fuse_pairs.h (t and dt have no other
// reader, are not kept, only collective ops lie between the two ops). The
// backward pair is rewritten only when its batch_norm_grad is the gradient of
// a fused forward and its relu_grad reads that forward's y: the fused
// gradient recomputes relu's mask from x with the forward's statistics.
//
// Why: neither t nor dt is ever written or read back. On CUDA channels last
// (runtime/ops/cuda/batch_norm_channels_last.cuh, which recompute the mask
// as the CPU kernel does) a relu pair then moves, per FP16 element of t, 6
// bytes forward instead of 10 and 10 backward instead of 16, counting two
// reads of X per batch norm pass: about 2.6 GB a step for ResNet-50 at batch
// 64 (4.1M such elements an image); a block's end 4 bytes less forward (t's
// write and read): about 1.4 GB more (5.5M elements an image). The values
// are the same bits as the pairs' (tested op by op and on whole training
// steps) wherever the fused and unfused ops run the same kernels: on the CPU
// and, NCHW, on CUDA (channels last, ours against cuDNN's, they agree within
// test_cuda_conv_ops's bounds).
//
// mixtrain runs it unless `--no-fuse-bn-relu`; `--print-program` shows
// fuse_with_relu on the ops.
#include <set>
#include <string>

#include "runtime/ir/program.h"

namespace mix {

/// How many pairs fuse_bn_relu fused.
struct FusedBnRelu {
  int forward = 0;      // batch_norm + relu
  int backward = 0;     // relu_grad + batch_norm_grad
  int forward_add = 0;  // batch_norm + fused_add_relu
};

/// Fuses the pairs described above in `p`; `keep` names variables the caller
/// reads after a run (never fused away).
FusedBnRelu fuse_bn_relu(Program& p, const std::set<std::string>& keep);

}  // namespace mix
