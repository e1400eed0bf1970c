#include "collective/grad_allreduce_pass.h"

#include <algorithm>

#include "runtime/check.h"
#include "runtime/op_registry.h"

namespace mix::collective {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

size_t var_bytes(const Program& p, const std::string& name) {
  const VarDesc& v = p.var(name);
  return static_cast<size_t>(shape_numel(v.shape)) * dtype_size(v.dtype);
}

}  // namespace

optim::ParamGrads insert_grad_allreduce(Program& p, const optim::ParamGrads& grads, const GradSyncOptions& o,
                                        std::vector<GradBucket>* buckets_out) {
  MIX_CHECK(o.world_size >= 1, "world size " << o.world_size);
  const double factor = o.predivide > 0 ? o.predivide : static_cast<double>(o.world_size);

  // Which variable each parameter's gradient is reduced in, and which casts move.
  std::vector<std::string> reduce_vars;
  std::vector<size_t> moved_casts;  // op indices
  for (auto& [param, grad] : grads) {
    std::string reduce = grad;
    if (o.mode == GradReduce::fp16) {
      if (auto prod = p.producer(grad)) {
        const OpDesc& op = p.ops()[*prod];
        if (op.type == "cast" && p.var(op.in("X")).dtype != DType::f32 && ends_with(op.in("X"), kGradSuffix)) {
          reduce = op.in("X");
          moved_casts.push_back(*prod);
        }
      }
    }
    reduce_vars.push_back(reduce);
  }

  // Buckets in the order backward produces gradients (the reverse of the
  // parameters' order), one dtype per bucket, capped at bucket_bytes.
  std::vector<GradBucket> buckets;
  std::map<DType, size_t> open;  // dtype -> index of its open bucket
  for (size_t k = reduce_vars.size(); k-- > 0;) {
    const std::string& v = reduce_vars[k];
    const DType dt = p.var(v).dtype;
    const size_t b = var_bytes(p, v);
    auto it = open.find(dt);
    if (it == open.end() || (buckets[it->second].bytes + b > o.bucket_bytes && !buckets[it->second].vars.empty())) {
      buckets.push_back({dt, {}, 0});
      open[dt] = buckets.size() - 1;
      it = open.find(dt);
    }
    buckets[it->second].vars.push_back(v);
    buckets[it->second].bytes += b;
  }

  // Take the moved casts out of the backward section, keeping their order.
  std::sort(moved_casts.begin(), moved_casts.end());
  std::vector<OpDesc> casts;
  for (size_t i = moved_casts.size(); i-- > 0;) {
    casts.insert(casts.begin(), p.ops()[moved_casts[i]]);
    p.ops().erase(p.ops().begin() + static_cast<std::ptrdiff_t>(moved_casts[i]));
  }

  for (auto& b : buckets) {
    OpDesc op = make_op("c_allreduce_sum", {{"X", b.vars}}, {{"Out", b.vars}},
                        {{"prescale", 1.0 / factor},
                         {"postscale", factor / static_cast<double>(o.world_size)},
                         {"traffic", std::string("gradients")},
                         {"bucket_bytes", static_cast<int64_t>(b.bytes)}});
    op.role = OpRole::collective;
    p.append_op(std::move(op));
  }
  for (auto& c : casts) {
    c.role = OpRole::collective;
    p.append_op(std::move(c));
  }
  if (buckets_out) *buckets_out = buckets;
  return grads;  // the update still reads each parameter's FP32 gradient variable
}

optim::GradSyncPass grad_allreduce_pass(GradSyncOptions o) {
  return [o](Program& p, const optim::ParamGrads& g) { return insert_grad_allreduce(p, g, o); };
}

}  // namespace mix::collective
