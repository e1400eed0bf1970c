#pragma once
// CPU loops that run MIX_HD functors over tensors of any floating dtype,
// converting to float on load and rounding to the storage type on store.
#include <cstdint>

#include "runtime/check.h"
#include "runtime/tensor.h"

namespace mix::cpu {

/// Calls f(T{}) with T the C++ storage type of a floating dtype.
template <typename F>
void dispatch_floating(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f16: f(half_t{}); return;
    case DType::bf16: f(bf16_t{}); return;
    default: MIX_FAIL("expected a floating dtype, got " << dtype_name(t));
  }
}

/// out[i] = op(x[i]) for T in/out of the same dtype.
template <typename T, typename Op>
void unary(const T* x, T* out, int64_t n, Op op) {
  for (int64_t i = 0; i < n; ++i) out[i] = from_float<T>(op(to_float(x[i])));
}

/// out[i] = op(a[i], b[i]).
template <typename T, typename Op>
void binary(const T* a, const T* b, T* out, int64_t n, Op op) {
  for (int64_t i = 0; i < n; ++i) out[i] = from_float<T>(op(to_float(a[i]), to_float(b[i])));
}

/// Runs a unary functor on any floating tensor: out has x's shape and dtype.
template <typename Op>
void unary_tensor(const Tensor& x, Tensor& out, Op op) {
  MIX_CHECK(x.dtype() == out.dtype() && x.numel() == out.numel(), "unary op: mismatched input and output");
  dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    unary(x.data<T>(), out.data<T>(), x.numel(), op);
  });
}

/// out = op(a, b) elementwise, all of one dtype and size.
template <typename Op>
void binary_tensor(const Tensor& a, const Tensor& b, Tensor& out, Op op) {
  MIX_CHECK(a.dtype() == b.dtype() && a.numel() == b.numel(), "binary op: mismatched inputs");
  dispatch_floating(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    binary(a.data<T>(), b.data<T>(), out.data<T>(), a.numel(), op);
  });
}

}  // namespace mix::cpu
