#pragma once
// A variable for a test's hand-built Program (no init, not persistable), for
// the unit and the multi-rank tests alike: both build the same kind of small
// programs around the collective ops.
#include <string>
#include <utility>

#include "runtime/ir/program.h"

namespace mix::test {

// Set field by field: aggregate initialisation would break whenever VarDesc grows a field.
inline VarDesc temp_var(const std::string& name, Shape shape, DType dtype) {
  VarDesc v;
  v.name = name;
  v.shape = std::move(shape);
  v.dtype = dtype;
  return v;
}

}  // namespace mix::test
