#pragma once
// fused_attention's shape rules, shared by its CPU kernels
// (runtime/ops/fused_attention.cc) and its CUDA launchers
// (runtime/ops/cuda/fused_attention.cu): Q [..., T, D], K and V [..., S, D]
// with the same leading dims (batch and heads), LSE [..., T], and the attrs;
// or, with attr layout "bthd", Q [B, T, H, D], K and V [B, S, H, D] and LSE
// [B, H, T].
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/core/check.h"
#include "runtime/core/tensor.h"
#include "runtime/ir/program.h"

namespace mix::attention_rules {

/// The problem as the kernels see it: `groups` independent (batch, head)
/// pairs, each t_q queries against t_k keys of d values. `heads` is the
/// number of heads of a tokens-first layout (groups = batch x heads), else 1.
struct AttentionDims {
  int64_t groups, t_q, t_k, d;
  bool causal;
  float scale;
  bool tokens_first = false;
  int64_t heads = 1;
  bool packed = false;  // Q, K and V in one input, QKV (below)
};

/// How Q, K, V and Out (and their gradients) lie in memory, attr layout:
///  - heads_first, "bhtd" (the default): [..., T, D], the leading dims any
///    (batch, head) dims, each group's tokens one contiguous block;
///  - tokens_first, "bthd": [B, T, H, D], the layout a [B, T, H * D]
///    projection has once reshaped, with no copy: cuDNN reads it through
///    strides, so the Transformer needs no transposes around the op.
/// LSE is [..., T] (heads first) either way: [B, H, T] for "bthd".
enum class AttentionLayout { heads_first, tokens_first };

inline AttentionLayout layout_of(const OpDesc& op) {
  const std::string l = op.attr<std::string>("layout", "bhtd");
  MIX_CHECK(l == "bhtd" || l == "bthd",
            op.type << ": attr layout must be \"bhtd\" ([..., T, D]) or \"bthd\" ([B, T, H, D]), got \"" << l << "\"");
  return l == "bthd" ? AttentionLayout::tokens_first : AttentionLayout::heads_first;
}

/// Whether Q, K and V come packed in one input, QKV [B, T, 3, H, D]: the
/// Transformer's [B, T, 3 * H * D] projection reshaped, with no copy (no
/// split), which cuDNN reads through strides; its gradient is QKV@GRAD. Only
/// in the tokens-first layout.
inline bool packed(const OpDesc& op) { return !op.in_or_empty("QKV").empty(); }

/// Q's shape (K's and V's too) of a packed QKV [B, T, 3, H, D]: [B, T, H, D].
inline Shape unpacked_shape(const Shape& qkv) { return {qkv[0], qkv[1], qkv[3], qkv[4]}; }

inline void check_packed(const OpDesc& op, const Shape& qkv) {
  MIX_CHECK(layout_of(op) == AttentionLayout::tokens_first,
            op.type << ": a packed QKV input needs attr layout \"bthd\"");
  MIX_CHECK(
      qkv.size() == 5 && qkv[2] == 3 && qkv[4] > 0,
      op.type << ": QKV must be [batch, tokens, 3, heads, head_dim] (Q, K, V along dim 2), got " << shape_str(qkv));
}

/// [B, T, H, D] -> [B, H, T, D] (and back: the same swap of dims 1 and 2).
inline Shape swap_tokens_and_heads(const Shape& s) { return {s[0], s[2], s[1], s[3]}; }

inline std::string describe(const Shape& q, const Shape& k, const Shape& v) {
  return "Q " + shape_str(q) + ", K " + shape_str(k) + ", V " + shape_str(v);
}

/// Q [..., T, D], K and V [..., S, D] with equal leading dims (a -1, unknown
/// at build time, matches anything: the kernels check the real dims), and with
/// causal T <= S, as softmax's causal mask asks (more queries than keys would
/// leave the first queries with no key to attend to).
inline void check_shapes(const OpDesc& op, const Shape& q, const Shape& k, const Shape& v) {
  auto same = [](int64_t a, int64_t b) { return a < 0 || b < 0 || a == b; };
  const size_t n = q.size();
  const bool tokens_first = layout_of(op) == AttentionLayout::tokens_first;
  if (tokens_first) {
    MIX_CHECK(n == 4 && k.size() == 4 && v.size() == 4,
              op.type << ": with layout \"bthd\", Q must be [batch, tokens, heads, head_dim] and K, V [batch, keys, "
                         "heads, head_dim], got "
                      << describe(q, k, v));
    MIX_CHECK(same(q[0], k[0]) && same(q[0], v[0]) && same(q[2], k[2]) && same(q[2], v[2]),
              op.type << ": Q, K and V must share their batch and head dims (0 and 2), got " << describe(q, k, v));
  } else {
    MIX_CHECK(n >= 2 && k.size() == n && v.size() == n,
              op.type << ": Q, K and V must be [..., tokens, head_dim] of one rank, got " << describe(q, k, v));
    for (size_t i = 0; i + 2 < n; ++i)
      MIX_CHECK(same(q[i], k[i]) && same(q[i], v[i]),
                op.type << ": Q, K and V must share their leading (batch, head) dims, got " << describe(q, k, v));
  }
  const size_t tokens = tokens_first ? 1 : n - 2;
  MIX_CHECK(same(k[tokens], v[tokens]), op.type << ": K and V must have as many tokens, got " << describe(q, k, v));
  MIX_CHECK(q[n - 1] > 0 && q[n - 1] == k[n - 1] && q[n - 1] == v[n - 1],
            op.type << ": Q, K and V must share a known head_dim (the last dim), got " << describe(q, k, v));
  const int64_t t = q[tokens], s = k[tokens];
  MIX_CHECK(!op.attr<bool>("causal", false) || t < 0 || s < 0 || t <= s,
            op.type << ": causal needs no more queries than keys, but " << describe(q, k, v) << " has T = " << t
                    << " > S = " << s << " (the first queries would see no key)");
}

/// Attr scale, the logits' factor; absent: 1 / sqrt(head_dim), as
/// torch.nn.functional.scaled_dot_product_attention's default.
inline float scale_of(const OpDesc& op, int64_t head_dim) {
  if (op.has_attr("scale")) return static_cast<float>(op.attr<double>("scale", 0.0));
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

/// The kernels' view of Q, K and V (real shapes), after the checks.
/// The kernels' view of a packed QKV (real shape), after the checks.
inline AttentionDims dims_of_packed(const OpDesc& op, const Tensor& qkv) {
  check_packed(op, qkv.shape());
  MIX_CHECK(is_floating(qkv.dtype()), op.type << ": QKV must be of a float dtype, got " << dtype_name(qkv.dtype()));
  const Shape& s = qkv.shape();  // [B, T, 3, H, D]
  return {s[0] * s[3], s[1], s[1], s[4], op.attr<bool>("causal", false), scale_of(op, s[4]), true, s[3], true};
}

inline AttentionDims dims_of(const OpDesc& op, const Tensor& q, const Tensor& k, const Tensor& v) {
  check_shapes(op, q.shape(), k.shape(), v.shape());
  MIX_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() && is_floating(q.dtype()),
            op.type << ": Q, K and V must be of one float dtype, got " << dtype_name(q.dtype()) << ", "
                    << dtype_name(k.dtype()) << ", " << dtype_name(v.dtype()));
  const Shape& s = q.shape();
  const size_t n = s.size();
  const bool causal = op.attr<bool>("causal", false);
  if (layout_of(op) == AttentionLayout::tokens_first)
    return {s[0] * s[2], s[1], k.shape()[1], s[3], causal, scale_of(op, s[3]), true, s[2]};
  int64_t groups = 1;
  for (size_t i = 0; i + 2 < n; ++i) groups *= s[i];
  return {groups, s[n - 2], k.shape()[n - 2], s[n - 1], causal, scale_of(op, s[n - 1])};
}

/// LSE's shape: one statistic per query row, heads first: Q's without its last
/// dim, or [B, H, T] for Q [B, T, H, D] in the tokens-first layout.
inline Shape lse_shape(const OpDesc& op, const Shape& q) {
  if (layout_of(op) == AttentionLayout::tokens_first) return {q[0], q[2], q[1]};
  return Shape(q.begin(), q.end() - 1);
}

/// Q's shape and dtype: Q's own, or a packed QKV's per part.
inline Shape q_shape_of(const OpDesc& op, const Shape& q_or_qkv) {
  return packed(op) ? unpacked_shape(q_or_qkv) : q_or_qkv;
}

/// The grad's extra inputs: Out and Out@GRAD as Q (shape `q`, dtype `dt`), LSE FP32.
inline void check_grad_inputs(const OpDesc& op, const Shape& q, DType dt, const Tensor& out, const Tensor& lse,
                              const Tensor& dout) {
  MIX_CHECK(out.shape() == q && out.dtype() == dt && dout.shape() == q && dout.dtype() == dt,
            op.type << ": Out " << dtype_name(out.dtype()) << shape_str(out.shape()) << " and Out@GRAD "
                    << dtype_name(dout.dtype()) << shape_str(dout.shape()) << " must match Q " << dtype_name(dt)
                    << shape_str(q));
  MIX_CHECK(lse.dtype() == DType::f32 && lse.shape() == lse_shape(op, q),
            op.type << ": LSE must be f32" << shape_str(lse_shape(op, q)) << ", got " << dtype_name(lse.dtype())
                    << shape_str(lse.shape()));
}

}  // namespace mix::attention_rules
