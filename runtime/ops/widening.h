#pragma once
// FP32 outputs from FP16/BF16 inputs, for ops that widen every value on load
// and compute in FP32 anyway: softmax and softmax_with_cross_entropy (the
// AMP black list's row ops). With attr out_dtype = "f32" such an op reads an
// FP16 (or BF16) input directly and stores FP32 outputs, which is exactly
// what a cast to FP32 followed by the FP32 op computes, since widening is
// exact, but with no FP32 copy of the input written and read back.
// amp::fold_widening_casts sets the attribute where amp::rewrite put such a cast.
//
// The op's gradient then writes the input's gradient in the input's dtype
// (attr x_grad_dtype, set by the grad maker from the forward program): the FP32
// result rounded once on store, as the gradient of the cast (a cast back) would
// round it (amp::fold_widening_casts folds only a cast with one reader, whose
// gradient is that reader's alone).
//
// softmax_grad may also read Out@GRAD narrower than Out: an FP16 gradient of
// an FP32 softmax output that only an FP16 cast read (attention's
// probabilities before their matmul); amp::fold_widening_grad_casts removes
// the cast that widened that gradient. Shared by the CPU kernels and their
// CUDA twins.
#include <map>
#include <string>
#include <type_traits>

#include "runtime/core/check.h"
#include "runtime/core/dtype.h"
#include "runtime/core/half.h"
#include "runtime/ir/program.h"
#include "runtime/kernels/cpu_loops.h"

namespace mix::widening {

/// The pairs an op may read and store: the same dtype, or FP16/BF16 read and FP32 stored.
inline bool allowed(DType narrow, DType wide) {
  return narrow == wide || (wide == DType::f32 && (narrow == DType::f16 || narrow == DType::bf16));
}

/// The dtype the op stores its outputs in when its input is `in`: attr
/// out_dtype, or `in` itself when the attribute is absent.
inline DType out_dtype(const OpDesc& op, DType in) {
  if (!op.has_attr("out_dtype")) return in;
  const DType out = parse_dtype(op.attr<std::string>("out_dtype", ""));
  MIX_CHECK(allowed(in, out), op.type << ": out_dtype " << dtype_name(out) << " with a " << dtype_name(in)
                                      << " input is not supported (out_dtype is the input's dtype, or f32 for an "
                                         "f16/bf16 input)");
  return out;
}

/// The dtype a gradient op writes its input gradient in when the forward
/// output (and its gradient) is `out`: attr x_grad_dtype, or `out`.
inline DType x_grad_dtype(const OpDesc& grad_op, DType out) {
  if (!grad_op.has_attr("x_grad_dtype")) return out;
  const DType dx = parse_dtype(grad_op.attr<std::string>("x_grad_dtype", ""));
  MIX_CHECK(allowed(dx, out), grad_op.type << ": x_grad_dtype " << dtype_name(dx) << " with " << dtype_name(out)
                                           << " outputs is not supported (f16/bf16 gradients of f32 outputs only)");
  return dx;
}

/// A gradient op's attributes: the forward op's, with x_grad_dtype added when
/// the forward input `x` and output `out` differ in dtype (out_dtype = "f32").
inline std::map<std::string, Attr> grad_attrs(const OpDesc& fwd, const Program& p, const std::string& x,
                                              const std::string& out) {
  std::map<std::string, Attr> attrs = fwd.attrs;
  attrs.erase("out_dtype");
  const DType x_dtype = p.var(x).dtype;
  if (x_dtype != p.var(out).dtype) attrs["x_grad_dtype"] = std::string(dtype_name(x_dtype));
  return attrs;
}

/// f(Narrow{}, Wide{}) with the C++ storage types of a pair `allowed` accepts:
/// (T, T) for any floating T, or (half_t or bf16_t, float).
template <typename F>
void dispatch(DType narrow, DType wide, F&& f) {
  MIX_CHECK(allowed(narrow, wide), "expected equal floating dtypes or f16/bf16 with f32, got "
                                       << dtype_name(narrow) << " and " << dtype_name(wide));
  if (narrow == wide) return cpu::dispatch_floating(narrow, [&](auto tag) { f(tag, tag); });
  if (narrow == DType::f16) return f(half_t{}, float{});
  f(bf16_t{}, float{});
}

/// f(DY{}) for a gradient input of dtype `dy` beside an output of dtype `y`
/// whose C++ type is Y: Y itself when the dtypes match, else (Y float)
/// half_t or bf16_t, the only narrower gradients `allowed` accepts.
template <typename Y, typename F>
void dispatch_grad_input(DType dy, DType y, F&& f) {
  MIX_CHECK(allowed(dy, y), "a gradient of dtype " << dtype_name(dy) << " for an output of dtype " << dtype_name(y)
                                                   << " (expected the same dtype, or f16/bf16 for f32)");
  if (dy == y) return f(Y{});
  if constexpr (std::is_same_v<Y, float>) {
    if (dy == DType::f16) return f(half_t{});
    f(bf16_t{});
  }
}

}  // namespace mix::widening
