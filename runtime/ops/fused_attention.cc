// fused_attention: softmax(scale * Q K^T, causal mask) V in one op that never
// stores the [tokens, tokens] probabilities, as PyTorch's
// scaled_dot_product_attention and cuDNN's fused attention compute it.
//   inputs  Q [..., T, D], K [..., S, D], V [..., S, D] (f32, f16 or bf16, one
//           dtype; the leading dims are batch and heads, the Transformer's
//           [B, heads, T, head_dim])
//   outputs Out [..., T, D] (Q's dtype) and LSE [..., T] (f32): each query
//           row's log(sum_j exp(s_ij)), all the backward needs of the softmax
//   attrs   scale (default 1 / sqrt(D)), causal (default false: query i sees
//           keys j <= i + (S - T), softmax's causal mask, fn::attention_visible_keys),
//           layout (default "bhtd", as above; "bthd": Q, Out [B, T, H, D], K, V
//           [B, S, H, D], LSE [B, H, T], which the Transformer's projections
//           give with no transpose; the values are the same either way)
//   or      QKV [B, T, 3, H, D] instead of Q, K and V (layout "bthd" only): the
//           Transformer's [B, T, 3 * H * D] projection reshaped, no split; its
//           gradient is QKV@GRAD
// Grad (fused_attention_grad): inputs Q, K, V, Out, LSE, Out@GRAD; outputs
// Q@GRAD, K@GRAD, V@GRAD (each only when wanted). It recomputes the
// probabilities from Q, K and LSE (p = exp(s - lse)) a tile of queries at a
// time; the math is in runtime/kernels/attention_row.h. fused_attention is
// on the AMP white list: FP16/BF16 Q, K, V, FP32 statistics.
//
// Rounding points (the CPU twin below is the reference of the CUDA kernels,
// runtime/ops/cuda/fused_attention.cu, which round at the same points):
//  - Q, K, V, Out and Out@GRAD are read widened to FP32;
//  - scores, their max, sum and log-sum-exp, the probabilities, dP and dS are
//    FP32 and never stored in the tensors' dtype (the unfused composition
//    rounds the scores and the probabilities to FP16 under AMP; this op does not);
//  - Out, Q@GRAD, K@GRAD and V@GRAD accumulate in FP32 and are rounded to the
//    input dtype once, on store; LSE is FP32.
// A tokens-first ("bthd") problem is computed heads first: its inputs are
// copied into that layout and its outputs back, so both layouts give the
// same bits.
// The CPU twin holds one tile of kQueryTile query rows by their visible keys
// at a time (its scores, then its probabilities) and runs its products as
// SGEMMs; the CUDA kernels sum in another order (online softmax over key
// tiles, per-thread dot products), so the two differ by FP32 roundings only.
#include <algorithm>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/float_convert.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/attention_row.h"
#include "runtime/kernels/softmax_row.h"
#include "runtime/ops/fused_attention_shapes.h"
#include "runtime/ops/gemm.h"

