#pragma once
// Paddle's elementwise broadcasting (elementwise_add, elementwise_mul):
// Y's shape equals X's dims [axis, axis + Y.ndim), with axis = -1 meaning
// X.ndim - Y.ndim (Y aligned to X's trailing dims). Size-1 dims at either end
// of Y broadcast too: trailing ones as in Paddle (Y [C, 1] with axis 1 against
// X [B, C, H, W]), leading ones as in PyTorch (a bias [1, C] against [B, C]),
// and a Y of all ones is a scalar.
//
// X then factors as [pre, n, post] with Y = [n]: X's element (p, j, q) meets
// Y's element j. Every kernel loops over that triple; a CUDA kernel indexes
// with the same three numbers (j = (i / post) % n).
#include <cstdint>
#include <string>

#include <algorithm>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/tensor.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"

namespace mix {

struct BroadcastDims {
  int64_t pre = 1, n = 1, post = 1;
  bool same_shape() const { return pre == 1 && post == 1; }
};

/// Y placed in X: its core dims (Y without leading and trailing 1s, which
/// broadcast trivially) equal X's dims [axis, axis + core.size()).
struct Alignment {
  int axis = 0;
  Shape core;
};

inline Alignment align(const Shape& x, const Shape& y, int axis, const std::string& op) {
  MIX_CHECK(y.size() <= x.size(), op << ": Y " << shape_str(y) << " has more dims than X " << shape_str(x));
  MIX_CHECK(axis >= -1, op << ": axis " << axis << " is invalid (-1 aligns Y with X's last dims)");
  const int xn = static_cast<int>(x.size());
  const int a = axis < 0 ? xn - static_cast<int>(y.size()) : axis;
  size_t lo = 0, hi = y.size();
  while (hi > lo && y[hi - 1] == 1) --hi;
  while (lo < hi && y[lo] == 1) ++lo;
  Alignment r{a + static_cast<int>(lo), Shape(y.begin() + static_cast<std::ptrdiff_t>(lo),
                                              y.begin() + static_cast<std::ptrdiff_t>(hi))};
  MIX_CHECK(a <= xn && r.axis + static_cast<int>(r.core.size()) <= xn,
            op << ": axis " << axis << " does not place Y " << shape_str(y) << " inside X " << shape_str(x)
               << " (need 0 <= axis <= X.ndim - Y.ndim)");
  return r;
}

/// Checks Y against X at build time; a -1 (batch) in either shape matches any size.
inline void check_broadcast_desc(const Shape& x, const Shape& y, int axis, const std::string& op) {
  const Alignment al = align(x, y, axis, op);
  for (size_t i = 0; i < al.core.size(); ++i) {
    const int64_t xd = x[al.axis + i], yd = al.core[i];
    MIX_CHECK(xd < 0 || yd < 0 || xd == yd, op << ": Y " << shape_str(y) << " does not match X " << shape_str(x)
                                                << " (X dim " << al.axis + i << " is " << xd << " where Y has " << yd
                                                << "; attr axis " << axis << ")");
  }
}

/// Y's run-time shape from its declared one, where X has its run-time shape:
/// each -1 (the batch) in Y takes the size of the X dim it is aligned with.
/// (Every -1 of a program is the same batch size, so an aligned -1 in X holds it.)
inline Shape resolve_batch_dims(const Shape& x, Shape y, int axis, const std::string& op) {
  MIX_CHECK(y.size() <= x.size(), op << ": Y " << shape_str(y) << " has more dims than X " << shape_str(x));
  const size_t a = axis < 0 ? x.size() - y.size() : static_cast<size_t>(axis);
  MIX_CHECK(a + y.size() <= x.size(), op << ": axis " << axis << " does not place Y " << shape_str(y) << " inside X "
                                         << shape_str(x) << " (need 0 <= axis <= X.ndim - Y.ndim)");
  for (size_t i = 0; i < y.size(); ++i)
    if (y[i] < 0) y[i] = x[a + i];
  return y;
}

/// The [pre, n, post] factorisation of X for a Y of concrete shape.
inline BroadcastDims broadcast_dims(const Shape& x, const Shape& y, int axis, const std::string& op) {
  check_broadcast_desc(x, y, axis, op);
  const Alignment al = align(x, y, axis, op);
  BroadcastDims d;
  const int end = al.axis + static_cast<int>(al.core.size());
  for (int i = 0; i < static_cast<int>(x.size()); ++i) (i < al.axis ? d.pre : i < end ? d.n : d.post) *= x[i];
  MIX_CHECK(d.n == shape_numel(y), op << ": Y " << shape_str(y) << " does not match X " << shape_str(x));
  return d;
}

/// out[p, j, q] = f(x[p, j, q], y[j]) in float, rounded to T on store.
/// out[p, j, q] = f(x[p, j, q], y[j]) over X viewed as [pre, n, post]. FP16/BF16
/// rows are widened and narrowed in chunks (cpu_loops.h); out may alias x.
template <typename T, typename F>
void broadcast_binary(const T* x, const T* y, T* out, const BroadcastDims& d, F f) {
  std::vector<float> yf(static_cast<size_t>(d.n));
  cpu::load_floats(y, yf.data(), d.n);
  const int64_t row = d.n * d.post;
  float buf[cpu::kChunk];
  for (int64_t p = 0; p < d.pre; ++p) {
    const T* xr = x + p * row;
    T* outr = out + p * row;
    for (int64_t s = 0; s < row; s += cpu::kChunk) {
      const int64_t m = std::min(cpu::kChunk, row - s);
      cpu::load_floats(xr + s, buf, m);
      if (d.post == 1) {
        for (int64_t k = 0; k < m; ++k) buf[k] = f(buf[k], yf[static_cast<size_t>(s + k)]);
      } else {
        for (int64_t k = 0; k < m; ++k) buf[k] = f(buf[k], yf[static_cast<size_t>((s + k) / d.post)]);
      }
      cpu::store_floats(buf, outr + s, m);
    }
  }
}

/// acc[j] = sum over p, q of f(a[p, j, q], b[p, j, q]) in FP32 (b may be null: f(a, 0)).
template <typename T, typename F>
void broadcast_reduce(const T* a, const T* b, float* acc, const BroadcastDims& d, F f) {
  for (int64_t j = 0; j < d.n; ++j) acc[j] = 0.f;
  const int64_t row = d.n * d.post;
  float fa[cpu::kChunk], fb[cpu::kChunk];
  for (int64_t p = 0; p < d.pre; ++p) {
    for (int64_t s = 0; s < row; s += cpu::kChunk) {
      const int64_t m = std::min(cpu::kChunk, row - s);
      cpu::load_floats(a + p * row + s, fa, m);
      if (b) {
        cpu::load_floats(b + p * row + s, fb, m);
      } else {
        std::fill(fb, fb + m, 0.f);
      }
      if (d.post == 1) {
        for (int64_t k = 0; k < m; ++k) acc[s + k] += f(fa[k], fb[k]);
      } else {
        for (int64_t k = 0; k < m; ++k) acc[(s + k) / d.post] += f(fa[k], fb[k]);
      }
    }
  }
}

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
