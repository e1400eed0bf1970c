#pragma once
// What the CPU and CUDA tests of fused_attention share (test_fused_attention.cc,
// test_cuda_fused_attention.cc): an attention problem, its random inputs
// (exactly representable in the dtype under test, so every run reads the
// same numbers), attention and its gradients computed here in double from
// those values, and the comparison against it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"
#include "tests/unit/gradcheck.h"

namespace mix::testing::attention {

// One attention problem: Q [groups..., t, d], K and V [groups..., s, d].
struct Problem {
  Shape lead;  // batch and heads
  int64_t t, s, d;
  bool causal;
  Shape q_shape() const { return with(t); }
  Shape kv_shape() const { return with(s); }
  Shape with(int64_t tokens) const {
    Shape r = lead;
    r.push_back(tokens);
    r.push_back(d);
    return r;
  }
  int64_t groups() const { return shape_numel(lead); }
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(d)); }
  /// The FP32 error of a result relative to the size of its terms: each is a
  /// sum over d products (a score, dP) feeding a sum over up to s keys or t
  /// queries, plus a few roundings of the element steps (exp, log, the
  /// division), at most u = 2^-24 of the terms each; 4x for the exp of two
  /// libraries (glibc's and CUDA's differ by up to 2 ulps).
  double f32_err() const { return 4 * 0x1p-24 * static_cast<double>(d + std::max(s, t) + 16); }
  std::string describe() const {
    return "lead " + shape_str(lead) + ", T " + std::to_string(t) + ", S " + std::to_string(s) + ", D " +
           std::to_string(d) + (causal ? ", causal" : "");
  }
};

// The inputs: values exactly representable in `dt` (so every run reads the same
// numbers), dOut = R, the loss's projection.
struct Inputs {
  Tensor q, k, v, r;
};
inline Inputs make_inputs(const Problem& pb, DType dt, uint64_t seed) {
  return {rounded_through(uniform_tensor(pb.q_shape(), seed, -2.f, 2.f), dt),
          rounded_through(uniform_tensor(pb.kv_shape(), seed + 1, -2.f, 2.f), dt),
          rounded_through(uniform_tensor(pb.kv_shape(), seed + 2), dt),
          rounded_through(uniform_tensor(pb.q_shape(), seed + 3), dt)};
}

