#pragma once
// Shape rules of the GEMM ops, shared by their CPU and CUDA kernels. Build-time
// shapes may hold -1 (the batch dimension), which matches anything.
#include <cstdint>

#include "runtime/core/check.h"
#include "runtime/core/tensor.h"

namespace mix {

/// mul's shape rule: X flattened after x_num_col_dims to [rows, in]; Y is [out, in].
struct MulDims {
  int64_t rows, in, out;
};

inline MulDims mul_dims(const Shape& x, const Shape& y, int x_num_col_dims) {
  MIX_CHECK(y.size() == 2, "mul: weight must be 2-D [out, in], got " << shape_str(y));
  MIX_CHECK(x_num_col_dims >= 1 && x_num_col_dims <= static_cast<int>(x.size()),
            "mul: x_num_col_dims = " << x_num_col_dims << " for input " << shape_str(x));
  int64_t rows = 1, in = 1;
  for (int i = 0; i < static_cast<int>(x.size()); ++i) (i < x_num_col_dims ? rows : in) *= x[i];
  MIX_CHECK(in == y[1] || in < 0, "mul: input " << shape_str(x) << " has " << in << " features, weight "
                                                << shape_str(y) << " expects " << y[1]);
  return {rows, in, y[0]};
}

struct MatmulDims {
  Shape batch;           // X's leading dims
  int64_t count = 1;     // product of the batch dims
  int64_t m = 0, k = 0, n = 0;
  bool y_shared = false; // Y is 2-D: one matrix for every batch entry
  Shape out() const {
    Shape s = batch;
    s.push_back(m);
    s.push_back(n);
    return s;
  }
};

// Build-time shapes may hold -1 (the batch): it matches anything there.
inline MatmulDims matmul_dims(const Shape& x, const Shape& y, bool tx, bool ty) {
  MIX_CHECK(x.size() >= 2 && y.size() >= 2,
            "matmul: X " << shape_str(x) << " and Y " << shape_str(y) << " must both have at least 2 dims");
  MatmulDims d;
  const size_t xb = x.size() - 2, yb = y.size() - 2;
  d.batch.assign(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(xb));
  d.y_shared = yb == 0;
  if (!d.y_shared) {
    bool same = xb == yb;
    for (size_t i = 0; same && i < xb; ++i) same = x[i] < 0 || y[i] < 0 || x[i] == y[i];
    MIX_CHECK(same, "matmul: batch dims of X " << shape_str(x) << " and Y " << shape_str(y)
                                                << " differ (Y must have X's leading dims, or be 2-D)");
  }
  for (int64_t b : d.batch) d.count *= b;
  d.m = tx ? x[xb + 1] : x[xb];
  d.k = tx ? x[xb] : x[xb + 1];
  const int64_t yk = ty ? y[yb + 1] : y[yb];
  d.n = ty ? y[yb] : y[yb + 1];
  MIX_CHECK(d.k < 0 || yk < 0 || d.k == yk, "matmul: X " << shape_str(x) << (tx ? " (transposed)" : "") << " has K = "
                                                          << d.k << " but Y " << shape_str(y)
                                                          << (ty ? " (transposed)" : "") << " has K = " << yk);
  return d;
}

}  // namespace mix
