#include "amp/rewrite.h"

#include <set>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"

namespace mix::amp {

namespace {

// Input slots that stay FP32 even when the op runs in FP16.
bool keeps_fp32(const std::string& op_type, const std::string& slot) {
  if (op_type == "batch_norm") return slot == "Scale" || slot == "Bias" || slot == "Mean" || slot == "Variance";
  if (op_type == "layer_norm") return slot == "Scale" || slot == "Bias";
  return false;
}

std::string dtype_suffix(DType t) {
  switch (t) {
    case DType::f16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::f32: return "fp32";
    default: return std::string(dtype_name(t));
  }
}

}  // namespace

std::string cast_var_name(const std::string& var, DType dtype) { return var + ".cast_" + dtype_suffix(dtype); }

RewriteResult rewrite(Program& p, const AmpLists& lists, DType low) {
  MIX_CHECK(low == DType::f16 || low == DType::bf16, "AMP low precision must be f16 or bf16");
  RewriteResult result;
  std::vector<OpDesc> old_ops = std::move(p.ops());
  p.ops().clear();

  // Which "side" produced each variable: an op that went FP16 (white) or FP32
  // because of the black list (black). Feeds and parameters have no side.
  enum class Side { none, white, black };
  std::map<std::string, Side> side;
  std::map<std::string, std::string> cast_cache;  // cast_var_name -> existing

  for (auto& op : old_ops) {
    if (op.role != OpRole::forward) {
      p.append_op(std::move(op));
      continue;
    }
    const OpClass cls = lists.classify(op.type);
    Side input_side = Side::none;
    bool any_black = false, any_white = false;
    for (auto& n : op.all_inputs()) {
      auto it = side.find(n);
      if (it == side.end()) continue;
      any_black = any_black || it->second == Side::black;
      any_white = any_white || it->second == Side::white;
    }
    input_side = any_black ? Side::black : any_white ? Side::white : Side::none;

    // Decide the dtype the op computes in; nullopt: leave its inputs as they are.
    std::optional<DType> run;
    Side out_side = Side::none;
    switch (cls) {
      case OpClass::white: run = low; out_side = Side::white; break;
      case OpClass::black: run = DType::f32; out_side = Side::black; break;
      // An op in no list is numerically unknown: it runs in FP32 and, as in
      // Paddle, counts as black for the gray ops it feeds, so they stay FP32.
      case OpClass::unlisted:
        run = DType::f32;
        out_side = Side::black;
        break;
      case OpClass::gray:
        if (input_side == Side::black) {
          run = DType::f32;
          out_side = Side::black;
        } else if (input_side == Side::white) {
          run = low;
          out_side = Side::white;
        }
        break;
    }

    if (run) {
      for (auto& [slot, names] : op.inputs) {
        if (keeps_fp32(op.type, slot)) continue;
        for (auto& n : names) {
          const VarDesc& v = p.var(n);
          if (!is_floating(v.dtype) || v.dtype == *run) continue;
          const std::string cname = cast_var_name(n, *run);
          if (!cast_cache.count(cname)) {
            OpDesc cast = make_op("cast", {{"X", {n}}}, {{"Out", {cname}}},
                                  {{"out_dtype", std::string(dtype_name(*run))}});
            cast.role = OpRole::forward;
            p.append_op(std::move(cast));
            ++result.casts_inserted;
            cast_cache[cname] = cname;
            // A cast's output is on the same side as what it casts.
            if (auto it = side.find(n); it != side.end()) side[cname] = it->second;
          }
          n = cname;
        }
      }
      result.op_dtype[p.ops().size()] = *run;
    }
    for (auto& n : op.all_outputs()) side[n] = out_side;
    p.append_op(std::move(op));  // re-infers output dtypes from the new inputs
  }
  return result;
}

}  // namespace mix::amp
