// CUDA kernel of c_allreduce_found_inf (slots, attributes and semantics: the
// CPU op in collective/found_inf_allreduce_op.cc; the mask layout:
// collective/overflow_mask.h, whose MIX_HD helpers both kernels use).
//
// Everything stays on the device: the mask is zeroed on the compute stream, one
// small launch per gradient bucket sets this rank's bit where its flags are
// raised, the device communicator all-reduces the mask (int32 sum of disjoint
// bits, i.e. OR; NCCL orders its stream after the compute stream, and the
// compute stream after the collective), and one thread writes Out from row 0.
// The flags are never read on the host, and the host never waits here.
//
// Each mask word is written by one thread of one launch at a time: row 0 by
// thread 0 of each bucket's launch (launches on one stream run in order), row
// 1 + j by the thread of parameter j. No atomics are needed. The maps:
// found_inf_kernels.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "collective/cuda/found_inf_kernels.cuh"
#include "collective/found_inf_allreduce_inputs.h"
#include "collective/overflow_mask.h"
#include "runtime/core/check.h"
#include "runtime/ops/cuda/device_ops.cuh"

namespace mix::collective {
namespace {

void found_inf_cuda(OpContext& ctx) {
  const FoundInfInputs in = found_inf_inputs(ctx);
  const cudaStream_t stream = cuda::compute_stream(ctx);
  int32_t* m = in.mask->data<int32_t>();
  const int words = in.words;
  MIX_CUDA_CHECK(cudaMemsetAsync(m, 0, in.mask->bytes(), stream));
  int64_t row = 1;
  for (size_t k = 0; k < in.flags.size(); ++k) {
    const Tensor& f = *in.flags[k];
    cuda::check_on_device(ctx, f, "FoundInfinite '" + ctx.op.ins("FoundInfinite")[k] + "'");
    const int32_t* each_p = nullptr;
    int64_t n = 0;
    if (!in.each.empty()) {
      const Tensor& e = *in.each[k];
      cuda::check_on_device(ctx, e, "FoundInfiniteEach '" + ctx.op.ins("FoundInfiniteEach")[k] + "'");
      each_p = e.data<int32_t>();
      n = e.numel();
    }
    cuda::launch_grid_stride(
        std::max<int64_t>(n, 1), stream,
        FoundInfMarkBucket{f.data<int32_t>(), n > 0 ? each_p : nullptr, n, m, row, words, in.rank});
    row += n;
  }
  // Started and waited for at once: on a device communicator the wait orders
  // the compute stream after the collective on the device, so the launch below
  // reads the reduced mask while the host goes on queueing the optimizer
  // updates. The blocking all_reduce would hold the host until all of backward
  // had run, and the GPU would then idle while those updates were queued. A
  // dead peer is still caught: the step ends in the watched synchronize().
  in.comm->wait(
      in.comm->all_reduce_start(m, static_cast<size_t>(in.mask->numel()), DType::i32, ReduceOp::sum, Traffic::control));
  cuda::launch_grid_stride(1, stream, FoundInfAnyRank{m, words, ctx.out("Out", {1}, DType::i32).data<int32_t>()});
}

const bool registered = OpRegistry::instance().add_cuda_kernel("c_allreduce_found_inf", found_inf_cuda);

}  // namespace
}  // namespace mix::collective
