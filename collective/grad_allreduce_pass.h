#pragma once
// The data-parallel pass, step 4 of the AMP step (launch/train_program.cc):
// inserts the gradient all-reduces, bucketed.
//
// Gradients are packed into buckets of at most `bucket_bytes`, one dtype per
// bucket, in the order backward finishes them. With overlap (the default) each
// bucket's c_allreduce_start sits right after the op that writes its last
// gradient, so its bytes travel while backward goes on, and its
// c_allreduce_wait comes after backward, in start order; the unscale pass
// (amp/unscale_pass.h) then puts the bucket's unscale right after its wait. Without overlap every
// start comes after backward, each right before its wait (the order before
// overlap existed, through the same collective calls, so results are equal).
//
// With GradReduce::fp16 (the default under AMP), a parameter whose gradient is
// produced by the cast of an FP16 gradient (`fc1.weight.cast_fp16@GRAD` ->
// `fc1.weight@GRAD`) has the FP16 gradient all-reduced and the cast moved after
// the all-reduce: half the bytes on the wire; GradReduce::bf16 does the same
// with BF16 gradients (--precision bf16). With GradReduce::fp32 the cast
// stays where backward put it and the FP32 gradient is all-reduced. Gradients
// that are FP32 to begin with are all-reduced in FP32 buckets either way.
#include <cstddef>
#include <string>

#include "runtime/core/enum_names.h"
#include "runtime/ir/program.h"
#include "runtime/optim/optimizer.h"

namespace mix::collective {

/// The dtype the gradients travel in: the mixed precision's low dtype (the
/// white ops' gradients, cast to FP32 after the all-reduce) or FP32.
enum class GradReduce { fp16, fp32, bf16 };

inline constexpr NamedValue<GradReduce> kGradReduceNames[] = {
    {GradReduce::fp16, "fp16"}, {GradReduce::fp32, "fp32"}, {GradReduce::bf16, "bf16"}};

inline std::string_view to_string(GradReduce r) { return name_of(r, kGradReduceNames); }

/// How the gradients travel; what dtype they travel in is a precision
/// decision (GradReduce), given beside these.
struct GradSyncOptions {
  int world_size = 1;
  /// Multiply by 1/F before the sum and F/world after it; 0 means F = world
  /// (all the division before the sum).
  double predivide = 0;
  /// Largest bucket in bytes (DDP's default 25 MB); a larger gradient gets a bucket of its own.
  size_t bucket_bytes = 25u << 20;
  /// Start each bucket's all-reduce as soon as backward has written it (--no-overlap: false).
  bool overlap = true;
};

/// A bucket: gradient variables of one dtype, reduced by one c_allreduce_sum.
struct GradBucket {
  DType dtype;
  std::vector<std::string> vars;
  size_t bytes = 0;
  std::string buffer;  ///< the packed bucket (c_allreduce_start's Buffer)
};

/// Inserts the all-reduces of `grads` in `mode`'s dtype; `buckets_out` gets
/// the buckets in start order. Returns the (parameter, FP32 gradient) pairs
/// the update reads.
optim::ParamGrads insert_grad_allreduce(Program& p, const optim::ParamGrads& grads, GradReduce mode,
                                        const GradSyncOptions& o, std::vector<GradBucket>* buckets_out = nullptr);

/// A summary of a program's gradient sync for --print-program: per bucket, its
/// dtype, size and gradients, the op after which its all-reduce starts, the op
/// that waits for it, and the ops of backward still to run while it travels.
std::string describe_grad_sync(const Program& p);

}  // namespace mix::collective
