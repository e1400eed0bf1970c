// softmax_with_cross_entropy (hard labels): Logits [..., C] of any float dtype,
// Label i64 (or i32) [..., 1] or [...]; outputs Softmax [..., C] and Loss
// [..., 1], both in Logits' dtype (FP32 under AMP: the op is on the black list,
// so amp::rewrite feeds it FP32 logits). Per row, in FP32:
//   loss = log(sum exp(x - max)) + max - x[label]   (runtime/kernels/softmax_row.h)
// Rows whose label equals attr ignore_index (default -100, as in PyTorch) get
// loss 0 and gradient 0. Any other label outside [0, C) is an error naming the
// row, the value and C.
// Grad (softmax_with_cross_entropy_grad): Logits@GRAD = (Softmax - onehot) *
// Loss@GRAD[row], from the saved Softmax. A gradient arriving at the Softmax
// output is ignored, as in Paddle: Softmax is a by-product for the grad and
// for metrics, not a differentiable output.
#include <cstdint>

#include "runtime/check.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/softmax_row.h"
#include "runtime/op_registry.h"
#include "runtime/ops/cross_entropy_shapes.h"

namespace mix {
namespace {

using xent::check_attrs;
using xent::check_label_shape;
using xent::Dims;
using xent::dims_of;
using xent::kOp;
using xent::loss_shape_of;



void infer_swce(Program& p, OpDesc& op) {
  const VarDesc& logits = p.var(op.in("Logits"));
  const VarDesc& label = p.var(op.in("Label"));
  MIX_CHECK(logits.shape.size() >= 1, kOp << ": Logits must have at least one dim");
  MIX_CHECK(is_floating(logits.dtype), kOp << ": Logits " << logits.name << " is " << dtype_name(logits.dtype)
                                            << ", expected a float dtype");
  MIX_CHECK(label.dtype == DType::i64 || label.dtype == DType::i32,
            kOp << ": Label " << label.name << " is " << dtype_name(label.dtype) << ", expected i64 class indices");
  check_attrs(op, logits.shape.size());
  check_label_shape(logits.shape, label.shape);
  Shape loss_shape(logits.shape.begin(), logits.shape.end() - 1);
  loss_shape.push_back(1);
  declare_var(p, op.out("Softmax"), logits.shape, logits.dtype);
  declare_var(p, op.out("Loss"), loss_shape, logits.dtype);
}

int64_t label_at(const Tensor& label, int64_t i) {
  return label.dtype() == DType::i64 ? label.data<int64_t>()[i] : label.data<int32_t>()[i];
}

/// The row's label, or -1 for an ignored row; throws for a label outside [0, C).
int64_t checked_label(const Tensor& label, int64_t row, int64_t classes, int64_t ignore_index) {
  const int64_t l = label_at(label, row);
  if (l == ignore_index) return -1;
  MIX_CHECK(l >= 0 && l < classes, kOp << ": label " << l << " at row " << row << " is out of range for " << classes
                                        << " classes (expected 0 <= label < " << classes << ", or ignore_index "
                                        << ignore_index << ")");
  return l;
}




void swce_cpu(OpContext& ctx) {
  const Tensor& logits = ctx.in("Logits");
  const Tensor& label = ctx.in("Label");
  check_attrs(ctx.op, logits.shape().size());
  const Dims d = dims_of(logits, label);
  const int64_t ignore = ctx.attr<int64_t>("ignore_index", -100);
  // Validate every label before writing anything, so an error leaves no half-written outputs.
  for (int64_t i = 0; i < d.rows; ++i) checked_label(label, i, d.classes, ignore);
  Tensor& softmax = ctx.out("Softmax", logits.shape(), logits.dtype());
  Tensor& loss = ctx.out("Loss", loss_shape_of(logits.shape()), logits.dtype());
  cpu::dispatch_floating(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = logits.data<T>();
    T* y = softmax.data<T>();
    T* l = loss.data<T>();
    for (int64_t i = 0; i < d.rows; ++i) {
      const int64_t lab = checked_label(label, i, d.classes, ignore);
      const T* xr = x + i * d.classes;
      T* yr = y + i * d.classes;
      if (lab < 0) {
        fn::softmax_row(xr, yr, d.classes);
        l[i] = from_float<T>(0.f);
      } else {
        l[i] = from_float<T>(fn::softmax_cross_entropy_row(xr, yr, d.classes, lab));
      }
    }
  });
}

void swce_grad_cpu(OpContext& ctx) {
  const Tensor& softmax = ctx.in("Softmax");
  const Tensor& label = ctx.in("Label");
  const Tensor& dloss = ctx.in("Loss@GRAD");
  const Dims d = dims_of(softmax, label);
  MIX_CHECK(dloss.numel() == d.rows, kOp << "_grad: Loss@GRAD " << shape_str(dloss.shape()) << " does not hold one value per row ("
                                         << d.rows << " rows)");
  const int64_t ignore = ctx.attr<int64_t>("ignore_index", -100);
  Tensor& dx = ctx.out("Logits@GRAD", softmax.shape(), softmax.dtype());
  cpu::dispatch_floating(softmax.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* y = softmax.data<T>();
    T* g = dx.data<T>();
    for (int64_t i = 0; i < d.rows; ++i) {
      const int64_t lab = checked_label(label, i, d.classes, ignore);
      T* gr = g + i * d.classes;
      if (lab < 0) {
        for (int64_t k = 0; k < d.classes; ++k) gr[k] = from_float<T>(0.f);
      } else {
        fn::softmax_cross_entropy_grad_row(y + i * d.classes, gr, d.classes, lab, dloss.item_float(i));
      }
    }
  });
}

std::vector<OpDesc> swce_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dloss = g.grad_of_output(fwd.out("Loss"));
  if (dloss.empty()) return {};  // only Softmax carries a gradient: ignored (see the header)
  const std::string dx = g.grad_for_input(fwd.in("Logits"));
  if (dx.empty()) return {};
  return {make_op("softmax_with_cross_entropy_grad",
                  {{"Softmax", {fwd.out("Softmax")}}, {"Label", {fwd.in("Label")}}, {"Loss@GRAD", {dloss}}},
                  {{"Logits@GRAD", {dx}}}, fwd.attrs)};
}

MIX_REGISTER_OP("softmax_with_cross_entropy", OpInfo{infer_swce, swce_cpu, {}, swce_grad_maker});
MIX_REGISTER_OP("softmax_with_cross_entropy_grad", OpInfo{{}, swce_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
