#pragma once
// The data-parallel pass: inserts the gradient all-reduces after backward.
//
// With GradReduce::fp16 (the default under AMP), a parameter whose gradient is
// produced by the cast of an FP16 gradient (`fc1.weight.cast_fp16@GRAD` ->
// `fc1.weight@GRAD`) has the FP16 gradient all-reduced and the cast moved after
// the all-reduce: half the bytes on the wire. With GradReduce::fp32 the cast
// stays where backward put it and the FP32 gradient is all-reduced. Gradients
// that are FP32 to begin with are all-reduced in FP32 buckets either way.
#include <cstddef>

#include "runtime/optim/optimizer.h"
#include "runtime/program.h"

namespace mix::collective {

enum class GradReduce { fp16, fp32 };

struct GradSyncOptions {
  GradReduce mode = GradReduce::fp16;
  int world_size = 1;
  /// Multiply by 1/F before the sum and F/world after it; 0 means F = world
  /// (all the division before the sum).
  double predivide = 0;
  /// Largest bucket in bytes (DDP's default 25 MB); a larger gradient gets a bucket of its own.
  size_t bucket_bytes = 25u << 20;
};

/// A bucket: gradient variables of one dtype, reduced by one c_allreduce_sum.
struct GradBucket {
  DType dtype;
  std::vector<std::string> vars;
  size_t bytes = 0;
};

/// Inserts the all-reduces; returns the (parameter, FP32 gradient) pairs the update reads.
optim::ParamGrads insert_grad_allreduce(Program& p, const optim::ParamGrads& grads, const GradSyncOptions& o,
                                        std::vector<GradBucket>* buckets_out = nullptr);

/// The pass as Optimizer::minimize takes it.
optim::GradSyncPass grad_allreduce_pass(GradSyncOptions o);

}  // namespace mix::collective
