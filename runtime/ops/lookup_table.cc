// lookup_table: embedding rows, with Paddle's lookup_table_v2 semantics (Ids of
// any shape, no trailing 1 required).
//   inputs  W [V, D] (f32, f16 or bf16), Ids (i64 or i32) of any shape [...]
//   output  Out [..., D] = W[Ids], in W's dtype (a copy: no rounding at all)
//   attrs   padding_idx (int64, default -1 = none): Ids equal to it read as a
//           row of zeros and send no gradient to W (PyTorch's padding_idx)
// An id outside [0, V) is an error naming the id, where it sits and V: a bad
// vocabulary size or an unshifted label would otherwise read another row, or
// another allocation, silently. Row steps in runtime/kernels/lookup_row.h.
//
// Grad (lookup_table_grad): inputs W (for its shape and dtype only), Ids,
// Out@GRAD; output W@GRAD, dense [V, D] in W's dtype: zeros, then every
// occurrence of an id adds its Out@GRAD row (duplicate ids sum), accumulated
// in FP32 and rounded once. Ids get no gradient. lookup_table is on the AMP
// black list, so W is normally the FP32 master and W@GRAD FP32.
// Optional input Accumulate (W's shape; W's dtype, or f16/bf16 for an f32 W,
// widened on load): the other part of W's gradient, added to every row as
// `sum` would add it (fn::add_grad_part). A tied output layer's FP16 gradient
// is that part: runtime/passes/fold_grad_sums.h folds its cast to FP32 and
// the sum of the two parts into this op.
#include <algorithm>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"
#include "runtime/kernels/cpu_loops.h"
#include "runtime/kernels/functors.h"
#include "runtime/kernels/lookup_row.h"
#include "runtime/ops/accumulate_input.h"
#include "runtime/ops/gemm.h"
#include "runtime/ops/lookup_table_shapes.h"

namespace mix {
namespace {

using lookup_rules::check_padding_idx;
using lookup_rules::check_table;
using lookup_rules::is_id_dtype;
using lookup_rules::out_shape;

int64_t id_at(const Tensor& ids, int64_t i) {
  return ids.dtype() == DType::i64 ? ids.data<int64_t>()[i] : ids.data<int32_t>()[i];
}

// "[i, j, ...]": the position of flat element i in a tensor of shape s.
std::string index_str(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t k = s.size(); k-- > 0;) {
    idx[k] = s[k] > 0 ? i % s[k] : 0;
    i = s[k] > 0 ? i / s[k] : 0;
  }
  return shape_str(idx);
}

void infer_lookup_table(Program& p, OpDesc& op) {
  const VarDesc& w = p.var(op.in("W"));
  const VarDesc& ids = p.var(op.in("Ids"));
  MIX_CHECK(w.shape.size() == 2 && is_floating(w.dtype), "lookup_table: W "
                                                             << w.name << " must be a float [V, D] table, got "
                                                             << dtype_name(w.dtype) << shape_str(w.shape));
  MIX_CHECK(is_id_dtype(ids.dtype),
            "lookup_table: Ids " << ids.name << " must be i64 or i32, got " << dtype_name(ids.dtype));
  check_padding_idx("lookup_table", op.attr<int64_t>("padding_idx", -1), w.shape[0]);
  declare_var(p, op.out("Out"), out_shape(ids.shape, w.shape[1]), w.dtype);
}

// Every id in [0, V), before any row is read.
void check_ids(const std::string& op, const Tensor& ids, int64_t rows) {
  lookup_rules::check_id_dtype(op, ids);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t id = id_at(ids, i);
    if (!fn::lookup_id_valid(id, rows))
      MIX_FAIL(op << ": id " << id << " at position " << index_str(i, ids.shape()) << " of Ids "
                  << shape_str(ids.shape()) << " is out of range: W has " << rows << " rows (valid ids are 0.."
                  << rows - 1 << ")");
  }
}

void lookup_table_cpu(OpContext& ctx) {
  const Tensor& w = ctx.in("W");
  const Tensor& ids = ctx.in("Ids");
  check_table("lookup_table", w);
  const int64_t v = w.dim(0), d = w.dim(1);
  const int64_t padding_idx = ctx.attr<int64_t>("padding_idx", -1);
  check_padding_idx("lookup_table", padding_idx, v);
  check_ids("lookup_table", ids, v);
  Tensor& out = ctx.out("Out", out_shape(ids.shape(), d), w.dtype());
  cpu::dispatch_floating(w.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* ws = w.data<T>();
    T* os = out.data<T>();
    for (int64_t i = 0; i < ids.numel(); ++i) fn::lookup_row(ws, id_at(ids, i), d, padding_idx, os + i * d);
  });
}

void lookup_table_grad_cpu(OpContext& ctx) {
  if (!ctx.wants("W@GRAD")) return;
  const Tensor& w = ctx.in("W");
  const Tensor& ids = ctx.in("Ids");
  const Tensor& dout = ctx.in("Out@GRAD");
  check_table("lookup_table_grad", w);
  const int64_t v = w.dim(0), d = w.dim(1);
  const int64_t padding_idx = ctx.attr<int64_t>("padding_idx", -1);
  check_ids("lookup_table_grad", ids, v);
  lookup_rules::check_grad_input(w, ids, dout);
  const Tensor* other = grad_part::accumulate(ctx, "W@GRAD", w.shape(), w.dtype(), true);
  Tensor& dw = ctx.out("W@GRAD", w.shape(), w.dtype());
  std::vector<float> tmp;
  float* acc = dw.dtype() == DType::f32 ? dw.data<float>() : (tmp.resize(static_cast<size_t>(v * d)), tmp.data());
  std::fill(acc, acc + v * d, 0.f);
  cpu::dispatch_floating(dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = dout.data<T>();
    for (int64_t i = 0; i < ids.numel(); ++i) {
      const int64_t id = id_at(ids, i);
      if (!fn::lookup_is_padding(id, padding_idx)) fn::lookup_grad_row_add(acc + id * d, g + i * d, d);
    }
  });
  if (other) {
    // Every row, those no id names too: the unfolded sum adds their zeros.
    widening::dispatch(other->dtype(), dw.dtype(), [&](auto other_tag, auto w_tag) {
      using TA = decltype(other_tag);
      using T = decltype(w_tag);
      const TA* a = other->data<TA>();
      T* out = dw.data<T>();
      for (int64_t i = 0; i < v * d; ++i) out[i] = fn::add_grad_part<T>(acc[i], to_float(a[i]));
    });
  } else if (dw.dtype() != DType::f32) {
    cpu::store_f32(acc, dw);
  }
}

std::vector<OpDesc> lookup_table_grad_maker(const OpDesc& fwd, GradContext& g) {
  const std::string dw = g.grad_for_input(fwd.in("W"));
  if (dw.empty()) return {};
  return {make_op("lookup_table_grad",
                  {{"W", {fwd.in("W")}}, {"Ids", {fwd.in("Ids")}}, {"Out@GRAD", {g.grad_of_output(fwd.out("Out"))}}},
                  {{"W@GRAD", {dw}}}, fwd.attrs)};
}

MIX_REGISTER_OP("lookup_table", OpInfo{infer_lookup_table, lookup_table_cpu, {}, lookup_table_grad_maker});
MIX_REGISTER_OP("lookup_table_grad", OpInfo{{}, lookup_table_grad_cpu, {}, {}});

}  // namespace
}  // namespace mix
