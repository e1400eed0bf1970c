#include <cmath>

#include "models/model.h"
#include "runtime/ir/op_registry.h"

namespace mix::models {

std::string add_parameter(Program& p, const std::string& name, const Shape& shape, double bound) {
  return add_parameter(p, name, shape, VarInit{VarInit::Kind::uniform, bound});
}

std::string add_parameter(Program& p, const std::string& name, const Shape& shape, VarInit init) {
  VarDesc v;
  v.name = name;
  v.shape = shape;
  v.persistable = v.is_parameter = true;
  v.init = init;
  p.add_var(v);
  return name;
}

std::string linear(Program& p, const std::string& prefix, const std::string& x, int64_t in, int64_t out,
                   const std::string& out_name) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  const std::string w = add_parameter(p, prefix + ".weight", {out, in}, bound);
  const std::string b = add_parameter(p, prefix + ".bias", {out}, bound);
  const std::string xw = p.unique_name(prefix + ".mul");
  p.append_op(make_op("mul", {{"X", {x}}, {"Y", {w}}}, {{"Out", {xw}}}, {{"x_num_col_dims", int64_t{1}}}));
  const std::string y = out_name.empty() ? p.unique_name(prefix + ".out") : out_name;
  p.append_op(make_op("elementwise_add", {{"X", {xw}}, {"Y", {b}}}, {{"Out", {y}}}, {{"axis", int64_t{-1}}}));
  return y;
}

void cross_entropy_loss(Program& p, const std::string& logits, const std::string& label, const std::string& loss,
                        int64_t valid_classes) {
  std::map<std::string, Attr> attrs;
  if (valid_classes > 0) attrs["valid_classes"] = valid_classes;
  p.append_op(make_op("softmax_with_cross_entropy", {{"Logits", {logits}}, {"Label", {label}}},
                      {{"Softmax", {logits + ".softmax"}}, {"Loss", {loss + ".per_example"}}}, std::move(attrs)));
  p.append_op(make_op("mean", {{"X", {loss + ".per_example"}}}, {{"Out", {loss}}}));
}

}  // namespace mix::models
