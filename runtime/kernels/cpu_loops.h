#pragma once
// CPU loops that run MIX_HD functors over tensors of any floating dtype.
//
// FP16/BF16 data is widened to float and narrowed back in chunks with the bulk
// converters (F16C when the CPU has it), and the functor runs on the float
// chunk: the same values as converting element by element (the converters are
// tested bit-identical), several times faster.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/tensor.h"

namespace mix::cpu {

/// Elements per chunk: small enough for the stack and L1, large enough to amortise.
inline constexpr int64_t kChunk = 512;

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

/// dst[0..n) = float(src[0..n)).
template <typename T>
inline void load_floats(const T* src, float* dst, int64_t n) {
  const size_t m = static_cast<size_t>(n);
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, m * sizeof(float));
  } else if constexpr (std::is_same_v<T, half_t>) {
    half_bulk::f16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, m);
  } else {
    half_bulk::bf16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, m);
  }
}

/// dst[0..n) = T(src[0..n)), rounding to nearest even.
template <typename T>
inline void store_floats(const float* src, T* dst, int64_t n) {
  const size_t m = static_cast<size_t>(n);
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, m * sizeof(float));
  } else if constexpr (std::is_same_v<T, half_t>) {
    half_bulk::f32_to_f16(src, reinterpret_cast<uint16_t*>(dst), m);
  } else {
    half_bulk::f32_to_bf16(src, reinterpret_cast<uint16_t*>(dst), m);
  }
}

/// v[0..n) = round_as<T>(v[i]): each value as a store to T then a load give
/// it (the bulk conversions above, through `scratch`, n values of T).
template <typename T>
inline void round_floats(float* v, T* scratch, int64_t n) {
  if constexpr (std::is_same_v<T, float>) return;
  store_floats(v, scratch, n);
  load_floats(scratch, v, n);
}

// Row kernels (softmax, cross-entropy) run their float row functions on rows
// of any floating storage through these three: a row is widened in one bulk
// conversion, computed in float, and narrowed in one, instead of converting
// each value on every one of the row function's passes.

/// The n values at src as floats: src itself for float storage, else widened into buf.
template <typename T>
const float* widened_row(const T* src, int64_t n, std::vector<float>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    buf.resize(static_cast<size_t>(n));
    load_floats(src, buf.data(), n);
    return buf.data();
  }
}

/// Where to compute n float results bound for dst: dst itself for float
/// storage, else buf (then narrowed_row stores them).
template <typename T>
float* float_row_for(T* dst, int64_t n, std::vector<float>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    return dst;
  } else {
    buf.resize(static_cast<size_t>(n));
    return buf.data();
  }
}

/// Stores the n results computed at float_row_for(dst, ...) into dst.
template <typename T>
void narrowed_row(const float* computed, T* dst, int64_t n) {
  if constexpr (!std::is_same_v<T, float>) store_floats(computed, dst, n);
}

/// out[i] = op(x[i]) for T in/out of the same dtype (out may alias x).
template <typename T, typename Op>
void unary(const T* x, T* out, int64_t n, Op op) {
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t i = 0; i < n; ++i) out[i] = op(x[i]);
  } else {
    float buf[kChunk];
    for (int64_t b = 0; b < n; b += kChunk) {
      const int64_t m = std::min(kChunk, n - b);
      load_floats(x + b, buf, m);
      for (int64_t i = 0; i < m; ++i) buf[i] = op(buf[i]);
      store_floats(buf, out + b, m);
    }
  }
}

/// out[i] = op(a[i], b[i]) (out may alias a or b). b may be narrower than a
/// and out (an FP16 b beside FP32 a: widened on load, which is exact).
template <typename T, typename Op, typename TB = T>
void binary(const T* a, const TB* b, T* out, int64_t n, Op op) {
  if constexpr (std::is_same_v<T, float> && std::is_same_v<TB, float>) {
    for (int64_t i = 0; i < n; ++i) out[i] = op(a[i], b[i]);
  } else {
    float fa[kChunk], fb[kChunk];
    for (int64_t s = 0; s < n; s += kChunk) {
      const int64_t m = std::min(kChunk, n - s);
      load_floats(a + s, fa, m);
      load_floats(b + s, fb, m);
      for (int64_t i = 0; i < m; ++i) fa[i] = op(fa[i], fb[i]);
      store_floats(fa, out + s, m);
    }
  }
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
