#pragma once
// amp::fuse_param_casts, run on the finished training program: amp::rewrite
// gives each weight a white-list op reads its own cast to FP16 (the FP32
// master copy's half copy, made once a step). This pass replaces those
// forward casts of parameters with one fused_cast op per pair of dtypes
// (runtime/ops/fused_cast.cc), where the first of them was.
//
// Why: the same bits (fused_cast converts each element as cast does), but a
// ResNet-50 step casts 55 parameters (its weights and the classifier's bias),
// a Transformer's about as many: one multi-tensor launch on a GPU instead of
// one each, each of which the host must queue (MIX_PROFILE_OPS=host shows the
// cost). Memory: a weight's
// half copy now exists from the start of the forward pass instead of from its
// layer's turn; it lived until its layer's gradient anyway, so the step's
// peak, at the end of the forward pass, holds every copy either way.
//
// Only casts that can move: of a parameter no earlier forward op writes, to
// a variable nothing else writes. `--no-fuse-param-casts` keeps them apart.
#include "runtime/ir/program.h"

namespace mix::amp {

/// Fuses the forward casts of parameters as described above; returns how
/// many casts the fused_cast ops replaced (0 when fewer than two could fuse).
int fuse_param_casts(Program& p);

}  // namespace mix::amp
