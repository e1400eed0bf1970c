#pragma once
// What the AMP pass tests (test_amp_rewrite.cc, test_fold_casts.cc) share: a
// small MLP to rewrite, and the questions they ask of a program (who writes a
// variable, which casts it holds).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "models/model.h"
#include "runtime/ir/program.h"

namespace mix::testing {

/// A 12-8-4 MLP: two muls (white), a relu (gray), the loss (black).
inline models::Model small_mlp() {
  models::MlpConfig c;
  c.in_features = 12;
  c.hidden = {8};
  c.num_classes = 4;
  return models::build_mlp(c);
}

/// The op that writes `var`, which must exist.
inline const OpDesc& producer_of(const Program& p, const std::string& var) {
  auto i = p.producer(var);
  REQUIRE(i.has_value());
  return p.ops()[*i];
}

/// The outputs of the program's cast ops, in program order.
inline std::vector<std::string> cast_outputs(const Program& p) {
  std::vector<std::string> r;
  for (auto& op : p.ops())
    if (op.type == "cast") r.push_back(op.out("Out"));
  return r;
}

}  // namespace mix::testing
