#include "collective/grad_allreduce_pass.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "runtime/core/check.h"
#include "runtime/ir/op_registry.h"

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

optim::ParamGrads insert_grad_allreduce(Program& p, const optim::ParamGrads& grads, GradReduce mode,
                                        const GradSyncOptions& o, std::vector<GradBucket>* buckets_out) {
  MIX_CHECK(o.world_size >= 1, "world size " << o.world_size);
  const double factor = o.predivide > 0 ? o.predivide : static_cast<double>(o.world_size);

  // Which variable each parameter's gradient is reduced in, and which casts move.
  std::vector<std::string> reduce_vars;
  std::vector<size_t> moved_casts;  // op indices
  for (auto& [param, grad] : grads) {
    std::string reduce = grad;
    if (mode != GradReduce::fp32) {
      const DType low = mode == GradReduce::fp16 ? DType::f16 : DType::bf16;
      if (auto prod = p.producer(grad)) {
        const OpDesc& op = p.ops()[*prod];
        if (op.type == "cast" && p.var(op.in("X")).dtype == low && ends_with(op.in("X"), kGradSuffix)) {
          reduce = op.in("X");
          moved_casts.push_back(*prod);
        }
      }
    }
    reduce_vars.push_back(reduce);
  }

  // When each gradient is final: the last op, moved casts aside, that reads or writes it.
  const std::set<size_t> moved(moved_casts.begin(), moved_casts.end());
  std::map<std::string, size_t> last_access;
  for (const auto& v : reduce_vars) last_access[v] = 0;
  for (size_t i = 0; i < p.ops().size(); ++i) {
    if (moved.count(i)) continue;
    const OpDesc& op = p.ops()[i];
    for (const auto& names : {op.all_inputs(), op.all_outputs()})
      for (const auto& n : names)
        if (auto it = last_access.find(n); it != last_access.end()) it->second = i;
  }

  // Buckets in the order backward finishes gradients (ties, as from one op: the
  // reverse of the parameters' order, DDP's guess), one dtype per bucket, capped.
  std::vector<size_t> order;
  for (size_t k = reduce_vars.size(); k-- > 0;) order.push_back(k);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return last_access[reduce_vars[a]] < last_access[reduce_vars[b]]; });
  std::vector<GradBucket> buckets;
  std::vector<size_t> ready;     // per bucket: the op after which all its gradients are final
  std::map<DType, size_t> open;  // dtype -> index of its open bucket
  for (size_t k : order) {
    const std::string& v = reduce_vars[k];
    const DType dt = p.var(v).dtype;
    const size_t b = var_bytes(p, v);
    auto it = open.find(dt);
    if (it == open.end() || (buckets[it->second].bytes + b > o.bucket_bytes && !buckets[it->second].vars.empty())) {
      buckets.push_back({dt, {}, 0, {}});
      ready.push_back(0);
      open[dt] = buckets.size() - 1;
      it = open.find(dt);
    }
    buckets[it->second].vars.push_back(v);
    buckets[it->second].bytes += b;
    ready[it->second] = std::max(ready[it->second], last_access[v]);
  }
  // Start order: by readiness (two dtypes fill buckets side by side), then by creation.
  std::vector<size_t> start_order(buckets.size());
  for (size_t k = 0; k < buckets.size(); ++k) start_order[k] = k;
  std::stable_sort(start_order.begin(), start_order.end(), [&](size_t a, size_t b) { return ready[a] < ready[b]; });
  {
    std::vector<GradBucket> sorted;
    std::vector<size_t> sorted_ready;
    for (size_t k : start_order) {
      sorted.push_back(std::move(buckets[k]));
      sorted_ready.push_back(ready[k]);
    }
    buckets = std::move(sorted);
    ready = std::move(sorted_ready);
  }

  // Take the moved casts out of the backward section, keeping their order;
  // the readiness positions move up past the casts removed before them.
  std::sort(moved_casts.begin(), moved_casts.end());
  std::vector<OpDesc> casts;
  for (size_t i = moved_casts.size(); i-- > 0;) {
    casts.insert(casts.begin(), p.ops()[moved_casts[i]]);
    p.ops().erase(p.ops().begin() + static_cast<std::ptrdiff_t>(moved_casts[i]));
  }
  for (size_t& r : ready)
    r -= static_cast<size_t>(std::lower_bound(moved_casts.begin(), moved_casts.end(), r) - moved_casts.begin());

  auto make_start = [&](size_t k) {
    GradBucket& b = buckets[k];
    b.buffer = p.unique_name("grad_bucket." + std::to_string(k));
    OpDesc op = make_op("c_allreduce_start", {{"X", b.vars}}, {{"Buffer", {b.buffer}}},
                        {{"prescale", 1.0 / factor},
                         {"traffic", std::string("gradients")},
                         {"bucket", static_cast<int64_t>(k)},
                         {"bucket_bytes", static_cast<int64_t>(b.bytes)}});
    op.role = OpRole::collective;
    return op;
  };
  auto append_wait = [&](size_t k) {
    const GradBucket& b = buckets[k];
    OpDesc op = make_op("c_allreduce_wait", {{"Buffer", {b.buffer}}}, {{"Out", b.vars}},
                        {{"postscale", factor / static_cast<double>(o.world_size)},
                         {"traffic", std::string("gradients")},
                         {"bucket", static_cast<int64_t>(k)}});
    op.role = OpRole::collective;
    p.append_op(std::move(op));
    // The casts to FP32 of this bucket's (FP16) gradients, now that they are reduced.
    const std::set<std::string> in_bucket(b.vars.begin(), b.vars.end());
    for (auto& c : casts)
      if (in_bucket.count(c.in("X"))) {
        c.role = OpRole::collective;
        p.append_op(c);
      }
  };

  if (o.overlap) {
    // Last bucket first, so that earlier insert positions stay valid; equal
    // positions end up in bucket order.
    for (size_t k = buckets.size(); k-- > 0;) p.insert_op(ready[k] + 1, make_start(k));
    for (size_t k = 0; k < buckets.size(); ++k) append_wait(k);
  } else {
    for (size_t k = 0; k < buckets.size(); ++k) {
      p.append_op(make_start(k));
      append_wait(k);
    }
  }
  if (buckets_out) *buckets_out = buckets;
  return grads;  // the update still reads each parameter's FP32 gradient variable
}

