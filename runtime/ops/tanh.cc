// tanh activation; math in fn::TanhFwd / fn::TanhBwd (runtime/kernels/functors.h).
#include "runtime/kernels/functors.h"
#include "runtime/ops/activation.h"

namespace mix {
namespace {
const bool registered = register_activation<fn::TanhFwd, fn::TanhBwd>("tanh", GradReads::output);
}  // namespace
}  // namespace mix
