#pragma once
// Paddle's elementwise broadcasting (elementwise_add, elementwise_mul):
// Y's shape equals X's dims [axis, axis + Y.ndim), with axis = -1 meaning
// X.ndim - Y.ndim (Y aligned to X's trailing dims). Trailing size-1 dims of Y
// are dropped first, as Paddle does (Y [out, 1] against X [B, out, 1] or
// X [B, out, H, W] with axis 1 both work).
//
// X then factors as [pre, n, post] with Y = [n]: X's element (p, j, q) meets
// Y's element j. Every kernel loops over that triple; a CUDA kernel indexes
// with the same three numbers (j = (i / post) % n).
#include <cstdint>
#include <string>

#include "runtime/check.h"
#include "runtime/op_registry.h"
#include "runtime/tensor.h"

namespace mix {

struct BroadcastDims {
  int64_t pre = 1, n = 1, post = 1;
  bool same_shape() const { return pre == 1 && post == 1; }
};

namespace broadcast_detail {
/// Y's dims without trailing 1s (a Y of all 1s keeps one dim).
inline Shape trim_trailing_ones(const Shape& y) {
  Shape t = y;
  while (t.size() > 1 && t.back() == 1) t.pop_back();
  return t;
}

/// The axis Y starts at in X, after checking ranks. `op` names the op in messages.
inline int resolve_axis(const Shape& x, const Shape& y_trimmed, const Shape& y, int axis, const std::string& op) {
  const int xn = static_cast<int>(x.size());
  MIX_CHECK(y.size() <= x.size(), op << ": Y " << shape_str(y) << " has more dims than X " << shape_str(x));
  const int a = axis < 0 ? xn - static_cast<int>(y.size()) : axis;
  MIX_CHECK(a >= 0 && a + static_cast<int>(y_trimmed.size()) <= xn,
            op << ": axis " << axis << " does not place Y " << shape_str(y) << " inside X " << shape_str(x)
               << " (need 0 <= axis <= X.ndim - Y.ndim)");
  return a;
}
}  // namespace broadcast_detail

/// Checks Y against X at build time; a -1 (batch) in either shape matches any size.
inline void check_broadcast_desc(const Shape& x, const Shape& y, int axis, const std::string& op) {
  const Shape yt = broadcast_detail::trim_trailing_ones(y);
  const int a = broadcast_detail::resolve_axis(x, yt, y, axis, op);
  for (size_t i = 0; i < yt.size(); ++i) {
    const int64_t xd = x[a + i], yd = yt[i];
    MIX_CHECK(xd < 0 || yd < 0 || xd == yd, op << ": Y " << shape_str(y) << " does not match X " << shape_str(x)
                                                << " at axis " << a << " (X dim " << a + i << " is " << xd
                                                << ", Y dim " << i << " is " << yd << ")");
  }
}

/// The [pre, n, post] factorisation of X for a Y of concrete shape.
inline BroadcastDims broadcast_dims(const Shape& x, const Shape& y, int axis, const std::string& op) {
  check_broadcast_desc(x, y, axis, op);
  const Shape yt = broadcast_detail::trim_trailing_ones(y);
  const int a = broadcast_detail::resolve_axis(x, yt, y, axis, op);
  BroadcastDims d;
  for (int i = 0; i < static_cast<int>(x.size()); ++i) {
    if (i < a)
      d.pre *= x[i];
    else if (i < a + static_cast<int>(yt.size()))
      d.n *= x[i];
    else
      d.post *= x[i];
  }
  MIX_CHECK(d.n == shape_numel(y), op << ": Y " << shape_str(y) << " does not match X " << shape_str(x));
  return d;
}

/// out[p, j, q] = f(x[p, j, q], y[j]) in float, rounded to T on store.
template <typename T, typename F>
void broadcast_binary(const T* x, const T* y, T* out, const BroadcastDims& d, F f) {
  for (int64_t p = 0; p < d.pre; ++p)
    for (int64_t j = 0; j < d.n; ++j) {
      const float yj = to_float(y[j]);
      const int64_t base = (p * d.n + j) * d.post;
      for (int64_t q = 0; q < d.post; ++q) out[base + q] = from_float<T>(f(to_float(x[base + q]), yj));
    }
}

/// acc[j] = sum over (p, q) of f(a[p, j, q], b[p, j, q]) in FP32 (b may be null:
/// f then gets 0 for it). The caller rounds acc once on store.
template <typename T, typename F>
void broadcast_reduce(const T* a, const T* b, float* acc, const BroadcastDims& d, F f) {
  for (int64_t j = 0; j < d.n; ++j) acc[j] = 0.f;
  for (int64_t p = 0; p < d.pre; ++p)
    for (int64_t j = 0; j < d.n; ++j) {
      const int64_t base = (p * d.n + j) * d.post;
      float s = 0.f;
      for (int64_t q = 0; q < d.post; ++q) s += f(to_float(a[base + q]), b ? to_float(b[base + q]) : 0.f);
      acc[j] += s;
    }
}

/// Infer of elementwise_add / elementwise_mul: Out has X's shape and dtype.
inline void infer_elementwise(Program& p, OpDesc& op) {
  const VarDesc& x = p.var(op.in("X"));
  const VarDesc& y = p.var(op.in("Y"));
  MIX_CHECK(x.dtype == y.dtype, op.type << ": X " << x.name << " is " << dtype_name(x.dtype) << " but Y " << y.name
                                        << " is " << dtype_name(y.dtype) << " (amp::rewrite inserts casts)");
  check_broadcast_desc(x.shape, y.shape, op.attr<int>("axis", -1), op.type);
  declare_var(p, op.out("Out"), x.shape, x.dtype);
}

/// The runtime dtype check every elementwise kernel makes.
inline void check_same_dtype(const Tensor& x, const Tensor& y, const std::string& op) {
  MIX_CHECK(x.dtype() == y.dtype(),
            op << ": X is " << dtype_name(x.dtype()) << " but Y is " << dtype_name(y.dtype()));
}

}  // namespace mix