std::string describe_grad_sync(const Program& p) {
  const auto& ops = p.ops();
  size_t last_backward = 0;
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].role == OpRole::backward) last_backward = i;
  std::map<std::string, size_t> wait_of;  // buffer -> wait op
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].type == "c_allreduce_wait") wait_of[ops[i].in("Buffer")] = i;
  std::ostringstream o;
  int buckets = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpDesc& op = ops[i];
    if (op.type != "c_allreduce_start" || op.attr<std::string>("traffic", "") != "gradients") continue;
    ++buckets;
    const std::string& buffer = op.out("Buffer");
    const VarDesc& b = p.var(buffer);
    const auto& vars = op.ins("X");
    size_t prev = i;  // the op it follows, other starts aside
    while (prev > 0 && ops[prev - 1].type == "c_allreduce_start") --prev;
    size_t overlapped = 0;
    for (size_t j = i + 1; j <= last_backward; ++j) overlapped += ops[j].role == OpRole::backward;
    o << "  bucket " << op.attr<int64_t>("bucket", -1) << ": " << dtype_name(b.dtype) << ", "
      << shape_numel(b.shape) * static_cast<int64_t>(dtype_size(b.dtype)) << " bytes, " << vars.size()
      << " gradient(s) (" << vars.front() << (vars.size() > 1 ? " ... " + vars.back() : std::string()) << ")\n"
      << "    starts at op " << i;
    if (prev > 0) o << ", after op " << prev - 1 << " (" << ops[prev - 1].type << ")";
    o << "; waited for at op " << (wait_of.count(buffer) ? std::to_string(wait_of[buffer]) : std::string("?"))
      << "; " << overlapped << " backward op(s) run while it travels\n";
  }
  return "gradient all-reduces (" + std::to_string(buckets) + " bucket(s)):\n" + o.str();
}

}  // namespace mix::collective
