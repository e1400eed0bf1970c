#include "amp/lists.h"

#include "runtime/core/check.h"

namespace mix::amp {

AmpLists AmpLists::defaults() {
  AmpLists l;
  l.white = {"conv2d", "matmul", "mul", "fused_attention"};
  l.black = {"exp",  "square", "log", "mean", "sum", "softmax", "softmax_with_cross_entropy",
             "sigmoid_cross_entropy_with_logits", "cross_entropy", "lookup_table"};
  l.gray = {"elementwise_add", "elementwise_sub", "elementwise_mul", "elementwise_div", "elementwise_max",
            "elementwise_min", "elementwise_pow", "relu", "gelu", "tanh", "sigmoid", "pool2d", "dropout",
            "batch_norm", "layer_norm", "reshape2", "transpose2", "flatten", "flatten2", "concat", "split",
            "scale", "squeeze2", "unsqueeze2", "slice", "stack"};
  return l;
}

AmpLists AmpLists::with_custom(const std::vector<std::string>& custom_white,
                               const std::vector<std::string>& custom_black) const {
  for (auto& w : custom_white)
    for (auto& b : custom_black)
      if (w == b)
        MIX_FAIL("op '" << w << "' is in both the custom white list and the custom black list; "
                        << "put it in one (--amp-white-list or --amp-black-list)");
  AmpLists l = *this;
  for (auto& w : custom_white) {
    l.black.erase(w);
    l.gray.erase(w);
    l.white.insert(w);
  }
  for (auto& b : custom_black) {
    l.white.erase(b);
    l.gray.erase(b);
    l.black.insert(b);
  }
  return l;
}

OpClass AmpLists::classify(const std::string& op_type) const {
  if (white.count(op_type)) return OpClass::white;
  if (black.count(op_type)) return OpClass::black;
  if (gray.count(op_type)) return OpClass::gray;
  return OpClass::unlisted;
}

}  // namespace mix::amp
