#include "models/model.h"
#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"

namespace mix::models {

Model build_mlp(const MlpConfig& c, const std::string& name) {
  MIX_CHECK(c.in_features > 0 && c.num_classes > 1, "MLP needs inputs and at least two classes");
  Model m;
  m.name = name;
  m.example_shape = {c.in_features};
  m.num_classes = c.num_classes;
  Program& p = m.program;
  p.add_var(VarDesc{m.input, {-1, c.in_features}, DType::f32, false, false, true, {}});
  p.add_var(VarDesc{m.label, {-1, 1}, DType::i64, false, false, true, {}});

  std::string h = m.input;
  int64_t width = c.in_features;
  int layer = 1;
  for (int64_t hidden : c.hidden) {
    MIX_CHECK(hidden > 0, "hidden layer sizes must be positive (got " << hidden << ")");
    const std::string fc = "fc" + std::to_string(layer++);
    const std::string y = linear(p, fc, h, width, hidden);
    h = p.unique_name(fc + ".relu");
    p.append_op(make_op("relu", {{"X", {y}}}, {{"Out", {h}}}));
    width = hidden;
  }
  linear(p, "fc" + std::to_string(layer), h, width, c.num_classes, m.logits);
  cross_entropy_loss(p, m.logits, m.label, m.loss);
  return m;
}

std::vector<std::string> model_names() { return {"mlp", "linear", "resnet18", "resnet34", "resnet50", "resnet-small", "transformer", "gpt2"}; }

}  // namespace mix::models