namespace mix {
namespace {

using attention_rules::AttentionDims;
using attention_rules::dims_of;
using attention_rules::lse_shape;

// Query rows per tile of the CPU twin: its scores are kQueryTile x S floats.
constexpr int64_t kQueryTile = 64;

void infer_fused_attention(Program& p, OpDesc& op) {
  if (attention_rules::packed(op)) {
    const VarDesc& qkv = p.var(op.in("QKV"));
    attention_rules::check_packed(op, qkv.shape);
    MIX_CHECK(is_floating(qkv.dtype), "fused_attention: QKV must be of a float dtype, got " << dtype_name(qkv.dtype));
    const Shape q = attention_rules::unpacked_shape(qkv.shape);
    declare_var(p, op.out("Out"), q, qkv.dtype);
    if (!op.out_or_empty("LSE").empty()) declare_var(p, op.out("LSE"), lse_shape(op, q), DType::f32);
    return;
  }
  const VarDesc& q = p.var(op.in("Q"));
  const VarDesc& k = p.var(op.in("K"));
  const VarDesc& v = p.var(op.in("V"));
  attention_rules::check_shapes(op, q.shape, k.shape, v.shape);
  MIX_CHECK(is_floating(q.dtype) && k.dtype == q.dtype && v.dtype == q.dtype,
            "fused_attention: Q, K and V must be of one float dtype, got "
                << dtype_name(q.dtype) << ", " << dtype_name(k.dtype) << ", " << dtype_name(v.dtype));
  declare_var(p, op.out("Out"), q.shape, q.dtype);
  if (!op.out_or_empty("LSE").empty()) declare_var(p, op.out("LSE"), lse_shape(op, q.shape), DType::f32);
}

// [B, X, Y, D] -> [B, Y, X, D]: tokens first to heads first (X = T, Y = H), or back (X = H, Y = T).
void swap_dims_1_and_2(const float* src, float* dst, int64_t b, int64_t x, int64_t y, int64_t d) {
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < x; ++j)
      for (int64_t k = 0; k < y; ++k) std::copy_n(src + ((i * x + j) * y + k) * d, d, dst + ((i * y + k) * x + j) * d);
}

// A tensor of the op widened to FP32 and heads first ([groups, tokens, D]):
// cpu::as_f32's view of it, or, tokens first, a copy in that layout.
const float* heads_first_f32(const Tensor& t, int slot, const AttentionDims& a, std::vector<float>& copy) {
  const float* f = cpu::as_f32(t, slot);
  if (!a.tokens_first) return f;
  const Shape& s = t.shape();  // [B, tokens, H, D]
  copy.resize(static_cast<size_t>(t.numel()));
  swap_dims_1_and_2(f, copy.data(), s[0], s[1], s[2], s[3]);
  return copy.data();
}

// The op's Q, K and V widened to FP32 and heads first, each [groups, tokens,
// D]: views of the inputs, or copies held in `copies`. A packed QKV [B, T, 3,
// H, D] gives three copies.
struct HeadsFirstQkv {
  const float* part[3];
  std::vector<float> copies[3];
};
void heads_first_qkv(const OpContext& ctx, const AttentionDims& a, HeadsFirstQkv& r) {
  if (!a.packed) {
    int slot = 0;
    for (const char* name : {"Q", "K", "V"}) {
      r.part[slot] = heads_first_f32(ctx.in(name), slot, a, r.copies[slot]);
      ++slot;
    }
    return;
  }
  const Tensor& qkv = ctx.in("QKV");
  const float* f = cpu::as_f32(qkv, 0);
  const int64_t b_count = qkv.shape()[0], t_count = a.t_q, h_count = a.heads, d = a.d;
  for (int64_t p = 0; p < 3; ++p) {
    std::vector<float>& dst = r.copies[p];
    dst.resize(static_cast<size_t>(b_count * h_count * t_count * d));
    for (int64_t b = 0; b < b_count; ++b)
      for (int64_t t = 0; t < t_count; ++t)
        for (int64_t h = 0; h < h_count; ++h)
          std::copy_n(f + (((b * t_count + t) * 3 + p) * h_count + h) * d, d,
                      dst.data() + ((b * h_count + h) * t_count + t) * d);
    r.part[p] = dst.data();
  }
}

// The problem's dims from the op's inputs (packed or not).
AttentionDims attention_dims(const OpContext& ctx) {
  if (attention_rules::packed(ctx.op)) return attention_rules::dims_of_packed(ctx.op, ctx.in("QKV"));
  return dims_of(ctx.op, ctx.in("Q"), ctx.in("K"), ctx.in("V"));
}

// Rounds `heads_first` ([groups, tokens, D], FP32) into `t`, in t's layout.
void store_from_heads_first(std::vector<float>& heads_first, Tensor& t, const AttentionDims& a) {
  if (a.tokens_first) {
    const Shape& s = t.shape();  // [B, tokens, H, D]
    std::vector<float> tokens_first(heads_first.size());
    swap_dims_1_and_2(heads_first.data(), tokens_first.data(), s[0], s[2], s[1], s[3]);
    heads_first.swap(tokens_first);
  }
  cpu::store_f32(heads_first.data(), t);
}

// A tile of query rows [first, first + rows) of one (batch, head) group and
// the keys any of them sees: [0, keys).
struct QueryTile {
  int64_t first, rows, keys;
};
QueryTile query_tile(const AttentionDims& a, int64_t first) {
  const int64_t rows = std::min(kQueryTile, a.t_q - first);
  return {first, rows, fn::attention_visible_keys(first + rows - 1, a.t_q, a.t_k, a.causal)};
}

// The tile's scores: s[r][j] = scale * q_r . k_j for its rows and keys (a
// rows x keys FP32 buffer).
void tile_scores(const AttentionDims& a, const QueryTile& t, const float* q, const float* k, std::vector<float>& s) {
  s.resize(static_cast<size_t>(t.rows * t.keys));
  cpu::sgemm(false, true, t.rows, t.keys, a.d, 1.f, q + t.first * a.d, k, 0.f, s.data());
  for (float& x : s) x = fn::attention_score(x, a.scale);
}

void fused_attention_cpu(OpContext& ctx) {
  const AttentionDims a = attention_dims(ctx);
  const Tensor& q_or_qkv = ctx.in(a.packed ? "QKV" : "Q");
  const Shape q_shape = attention_rules::q_shape_of(ctx.op, q_or_qkv.shape());
  Tensor& out_t = ctx.out("Out", q_shape, q_or_qkv.dtype());
  std::vector<float> lse_tmp;
  float* lse = nullptr;
  if (ctx.wants("LSE")) {
    lse = ctx.out("LSE", lse_shape(ctx.op, q_shape), DType::f32).data<float>();
  } else {
    lse_tmp.resize(static_cast<size_t>(a.groups * a.t_q));
    lse = lse_tmp.data();
  }
  // FP32 views: the tensors themselves when f32 and heads first, else widened
  // or moved copies (cpu::sgemm takes no scratch of its own, so every slot is
  // free here).
  HeadsFirstQkv in;
  heads_first_qkv(ctx, a, in);
  const float *q = in.part[0], *k = in.part[1], *v = in.part[2];
  std::vector<float> out(static_cast<size_t>(out_t.numel()));
  std::vector<float> s, acc, sum_exp;
  for (int64_t g = 0; g < a.groups; ++g) {
    const float* qg = q + g * a.t_q * a.d;
    const float* kg = k + g * a.t_k * a.d;
    const float* vg = v + g * a.t_k * a.d;
    for (int64_t first = 0; first < a.t_q; first += kQueryTile) {
      const QueryTile t = query_tile(a, first);
      tile_scores(a, t, qg, kg, s);
      // Each row's softmax statistics over its visible keys; s becomes
      // exp(s - max) there and exactly 0 on the masked keys.
      sum_exp.resize(static_cast<size_t>(t.rows));
      for (int64_t r = 0; r < t.rows; ++r) {
        float* row = s.data() + r * t.keys;
        const int64_t n = fn::attention_visible_keys(t.first + r, a.t_q, a.t_k, a.causal);
        const float max = fn::row_max(row, n);
        const float sum = fn::row_sum_exp(row, n, max);
        for (int64_t j = 0; j < n; ++j) row[j] = fn::exp_shifted(row[j], max);
        std::fill(row + n, row + t.keys, 0.f);
        sum_exp[static_cast<size_t>(r)] = sum;
        lse[g * a.t_q + t.first + r] = fn::attention_log_sum_exp(max, sum);
      }
      acc.resize(static_cast<size_t>(t.rows * a.d));
      cpu::sgemm(false, false, t.rows, a.d, t.keys, 1.f, s.data(), vg, 0.f, acc.data());
      float* og = out.data() + (g * a.t_q + t.first) * a.d;
      for (int64_t r = 0; r < t.rows; ++r)
        for (int64_t c = 0; c < a.d; ++c)
          og[r * a.d + c] =
              fn::attention_output(acc[static_cast<size_t>(r * a.d + c)], sum_exp[static_cast<size_t>(r)]);
    }
  }
  store_from_heads_first(out, out_t, a);  // the one rounding of Out
}

void fused_attention_grad_cpu(OpContext& ctx) {
  const Tensor& o_t = ctx.in("Out");
  const Tensor& lse_t = ctx.in("LSE");
  const Tensor& do_t = ctx.in("Out@GRAD");
  const AttentionDims a = attention_dims(ctx);
  const Tensor& q_or_qkv = ctx.in(a.packed ? "QKV" : "Q");
  attention_rules::check_grad_inputs(ctx.op, attention_rules::q_shape_of(ctx.op, q_or_qkv.shape()), q_or_qkv.dtype(),
                                     o_t, lse_t, do_t);
  HeadsFirstQkv in;
  heads_first_qkv(ctx, a, in);
  const float *q = in.part[0], *k = in.part[1], *v = in.part[2];
  std::vector<float> o_copy, do_copy;
  const float* o = heads_first_f32(o_t, 3, a, o_copy);
  const float* dout = heads_first_f32(do_t, 4, a, do_copy);
  const float* lse = lse_t.data<float>();
  // FP32 accumulators of the three gradients, rounded once on store.
  const size_t q_elems = static_cast<size_t>(a.groups * a.t_q * a.d),
               kv_elems = static_cast<size_t>(a.groups * a.t_k * a.d);
  std::vector<float> dq(q_elems), dk(kv_elems, 0.f), dv(kv_elems, 0.f);
  std::vector<float> p, ds;
  for (int64_t g = 0; g < a.groups; ++g) {
    const float* qg = q + g * a.t_q * a.d;
    const float* kg = k + g * a.t_k * a.d;
    const float* vg = v + g * a.t_k * a.d;
    const float* og = o + g * a.t_q * a.d;
    const float* dog = dout + g * a.t_q * a.d;
    const float* lseg = lse + g * a.t_q;
    for (int64_t first = 0; first < a.t_q; first += kQueryTile) {
      const QueryTile t = query_tile(a, first);
      // P recomputed from the scores and the saved log-sum-exp; ds first holds dP = dO V^T.
      tile_scores(a, t, qg, kg, p);
      ds.resize(p.size());
      cpu::sgemm(false, true, t.rows, t.keys, a.d, 1.f, dog + t.first * a.d, vg, 0.f, ds.data());
      for (int64_t r = 0; r < t.rows; ++r) {
        const int64_t i = t.first + r;
        const int64_t n = fn::attention_visible_keys(i, a.t_q, a.t_k, a.causal);
        float delta = 0.f;  // dO_i . O_i = sum_j p_ij dp_ij, from the stored Out
        for (int64_t c = 0; c < a.d; ++c) delta += dog[i * a.d + c] * og[i * a.d + c];
        const fn::SoftmaxGradElem grad{delta};
        float* pr = p.data() + r * t.keys;
        float* dsr = ds.data() + r * t.keys;
        for (int64_t j = 0; j < n; ++j) {
          pr[j] = fn::attention_prob(pr[j], lseg[i]);
          dsr[j] = grad(pr[j], dsr[j]);
        }
        std::fill(pr + n, pr + t.keys, 0.f);
        std::fill(dsr + n, dsr + t.keys, 0.f);
      }
      const float* q_tile = qg + t.first * a.d;
      const float* do_tile = dog + t.first * a.d;
      float* dvg = dv.data() + g * a.t_k * a.d;
      float* dkg = dk.data() + g * a.t_k * a.d;
      float* dq_tile = dq.data() + (g * a.t_q + t.first) * a.d;
      cpu::sgemm(true, false, t.keys, a.d, t.rows, 1.f, p.data(), do_tile, 1.f, dvg);       // dV += P^T dO
      cpu::sgemm(false, false, t.rows, a.d, t.keys, a.scale, ds.data(), kg, 0.f, dq_tile);  // dQ = scale dS K
      cpu::sgemm(true, false, t.keys, a.d, t.rows, a.scale, ds.data(), q_tile, 1.f, dkg);   // dK += scale dS^T Q
    }
  }
  if (a.packed) {
    if (!ctx.wants("QKV@GRAD")) return;
    // dQ, dK and dV back into [B, T, 3, H, D].
    const Tensor& qkv = ctx.in("QKV");
    const int64_t b_count = qkv.shape()[0], t_count = a.t_q, h_count = a.heads, d = a.d;
    std::vector<float> packed(static_cast<size_t>(qkv.numel()));
    const std::vector<float>* parts[3] = {&dq, &dk, &dv};
    for (int64_t part = 0; part < 3; ++part)
      for (int64_t b = 0; b < b_count; ++b)
        for (int64_t t = 0; t < t_count; ++t)
          for (int64_t h = 0; h < h_count; ++h)
            std::copy_n(parts[part]->data() + ((b * h_count + h) * t_count + t) * d, d,
                        packed.data() + (((b * t_count + t) * 3 + part) * h_count + h) * d);
    cpu::store_f32(packed.data(), ctx.out("QKV@GRAD", qkv.shape(), qkv.dtype()));
    return;
  }
  const Tensor& q_t = ctx.in("Q");
  const Tensor& k_t = ctx.in("K");
  const Tensor& v_t = ctx.in("V");
  if (ctx.wants("Q@GRAD")) store_from_heads_first(dq, ctx.out("Q@GRAD", q_t.shape(), q_t.dtype()), a);
  if (ctx.wants("K@GRAD")) store_from_heads_first(dk, ctx.out("K@GRAD", k_t.shape(), k_t.dtype()), a);
  if (ctx.wants("V@GRAD")) store_from_heads_first(dv, ctx.out("V@GRAD", v_t.shape(), v_t.dtype()), a);
}

std::vector<OpDesc> fused_attention_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dout = g.grad_of_output(fwd.out("Out"));
  if (dout.empty()) return {};
  const bool packed = attention_rules::packed(fwd);
  const std::vector<std::string> slots =
      packed ? std::vector<std::string>{"QKV"} : std::vector<std::string>{"Q", "K", "V"};
  std::map<std::string, std::vector<std::string>> ins, outs;
  for (const std::string& slot : slots) {
    ins[slot] = {fwd.in(slot)};
    if (const std::string d = g.grad_for_input(fwd.in(slot)); !d.empty()) outs[slot + "@GRAD"] = {d};
  }
  if (outs.empty()) return {};
  MIX_CHECK(!fwd.out_or_empty("LSE").empty(),
            "fused_attention: output LSE is needed for the gradient (of " << fwd.out("Out") << ")");
  ins["Out"] = {fwd.out("Out")};
  ins["LSE"] = {fwd.out("LSE")};
  ins["Out@GRAD"] = {dout};
  return {make_op("fused_attention_grad", ins, outs, fwd.attrs)};
}

MIX_REGISTER_OP("fused_attention", OpInfo{infer_fused_attention, fused_attention_cpu, {}, fused_attention_grad_maker});
MIX_REGISTER_OP("fused_attention_grad", OpInfo{{}, fused_attention_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
