#pragma once
// amp::rewrite: decides each forward op's precision from the lists and inserts
// `cast` ops so that every op reads inputs of the dtype it runs in.
//
// Rules (docs/design.md, "Precision rules"): white ops run in FP16; black ops and unlisted ops in FP32;
// a gray op runs in FP32 if any input comes from a black op (or an unlisted op,
// as Paddle treats one, or a gray op that went black), else in FP16 if any
// input comes from a white op (or a gray op that went white), else in the
// dtype of its inputs. batch_norm and layer_norm keep scale, bias and
// statistics in FP32. Each variable is cast at most once per dtype, so an FP32
// master weight is cast to FP16 once per step.
#include <map>
#include <string>

#include "amp/lists.h"
#include "runtime/core/dtype.h"
#include "runtime/ir/program.h"

namespace mix::amp {

struct RewriteResult {
  /// Forward op index (after the rewrite) -> the dtype it runs in.
  std::map<size_t, DType> op_dtype;
  int casts_inserted = 0;
};

/// The name of the cast of `var` to `dtype`: "fc1.weight.cast_fp16".
std::string cast_var_name(const std::string& var, DType dtype);

RewriteResult rewrite(Program& p, const AmpLists& lists, DType low = DType::f16);

}  // namespace mix::amp
