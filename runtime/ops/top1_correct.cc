// top1_correct: Correct i64[1] = how many rows of Logits [..., K] have their
// largest value at the index their Label holds (Label [...] or [..., 1], i64
// or i32; one class index per row). Evaluation's accuracy is Correct over the
// number of rows. The argmax is fn::argmax_key's (runtime/kernels/argmax_key.h):
// the first index among equal maxima; a row whose maximum is NaN is never
// correct; a label outside [0, K) (an ignored row) never matches.
//
// Evaluation only, no gradient. The trainer runs it where the logits are, so
// that a GPU hands back one integer per batch instead of the whole logits.
#include <string>

#include "runtime/check.h"
#include "runtime/kernels/argmax_key.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/op_registry.h"
#include "runtime/ops/top1_correct.h"

namespace mix {

Top1Dims top1_dims(const Tensor& logits, const Tensor& label) {
  MIX_CHECK(logits.ndim() >= 1 && is_floating(logits.dtype()),
            "top1_correct: Logits is " << dtype_name(logits.dtype()) << shape_str(logits.shape())
                                       << ", expected a float tensor [..., classes]");
  MIX_CHECK(label.dtype() == DType::i64 || label.dtype() == DType::i32,
            "top1_correct: Label is " << dtype_name(label.dtype()) << ", expected i64 or i32 class indices");
  const int64_t classes = logits.dim(-1);
  MIX_CHECK(classes > 0 && classes <= fn::kArgmaxMaxClasses,
            "top1_correct: Logits has " << classes << " classes, expected 1 to " << fn::kArgmaxMaxClasses);
  const int64_t rows = logits.numel() / classes;
  MIX_CHECK(label.numel() == rows, "top1_correct: Label " << shape_str(label.shape()) << " holds " << label.numel()
                                                          << " values for the " << rows << " rows of Logits "
                                                          << shape_str(logits.shape()));
  return {rows, classes};
}

namespace {

void infer_top1_correct(Program& p, OpDesc& op) {
  const VarDesc& logits = p.var(op.in("Logits"));
  const VarDesc& label = p.var(op.in("Label"));
  MIX_CHECK(is_floating(logits.dtype) && !logits.shape.empty(),
            "top1_correct: Logits " << logits.name << " is " << dtype_name(logits.dtype) << shape_str(logits.shape)
                                    << ", expected a float tensor [..., classes]");
  MIX_CHECK(label.dtype == DType::i64 || label.dtype == DType::i32,
            "top1_correct: Label " << label.name << " is " << dtype_name(label.dtype) << ", expected i64 or i32");
  declare_var(p, op.out("Correct"), {1}, DType::i64);
}

template <typename L>
int64_t label_at(const Tensor& label, int64_t row) {
  return static_cast<int64_t>(label.data<L>()[row]);
}

void top1_correct_cpu(OpContext& ctx) {
  const Tensor& logits = ctx.in("Logits");
  const Tensor& label = ctx.in("Label");
  const Top1Dims d = top1_dims(logits, label);
  int64_t correct = 0;
  cpu::dispatch_floating(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = logits.data<T>();
    for (int64_t r = 0; r < d.rows; ++r) {
      uint64_t best = 0;  // below every key: value_rank(-inf) > 0
      for (int64_t j = 0; j < d.classes; ++j) {
        const uint64_t key = fn::argmax_key(to_float(x[r * d.classes + j]), j);
        if (key > best) best = key;
      }
      const int64_t want = label.dtype() == DType::i64 ? label_at<int64_t>(label, r) : label_at<int32_t>(label, r);
      correct += fn::argmax_hits(best, want);
    }
  });
  ctx.out("Correct", {1}, DType::i64).data<int64_t>()[0] = correct;
}

MIX_REGISTER_OP("top1_correct", OpInfo{infer_top1_correct, top1_correct_cpu, {}, {}});

}  // namespace
}  // namespace mix
