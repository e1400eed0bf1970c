#pragma once
// Steps 5 and 6 of the AMP step (launch/train_program.cc), after the gradient
// all-reduce:
//  5. insert_unscale: check_finite_and_unscale for each gradient bucket, right
//     after the bucket's all-reduce completes (its c_allreduce_wait), so a
//     bucket is unscaled while later buckets still travel. Where the bucket is
//     FP16, the all-reduce pass put the bucket's casts to FP32 right after the
//     wait; they fuse into one cast_check_finite_and_unscale. Each bucket
//     raises its own local flag, and a mask of which of its gradients were not
//     finite.
//  6. append_found_inf_allreduce: one c_allreduce_found_inf of every bucket's
//     flags, so every rank takes the same decision; the mask rides along and
//     says which parameters overflowed on which ranks (the trainer's warning).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/ir/program.h"
#include "runtime/optim/optimizer.h"

namespace mix::amp {

/// Testing aid (--inject-overflow STEP[.MICRO][:RANK[:PARAM]]): at optimizer
/// step `step`, make the gradients of rank `rank` (-1: every rank)
/// non-finite, all of them or only `param`'s. Injected after each bucket's
/// all-reduce (before its unscale), so only that rank sees it locally and the
/// found_inf all-reduce must carry it, with the parameter's name and the rank.
/// With `micro_batch` (0-based) instead into that micro-batch's loss gradient,
/// before the accumulation and the all-reduce (inject_loss_gradient_overflow).
struct InjectOverflow {
  int64_t step = 0;
  int rank = -1;
  std::string param;
  int64_t micro_batch = -1;
};

/// Appends, right after the op that seeds loss@GRAD, the inject_overflow of
/// `inject` (whose micro_batch is set) on loss@GRAD: every gradient of that
/// micro-batch on that rank becomes non-finite.
void inject_loss_gradient_overflow(Program& p, const std::string& loss_grad, const InjectOverflow& inject);

/// The local overflow flags insert_unscale made, for the found_inf all-reduce.
struct LocalFoundInf {
  std::vector<std::string> flags;   // one i32 [1] per unscale op
  std::vector<std::string> each;    // per unscale op, one flag per gradient it checked
  std::vector<std::string> params;  // the parameter of each gradient, in the order of `each`
};

/// Inserts the unscale of every gradient in `param_grads` (parameter -> FP32
/// gradient), one op per all-reduced bucket, or one at the end of the program
/// when it has no gradient all-reduce (no data parallelism). Throws mix::Error
/// when a gradient is in no bucket, or `inject` names a parameter the model
/// does not have.
LocalFoundInf insert_unscale(Program& p, const optim::ParamGrads& param_grads,
                             const std::optional<InjectOverflow>& inject);

/// Appends the c_allreduce_found_inf of `local`'s flags into found_inf (and
/// its provenance mask, with room for `world_size` ranks).
void append_found_inf_allreduce(Program& p, const LocalFoundInf& local, int world_size);

}  // namespace mix::amp