// Attention and its Q, K, V gradients in double, from the inputs' values.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
  // The largest sum of its terms' magnitudes over each result's entries
  // (Out: sum_j p_ij |v_jc|; dV: sum_i p_ij |dO_ic|; dQ, dK: the scaled sums
  // of |dS_ij| times |k_jc| or |q_ic|): a rounding of every P or dS term by a
  // relative u moves an entry by at most u times its sum.
  double out_terms = 0, dq_terms = 0, dk_terms = 0, dv_terms = 0;
};
inline Reference reference_attention(const Problem& pb, const Inputs& in) {
  const std::vector<float> q = in.q.to_floats(), k = in.k.to_floats(), v = in.v.to_floats(), dout = in.r.to_floats();
  const int64_t t = pb.t, s = pb.s, d = pb.d;
  Reference ref;
  ref.out.assign(q.size(), 0.0);
  ref.dq.assign(q.size(), 0.0);
  ref.lse.assign(static_cast<size_t>(pb.groups() * t), 0.0);
  ref.dk.assign(k.size(), 0.0);
  ref.dv.assign(v.size(), 0.0);
  auto at = [d](int64_t g, int64_t tokens, int64_t row, int64_t c) {
    return static_cast<size_t>((g * tokens + row) * d + c);
  };
  std::vector<double> out_abs(q.size(), 0.0), dq_abs(q.size(), 0.0), dk_abs(k.size(), 0.0), dv_abs(v.size(), 0.0);
  for (int64_t g = 0; g < pb.groups(); ++g) {
    for (int64_t i = 0; i < t; ++i) {
      const int64_t n = pb.causal ? i + (s - t) + 1 : s;
      std::vector<double> score(static_cast<size_t>(n)), prob(static_cast<size_t>(n));
      double max = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0.0;
        for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(q[at(g, t, i, c)]) * k[at(g, s, j, c)];
        score[static_cast<size_t>(j)] = dot * pb.scale();
        max = std::max(max, score[static_cast<size_t>(j)]);
      }
      double sum = 0.0;
      for (double x : score) sum += std::exp(x - max);
      ref.lse[static_cast<size_t>(g * t + i)] = max + std::log(sum);
      for (int64_t j = 0; j < n; ++j)
        prob[static_cast<size_t>(j)] = std::exp(score[static_cast<size_t>(j)] - max) / sum;
      for (int64_t j = 0; j < n; ++j)
        for (int64_t c = 0; c < d; ++c) {
          ref.out[at(g, t, i, c)] += prob[static_cast<size_t>(j)] * v[at(g, s, j, c)];
          out_abs[at(g, t, i, c)] += prob[static_cast<size_t>(j)] * std::fabs(v[at(g, s, j, c)]);
        }
      // Backward: dP = dO V^T, dS = P (dP - sum(P dP)), exact (not through Out).
      std::vector<double> dp(static_cast<size_t>(n));
      double p_dot_dp = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        double x = 0.0;
        for (int64_t c = 0; c < d; ++c) x += static_cast<double>(dout[at(g, t, i, c)]) * v[at(g, s, j, c)];
        dp[static_cast<size_t>(j)] = x;
        p_dot_dp += prob[static_cast<size_t>(j)] * x;
      }
      for (int64_t j = 0; j < n; ++j) {
        const double pj = prob[static_cast<size_t>(j)];
        const double ds = pj * (dp[static_cast<size_t>(j)] - p_dot_dp) * pb.scale();
        for (int64_t c = 0; c < d; ++c) {
          ref.dv[at(g, s, j, c)] += pj * dout[at(g, t, i, c)];
          ref.dq[at(g, t, i, c)] += ds * k[at(g, s, j, c)];
          ref.dk[at(g, s, j, c)] += ds * q[at(g, t, i, c)];
          dv_abs[at(g, s, j, c)] += pj * std::fabs(dout[at(g, t, i, c)]);
          dq_abs[at(g, t, i, c)] += std::fabs(ds * k[at(g, s, j, c)]);
          dk_abs[at(g, s, j, c)] += std::fabs(ds * q[at(g, t, i, c)]);
        }
      }
    }
  }
  const auto largest = [](const std::vector<double>& x) {
    return x.empty() ? 0.0 : *std::max_element(x.begin(), x.end());
  };
  ref.out_terms = largest(out_abs);
  ref.dq_terms = largest(dq_abs);
  ref.dk_terms = largest(dk_abs);
  ref.dv_terms = largest(dv_abs);
  return ref;
}

inline double max_error(const Tensor& got, const std::vector<double>& ref) {
  const std::vector<float> g = got.to_floats();
  double m = 0.0;
  for (size_t i = 0; i < g.size(); ++i) m = std::max(m, std::fabs(g[i] - ref[i]));
  return m;
}

inline std::vector<double> doubles_of(const Tensor& t) { return to_doubles(t.to_floats()); }

inline double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// |got - ref| <= scaled * max(max|ref|, 1) + rel * |ref| elementwise: errors
// of entries that are sums of terms of either sign scale with the tensor's
// terms, not with the entry (an output near 0 still carries the rounding of
// its terms), hence the part relative to the tensor's largest value. The
// inputs are O(1), and so are the terms: a tensor that is exactly 0 (dQ and dK
// with a single key, where dP - delta cancels) still carries their roundings.
// `extra`: an absolute allowance on top (the tensor-core kernels' roundings of P and dS).
inline void expect_near(const Tensor& got, const std::vector<double>& ref, double scaled, double rel,
                        const std::string& what, double extra = 0.0) {
  REQUIRE(got.numel() == static_cast<int64_t>(ref.size()));
  expect_close(got.to_floats(), ref, Tolerance{scaled * std::max(max_abs(ref), 1.0) + extra, rel}, what);
}

// Half an ulp of the stored dtype, relative: the error of its one rounding on store.
inline double half_ulp(DType t) { return t == DType::f16 ? 0x1p-11 : t == DType::bf16 ? 0x1p-8 : 0x1p-24; }

