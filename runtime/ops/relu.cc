// relu activation; math in fn::ReluFwd / fn::ReluBwd (runtime/kernels/functors.h).
#include "runtime/kernels/functors.h"
#include "runtime/ops/activation.h"

namespace mix {
namespace {
const bool registered = register_activation<fn::ReluFwd, fn::ReluBwd>("relu", GradReads::output);
}  // namespace
}  // namespace mix
