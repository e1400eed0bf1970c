#pragma once
// top1_correct's shape checks, shared by its CPU and CUDA kernels
// (runtime/ops/top1_correct.cc, runtime/ops/cuda/top1_correct.cu).
#include <cstdint>

#include "runtime/core/tensor.h"

namespace mix {

struct Top1Dims {
  int64_t rows, classes;
};

/// Rows and classes of Logits [..., classes] with one Label per row; throws
/// naming the problem otherwise.
Top1Dims top1_dims(const Tensor& logits, const Tensor& label);

}  // namespace mix
