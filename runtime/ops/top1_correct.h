#pragma once
// top1_correct's shape checks, shared by its CPU and CUDA kernels
// (runtime/ops/top1_correct.cc, runtime/ops/cuda/top1_correct.cu).
#include <cstdint>

#include "runtime/core/tensor.h"
#include "runtime/ir/program.h"

namespace mix {

struct Top1Dims {
  int64_t rows, classes;
  int64_t valid;  // attr valid_classes: the argmax runs over the first `valid` columns (the rest are padding)
};

/// Rows and classes of Logits [..., classes] with one Label per row, and the
/// classes `op`'s attr valid_classes lets the argmax see; throws naming the
/// problem otherwise.
Top1Dims top1_dims(const OpDesc& op, const Tensor& logits, const Tensor& label);

}  // namespace mix
