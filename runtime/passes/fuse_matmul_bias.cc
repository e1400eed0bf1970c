#include "runtime/passes/fuse_matmul_bias.h"

#include <map>
#include <optional>

#include "runtime/ir/op_registry.h"
#include "runtime/passes/fuse_pairs.h"

namespace mix {

namespace {

// A bias over the product's last dim: 1-D, axis -1 or the last dim's index,
// and of the product's dtype, added by an elementwise_add reading the product as X.
bool adds_last_dim_bias(const Program& p, const OpDesc& add, const std::string& slot, const VarDesc& product) {
  if (add.type != "elementwise_add" || slot != "X" || product.shape.empty()) return false;
  const VarDesc& b = p.var(add.in("Y"));
  const int64_t axis = add.attr<int64_t>("axis", -1);
  if (axis != -1 && axis != static_cast<int64_t>(product.shape.size()) - 1) return false;
  return b.shape.size() == 1 && b.shape[0] == product.shape.back() && b.dtype == product.dtype;
}

OpDesc fused(const OpDesc& product_op, const OpDesc& add, std::map<std::string, Attr> attrs) {
  return make_op("fused_matmul_bias",
                 {{"X", {product_op.in("X")}}, {"Y", {product_op.in("Y")}}, {"Bias", {add.in("Y")}}},
                 {{"Out", {add.out("Out")}}}, std::move(attrs));
}

}  // namespace

int fuse_matmul_bias(Program& p, const std::set<std::string>& keep) {
  const int from_matmul =
      fuse_pairs(p, keep, "matmul", "Out",
                 [&p](const OpDesc& matmul, const OpDesc& add, const std::string& slot) -> std::optional<OpDesc> {
                   if (matmul.attr<bool>("transpose_X", false)) return std::nullopt;
                   const VarDesc& t = p.var(matmul.out("Out"));
                   const VarDesc& w = p.var(matmul.in("Y"));
                   if (w.shape.size() != 2 || w.dtype != t.dtype || !adds_last_dim_bias(p, add, slot, t))
                     return std::nullopt;
                   std::map<std::string, Attr> attrs;
                   for (const char* a : {"transpose_Y", "alpha"})
                     if (matmul.has_attr(a)) attrs[a] = matmul.attrs.at(a);
                   return fused(matmul, add, std::move(attrs));
                 });
  // mul, the MLP's fully connected layer, is X [B, in] . Y [out, in]^T: matmul
  // with transpose_Y where X is 2-D (a wider X is flattened after
  // x_num_col_dims, which fused_matmul_bias does not do).
  const int from_mul =
      fuse_pairs(p, keep, "mul", "Out",
                 [&p](const OpDesc& mul, const OpDesc& add, const std::string& slot) -> std::optional<OpDesc> {
                   const VarDesc& t = p.var(mul.out("Out"));
                   const VarDesc& x = p.var(mul.in("X"));
                   const VarDesc& w = p.var(mul.in("Y"));
                   if (x.shape.size() != 2 || mul.attr<int>("x_num_col_dims", 1) != 1 || w.shape.size() != 2 ||
                       w.dtype != t.dtype || !adds_last_dim_bias(p, add, slot, t))
                     return std::nullopt;
                   return fused(mul, add, {{"transpose_Y", true}});
                 });
  return from_matmul + from_mul;
}

}  // namespace mix