// Out, LSE and the gradients as kernels left them in plain arrays (values of
// dtype already, so the conversion is exact), by name, for expect_near.
template <typename T>
std::map<std::string, Tensor> results_as_tensors(const Problem& pb, DType dt, const std::vector<T>& out,
                                                 const std::vector<float>& lse, const std::vector<T>& dq,
                                                 const std::vector<T>& dk, const std::vector<T>& dv) {
  const auto tensor = [dt](const Shape& shape, const std::vector<T>& values) {
    std::vector<float> f(values.size());
    for (size_t i = 0; i < values.size(); ++i) f[i] = to_float(values[i]);
    return to_dtype(Tensor::from_floats(shape, f), dt);
  };
  Shape lse_shape = pb.lead;
  lse_shape.push_back(pb.t);
  return {{"out", tensor(pb.q_shape(), out)},
          {"lse", Tensor::from_floats(lse_shape, lse)},
          {"dq", tensor(pb.q_shape(), dq)},
          {"dk", tensor(pb.kv_shape(), dk)},
          {"dv", tensor(pb.kv_shape(), dv)}};
}

// What fused_attention's tensor-core kernels' roundings of P and dS add to a
// result: each term a relative half ulp u, so u times the entry's sum of term
// magnitudes (Reference::*_terms); in FP16 a term below the normal range
// instead loses up to half its subnormal step, 2^-25, times the other factor
// (|v|, |dO| at most 1, |k|, |q| at most 2 times the scale), over at most
// `terms` terms.
inline double tensor_core_allowance(DType dt, double terms_magnitude, int64_t terms, double other_factor) {
  const double subnormal = dt == DType::f16 ? 0x1p-25 * static_cast<double>(terms) * other_factor : 0.0;
  return half_ulp(dt) * terms_magnitude + subnormal;
}

/// [B, X, Y, D] -> [B, Y, X, D] of a host tensor, in its dtype: heads first
/// to tokens first ("bthd", fused_attention's attr layout) and back. A copy,
/// exact.
inline Tensor swap_tokens_and_heads(const Tensor& t) {
  const Shape& s = t.shape();
  const std::vector<float> in = t.to_floats();
  std::vector<float> out(in.size());
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t x = 0; x < s[1]; ++x)
      for (int64_t y = 0; y < s[2]; ++y)
        for (int64_t d = 0; d < s[3]; ++d)
          out[static_cast<size_t>(((b * s[2] + y) * s[1] + x) * s[3] + d)] =
              in[static_cast<size_t>(((b * s[1] + x) * s[2] + y) * s[3] + d)];
  return to_dtype(Tensor::from_floats({s[0], s[2], s[1], s[3]}, out), t.dtype());
}

/// Q, K and V heads first ([B, H, T, D] each, one dtype) packed as
/// fused_attention's QKV input, [B, T, 3, H, D]; a copy, exact.
inline Tensor pack_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  const Shape& s = q.shape();  // [B, H, T, D]
  const std::vector<float> parts[3] = {q.to_floats(), k.to_floats(), v.to_floats()};
  std::vector<float> out(parts[0].size() * 3);
  for (int64_t p = 0; p < 3; ++p)
    for (int64_t b = 0; b < s[0]; ++b)
      for (int64_t h = 0; h < s[1]; ++h)
        for (int64_t t = 0; t < s[2]; ++t)
          for (int64_t d = 0; d < s[3]; ++d)
            out[static_cast<size_t>((((b * s[2] + t) * 3 + p) * s[1] + h) * s[3] + d)] =
                parts[p][static_cast<size_t>(((b * s[1] + h) * s[2] + t) * s[3] + d)];
  return to_dtype(Tensor::from_floats({s[0], s[2], 3, s[1], s[3]}, out), q.dtype());
}

/// pack_qkv's inverse: part p (0 Q, 1 K, 2 V) of [B, T, 3, H, D], heads first [B, H, T, D].
inline Tensor unpack_qkv(const Tensor& qkv, int64_t p) {
  const Shape& s = qkv.shape();  // [B, T, 3, H, D]
  const std::vector<float> in = qkv.to_floats();
  std::vector<float> out(in.size() / 3);
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t h = 0; h < s[3]; ++h)
      for (int64_t t = 0; t < s[1]; ++t)
        for (int64_t d = 0; d < s[4]; ++d)
          out[static_cast<size_t>(((b * s[3] + h) * s[1] + t) * s[4] + d)] =
              in[static_cast<size_t>((((b * s[1] + t) * 3 + p) * s[3] + h) * s[4] + d)];
  return to_dtype(Tensor::from_floats({s[0], s[3], s[1], s[4]}, out), qkv.dtype());
}

}  // namespace mix::testing::attention
