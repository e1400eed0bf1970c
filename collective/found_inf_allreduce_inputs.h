#pragma once
// c_allreduce_found_inf's inputs as its CPU and CUDA kernels both read them
// (collective/found_inf_allreduce_op.cc, collective/cuda/found_inf_allreduce_op.cu),
// after the checks they share. The kernels add the device-specific part: where
// the flags live, and how the mask is zeroed and marked.
#include <cstdint>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "collective/overflow_mask.h"
#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"

namespace mix::collective {

struct FoundInfInputs {
  Communicator* comm = nullptr;
  int rank = 0;
  int words = 1;                     // mask words per row: room for attr world_size ranks
  std::vector<const Tensor*> flags;  // FoundInfinite k: i32 [1]
  std::vector<const Tensor*> each;   // FoundInfiniteEach k: i32 [n_k]; empty when not given
  Tensor* mask = nullptr;            // OverflowRanks, allocated [1 + sum n_k, words], not zeroed
};

inline FoundInfInputs found_inf_inputs(OpContext& ctx) {
  MIX_CHECK(ctx.env.comm, "op " << ctx.op.type << " needs a communicator (ExecEnv::comm is null)");
  FoundInfInputs in;
  in.comm = ctx.env.comm;
  in.rank = in.comm->rank();
  const int world = in.comm->world_size();
  const int64_t room = ctx.attr<int64_t>("world_size", 1);
  in.words = overflow_mask_words(static_cast<int>(room));
  MIX_CHECK(world <= 32 * in.words,
            ctx.op.type << ": the program was built for " << room << " rank(s) but runs on " << world
                        << "; build the training program with the world size it runs on (AmpOptions::world_size)");
  const auto& flags = ctx.op.ins("FoundInfinite");
  const auto& each =
      ctx.op.inputs.count("FoundInfiniteEach") ? ctx.op.ins("FoundInfiniteEach") : std::vector<std::string>{};
  MIX_CHECK(each.empty() || each.size() == flags.size(),
            ctx.op.type << ": " << each.size() << " FoundInfiniteEach for " << flags.size() << " FoundInfinite");
  int64_t params = 0;
  for (size_t k = 0; k < flags.size(); ++k) {
    const Tensor& f = ctx.scope.get(flags[k]);
    MIX_CHECK(f.dtype() == DType::i32 && f.numel() == 1, ctx.op.type << ": " << flags[k] << " must be i32 [1]");
    in.flags.push_back(&f);
    if (each.empty()) continue;
    const Tensor& e = ctx.scope.get(each[k]);
    MIX_CHECK(e.dtype() == DType::i32, ctx.op.type << ": " << each[k] << " must be i32");
    in.each.push_back(&e);
    params += e.numel();
  }
  in.mask = &ctx.out("OverflowRanks", {1 + params, in.words}, DType::i32);
  return in;
}

}  // namespace mix::collective
