// gelu activation; math in fn::GeluFwd / fn::GeluBwd (runtime/kernels/functors.h).
#include "runtime/kernels/functors.h"
#include "runtime/ops/activation.h"

namespace mix {
namespace {
const bool registered = register_activation<fn::GeluFwd, fn::GeluBwd>("gelu", GradReads::input);
}  // namespace
}  // namespace mix
