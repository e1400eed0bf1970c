#include "runtime/passes/fuse_matmul_bias.h"

#include <map>
#include <optional>

#include "runtime/ir/op_registry.h"
#include "runtime/passes/fuse_pairs.h"

namespace mix {

int fuse_matmul_bias(Program& p, const std::set<std::string>& keep) {
  return fuse_pairs(p, keep, "matmul", "Out",
                    [&p](const OpDesc& matmul, const OpDesc& add, const std::string& slot) -> std::optional<OpDesc> {
                      if (add.type != "elementwise_add" || slot != "X") return std::nullopt;
                      if (matmul.attr<bool>("transpose_X", false)) return std::nullopt;
                      const VarDesc& t = p.var(matmul.out("Out"));
                      const VarDesc& w = p.var(matmul.in("Y"));
                      const VarDesc& b = p.var(add.in("Y"));
                      if (w.shape.size() != 2 || b.shape.size() != 1 || t.shape.empty()) return std::nullopt;
                      // A bias over the last dim: axis -1, or the last dim's index.
                      const int64_t axis = add.attr<int64_t>("axis", -1);
                      if (axis != -1 && axis != static_cast<int64_t>(t.shape.size()) - 1) return std::nullopt;
                      if (b.shape[0] != t.shape.back() || b.dtype != t.dtype || w.dtype != t.dtype) return std::nullopt;
                      std::map<std::string, Attr> attrs;
                      for (const char* a : {"transpose_Y", "alpha"})
                        if (matmul.has_attr(a)) attrs[a] = matmul.attrs.at(a);
                      return make_op("fused_matmul_bias",
                                     {{"X", {matmul.in("X")}}, {"Y", {matmul.in("Y")}}, {"Bias", {add.in("Y")}}},
                                     {{"Out", {add.out("Out")}}}, attrs);
                    });
}

}  // namespace mix
