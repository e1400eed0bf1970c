// c_allreduce_found_inf: the found_inf all-reduce of the AMP step (launch/train_program.cc). Every rank gets
// the same overflow decision, and learns where the overflow came from.
//
//   inputs   FoundInfinite      i32 [1] each: the local flags of the
//                               gradient buckets' unscale ops
//            FoundInfiniteEach  i32 [n_k] each: per gradient of bucket k, 1
//                               when it held an inf or NaN (optional; one per
//                               FoundInfinite when given)
//   outputs  Out                i32 [1]: 1 when any flag of any rank was
//                               raised (the global found_inf), else 0
//            OverflowRanks      i32 [1 + params, words]: the provenance mask
//                               of overflow_mask.h, the same on every rank
//   attrs    params             the parameter of each FoundInfiniteEach entry,
//                               in order (for the trainer's log)
//            world_size         ranks the mask has room for
//
// One all-reduce (int32 sum of disjoint bits, i.e. OR) carries the flag and
// the provenance together: (1 + params) * words * 4 bytes, a few hundred bytes
// for ResNet-50, where the old MAX of one flag moved 4 and cost the same call.
#include <cstring>

#include "collective/communicator.h"
#include "collective/found_inf_allreduce_inputs.h"
#include "collective/overflow_mask.h"
#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"

namespace mix::collective {
namespace {

void infer_found_inf(Program& p, OpDesc& op) {
  const auto& flags = op.ins("FoundInfinite");
  MIX_CHECK(!flags.empty(), op.type << " needs at least one FoundInfinite flag");
  const auto& each = op.inputs.count("FoundInfiniteEach") ? op.ins("FoundInfiniteEach") : std::vector<std::string>{};
  MIX_CHECK(each.empty() || each.size() == flags.size(),
            op.type << ": " << each.size() << " FoundInfiniteEach for " << flags.size() << " FoundInfinite");
  int64_t params = 0;
  for (auto& e : each) params += shape_numel(p.var(e).shape);
  const auto names = op.attr<std::vector<std::string>>("params", {});
  MIX_CHECK(static_cast<int64_t>(names.size()) == params,
            op.type << ": attr params names " << names.size() << " parameters but the flags hold " << params);
  const int64_t world = op.attr<int64_t>("world_size", 1);
  MIX_CHECK(world >= 1, op.type << ": world_size " << world);
  declare_var(p, op.out("Out"), {1}, DType::i32);
  declare_var(p, op.out("OverflowRanks"), {1 + params, overflow_mask_words(static_cast<int>(world))}, DType::i32);
}

void found_inf_cpu(OpContext& ctx) {
  const FoundInfInputs in = found_inf_inputs(ctx);
  int32_t* m = in.mask->data<int32_t>();
  std::memset(m, 0, in.mask->bytes());
  int64_t row = 1;
  for (size_t k = 0; k < in.flags.size(); ++k) {
    if (in.flags[k]->data<int32_t>()[0] != 0) mark_rank(m, in.rank);
    if (in.each.empty()) continue;
    const Tensor& e = *in.each[k];
    for (int64_t i = 0; i < e.numel(); ++i, ++row)
      if (e.data<int32_t>()[i] != 0) mark_rank(m + row * in.words, in.rank);
  }
  in.comm->all_reduce(m, static_cast<size_t>(in.mask->numel()), DType::i32, ReduceOp::sum, Traffic::control);
  ctx.out("Out", {1}, DType::i32).data<int32_t>()[0] = any_rank(m, in.words) ? 1 : 0;
}

MIX_REGISTER_OP("c_allreduce_found_inf", OpInfo{infer_found_inf, found_inf_cpu, {}, {}});

}  // namespace
}  // namespace mix::collective
