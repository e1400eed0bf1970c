#pragma once
// dropout's attribute rules and mask key, shared by its CPU kernels
// (runtime/ops/dropout.cc) and its CUDA launchers
// (runtime/ops/cuda/dropout.cu), so both devices decide the same way whether
// anything is dropped and draw the same mask bits (fn::dropout_keep) for the
// same op, step and rank.
#include <cstdint>
#include <string>

#include "runtime/core/check.h"
#include "runtime/core/hash.h"
#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"
#include "runtime/kernels/dropout_mask.h"

namespace mix::dropout_rules {

/// dropout_prob after checking it and the implementation attr.
inline float drop_prob(const OpDesc& op) {
  const std::string impl = op.attr<std::string>("dropout_implementation", "upscale_in_train");
  MIX_CHECK(impl == "upscale_in_train", op.type << ": dropout_implementation '" << impl
                                                << "' is not supported (only upscale_in_train, PyTorch's dropout)");
  const double p = op.attr<double>("dropout_prob", 0.5);
  // 1 would drop everything and scale by 1/0; a p that rounds to 1 in float too.
  MIX_CHECK(p >= 0.0 && p < 1.0 && static_cast<float>(p) < 1.f,
            op.type << ": dropout_prob " << p << " must be in [0, 1)");
  return static_cast<float>(p);
}

/// Whether this run drops anything (training, not is_test, p > 0).
inline bool active(const OpContext& ctx, float p) {
  return p > 0.f && ctx.env.training && !ctx.attr<bool>("is_test", false);
}

/// What the mask key of this dropout op on this rank is made of besides the step.
struct MaskKeyParts {
  uint64_t seed, rank, name_hash;
};
/// The micro-batch of the step (--grad-accum-steps) is folded into the seed,
/// so each micro-batch draws its own mask; micro-batch 0's keys are those of
/// a step without accumulation.
inline MaskKeyParts mask_key_parts(const OpContext& ctx) {
  const uint64_t seed = static_cast<uint64_t>(ctx.attr<int64_t>("seed", 0)) ^
                        static_cast<uint64_t>(ctx.env.micro_batch) * 0x9E3779B97F4A7C15ull;
  return {seed, static_cast<uint64_t>(ctx.env.rank), fnv1a(ctx.op.out("Out"))};
}

/// The mask key of this dropout op in step `step` on this rank:
/// fn::dropout_key(attr seed, step, ExecEnv::rank, fnv1a(Out's name)).
inline uint64_t mask_key(const OpContext& ctx, int64_t step) {
  const MaskKeyParts k = mask_key_parts(ctx);
  return fn::dropout_key(k.seed, static_cast<uint64_t>(step), k.rank, k.name_hash);
}

/// dropout_grad's Mask: u8 of Out@GRAD's shape.
inline void check_grad_inputs(const Tensor& mask, const Tensor& dout) {
  MIX_CHECK(mask.dtype() == DType::u8 && mask.shape() == dout.shape(),
            "dropout_grad: Mask " << dtype_name(mask.dtype()) << shape_str(mask.shape())
                                  << " must be u8 of Out@GRAD's shape " << shape_str(dout.shape()));
}

}  // namespace mix::dropout_rules
