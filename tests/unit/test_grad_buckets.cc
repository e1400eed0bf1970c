// Gradient buckets (collective/grad_allreduce_pass.cc) of real training
// programs: for several bucket sizes, including ones smaller than the largest
// gradient, every gradient that is all-reduced lands in exactly one bucket,
// each bucket holds one dtype, no bucket outgrows the cap unless it holds a
// single gradient, buckets fill in the order backward produces gradients (for
// these models the reverse of the parameters'), and the program's
// c_allreduce_start ops are exactly these buckets. With overlap each start sits
// right after the last op that writes its gradients and nothing touches them
// until the wait, which comes after backward; without overlap each start comes
// after backward, right before its wait. (The values they produce:
// e2e.test_bucket_equivalence and e2e.test_overlap.)
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "collective/grad_allreduce_pass.h"
#include "launch/train_program.h"
#include "models/model.h"
#include "runtime/ir/op_registry.h"
#include "runtime/optim/optimizer.h"

using namespace mix;

namespace {

struct Built {
  Program program;
  optim::ParamGrads grads;
  std::vector<collective::GradBucket> buckets;
};

Built build(models::Model m, bool amp, collective::GradReduce mode, size_t bucket_bytes, bool overlap = true) {
  Built b;
  b.program = std::move(m.program);
  launch::TrainProgramOptions o;
  o.precision = amp ? mix::amp::Precision::amp : mix::amp::Precision::fp32;
  o.grad_reduce = mode;
  o.optimizer.kind = optim::OptimizerKind::sgd;
  o.grad_sync->world_size = 2;
  o.grad_sync->bucket_bytes = bucket_bytes;
  o.grad_sync->overlap = overlap;
  o.passes = launch::StepPasses::none();
  const launch::TrainProgram t = launch::build_train_program(b.program, m.loss, o);
  b.grads = t.backward_grads;
  b.buckets = t.buckets;
  return b;
}

size_t bytes_of(const Program& p, const std::string& v) {
  return static_cast<size_t>(shape_numel(p.var(v).shape)) * dtype_size(p.var(v).dtype);
}

bool touches(const OpDesc& op, const std::set<std::string>& vars) {
  for (const auto& names : {op.all_inputs(), op.all_outputs()})
    for (const auto& n : names)
      if (vars.count(n)) return true;
  return false;
}

// Where the starts and waits sit: see the file comment.
void check_placement(const Built& b, bool overlap) {
  const auto& ops = b.program.ops();
  size_t last_backward = 0;
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].role == OpRole::backward) last_backward = i;
  std::vector<size_t> starts, waits;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].type == "c_allreduce_start") starts.push_back(i);
    if (ops[i].type == "c_allreduce_wait") waits.push_back(i);
  }
  REQUIRE(starts.size() == b.buckets.size());
  REQUIRE(waits.size() == b.buckets.size());
  for (size_t k = 0; k < starts.size(); ++k) {
    INFO("bucket " << k);
    const OpDesc& start = ops[starts[k]];
    const OpDesc& wait = ops[waits[k]];
    CHECK(wait.in("Buffer") == start.out("Buffer"));
    CHECK(wait.outs("Out") == start.ins("X"));
    CHECK(start.attr<int64_t>("bucket", -1) == static_cast<int64_t>(k));
    CHECK(starts[k] < waits[k]);
    CHECK(waits[k] > last_backward);  // waits never block backward
    if (k > 0) CHECK(waits[k] > waits[k - 1]);
    const std::set<std::string> vars(start.ins("X").begin(), start.ins("X").end());
    // Nothing reads or writes the bucket while it is in flight.
    for (size_t i = starts[k] + 1; i < waits[k]; ++i) {
      INFO("op " << i << " " << ops[i].type);
      CHECK_FALSE(touches(ops[i], vars));
    }
    if (overlap) {
      // Right after the op that finishes the bucket (other buckets' starts may sit between).
      size_t j = starts[k];
      while (j > 0 && ops[j - 1].type == "c_allreduce_start") --j;
      REQUIRE(j > 0);
      CHECK(touches(ops[j - 1], vars));
      CHECK(ops[j - 1].role == OpRole::backward);
    } else {
      CHECK(starts[k] > last_backward);
      CHECK(waits[k] == starts[k] + 1);
    }
  }
  if (overlap && b.buckets.size() > 1) CHECK(starts.front() < last_backward);  // the first bucket overlaps backward
}

void check_buckets(const Built& b, size_t cap) {
  // Every parameter's gradient is reduced once, either as itself or as the FP16 gradient its cast reads.
  std::map<std::string, int> seen;
  for (const auto& bucket : b.buckets) {
    size_t bytes = 0;
    for (const auto& v : bucket.vars) {
      ++seen[v];
      CHECK(b.program.var(v).dtype == bucket.dtype);
      bytes += bytes_of(b.program, v);
    }
    CHECK(bytes == bucket.bytes);
    if (bucket.vars.size() > 1) CHECK(bucket.bytes <= cap);
  }
  CHECK(seen.size() == b.grads.size());
  for (auto& [v, n] : seen) {
    INFO(v);
    CHECK(n == 1);
  }
  for (auto& [param, grad] : b.grads) {
    INFO(param);
    CHECK((seen.count(grad) == 1 || seen.count(param + ".cast_fp16" + kGradSuffix) == 1));
  }
  // Backward's order: within each dtype, buckets list gradients from the last parameter to the first.
  std::map<std::string, size_t> param_index;
  for (size_t i = 0; i < b.grads.size(); ++i) {
    param_index[b.grads[i].second] = i;
    param_index[b.grads[i].first + ".cast_fp16" + kGradSuffix] = i;
  }
  std::map<DType, size_t> last;
  for (const auto& bucket : b.buckets)
    for (const auto& v : bucket.vars) {
      const size_t i = param_index.at(v);
      if (last.count(bucket.dtype)) CHECK(i < last[bucket.dtype]);
      last[bucket.dtype] = i;
    }
  // The program's gradient all-reduces are these buckets, in this order.
  std::vector<std::vector<std::string>> ops;
  for (const OpDesc& op : b.program.ops())
    if (op.type == "c_allreduce_start" && op.attr<std::string>("traffic", "") == "gradients") ops.push_back(op.ins("X"));
  REQUIRE(ops.size() == b.buckets.size());
  for (size_t k = 0; k < ops.size(); ++k) CHECK(ops[k] == b.buckets[k].vars);
}

}  // namespace

TEST_CASE("no gradient that shares dOut's storage is written in place by gradient sync", "[collective][views]") {
  // elementwise_add_grad passes gradients through as views of dOut
  // (runtime/ops/add_grad_views.h). Gradient sync writes gradients where they
  // lie: the packing and unpacking of buckets (a one-gradient bucket is
  // all-reduced in place while backward goes on), the unscale, the injected
  // overflow. None of those may touch a view, or it would change dOut under
  // the other input's gradient.
  const models::TransformerConfig tc{
      .layers = 2, .d_model = 16, .heads = 2, .context = 8, .vocab = 32, .tie_weights = true};
  for (size_t cap : {size_t{1}, size_t{25} << 20}) {
    for (auto mode : {collective::GradReduce::fp16, collective::GradReduce::fp32}) {
      INFO("bucket cap " << cap << ", " << (mode == collective::GradReduce::fp16 ? "fp16" : "fp32") << " reduce");
      const std::vector<std::pair<std::string, Built>> programs = [&] {
        std::vector<std::pair<std::string, Built>> v;
        v.emplace_back("mlp", build(models::build_mlp(models::MlpConfig{}), true, mode, cap));
        v.emplace_back(
            "resnet-small",
            build(models::build_resnet(models::resnet_preset("resnet-small"), "resnet-small"), true, mode, cap));
        v.emplace_back("transformer", build(models::build_transformer(tc), true, mode, cap));
        if (mode == collective::GradReduce::fp32)
          v.emplace_back("mlp fp32", build(models::build_mlp(models::MlpConfig{}), false, mode, cap));
        return v;
      }();
      for (const auto& [name, b] : programs) {
        INFO(name);
        std::set<std::string> written_in_place;
        for (const OpDesc& op : b.program.ops()) {
          if (op.type == "c_allreduce_start")
            for (const auto& v : op.ins("X")) written_in_place.insert(v);
          for (const auto& out : op.all_outputs())
            for (const auto& in : op.all_inputs())
              if (out == in) written_in_place.insert(out);
        }
        REQUIRE_FALSE(written_in_place.empty());
        int views = 0;
        for (const OpDesc& op : b.program.ops()) {
          if (op.type != "elementwise_add_grad") continue;
          for (const char* slot : {"X@GRAD", "Y@GRAD"}) {
            const std::string& g = op.out_or_empty(slot);
            if (g.empty() || OpRegistry::instance().get(op.type).viewed_input(op, g).empty()) continue;
            ++views;
            INFO(g << " is a view of " << op.in("Out@GRAD"));
            CHECK_FALSE(written_in_place.count(g));
            CHECK_FALSE(written_in_place.count(op.in("Out@GRAD")));
          }
        }
        CHECK(views > 0);  // every one of these models has an add whose gradient passes through
      }
    }
  }
}

TEST_CASE("gradient buckets: each gradient in exactly one bucket of one dtype, capped, in backward order",
          "[collective][buckets]") {
  const size_t largest_mlp = 256 * 784 * 4;  // fc1.weight's FP32 gradient
  for (size_t cap : {size_t{25} << 20, largest_mlp, size_t{100000}, size_t{1000}, size_t{1}}) {
    for (auto mode : {collective::GradReduce::fp16, collective::GradReduce::fp32}) {
      INFO("bucket cap " << cap << " bytes, " << (mode == collective::GradReduce::fp16 ? "fp16" : "fp32") << " reduce");
      for (bool overlap : {true, false}) {
        INFO((overlap ? "overlap" : "no overlap"));
        const Built mlp = build(models::build_mlp(models::MlpConfig{}), true, mode, cap, overlap);
        check_buckets(mlp, cap);
        check_placement(mlp, overlap);
        const Built resnet =
            build(models::build_resnet(models::resnet_preset("resnet-small"), "resnet-small"), true, mode, cap, overlap);
        check_buckets(resnet, cap);
        check_placement(resnet, overlap);
      }
      const Built resnet = build(models::build_resnet(models::resnet_preset("resnet-small"), "resnet-small"), true, mode, cap);
      if (mode == collective::GradReduce::fp16)  // batch_norm's FP32 gradients get FP32 buckets beside the FP16 ones
        CHECK(resnet.buckets.size() >= 2);
    }
    const Built fp32 = build(models::build_mlp(models::MlpConfig{}), false, collective::GradReduce::fp32, cap);
    check_buckets(fp32, cap);
    check_placement(fp32, true);
  }
  // A cap below the largest gradient splits the MLP's 6 gradients into several buckets; 25 MB keeps one.
  CHECK(build(models::build_mlp(models::MlpConfig{}), false, collective::GradReduce::fp32, 25u << 20).buckets.size() == 1);
  CHECK(build(models::build_mlp(models::MlpConfig{}), false, collective::GradReduce::fp32, 100000).buckets.size() > 2);
}

TEST_CASE("a bucket fills up to its cap exactly", "[collective][buckets]") {
  // The cap is a bound, not a limit to stay under: gradients that add up to
  // exactly the cap share one bucket, and one byte less splits them.
  const Built one = build(models::build_mlp(models::MlpConfig{}), false, collective::GradReduce::fp32, 25u << 20);
  REQUIRE(one.buckets.size() == 1);
  const std::vector<std::string>& order = one.buckets[0].vars;  // backward order
  REQUIRE(order.size() >= 3);
  const size_t two = bytes_of(one.program, order[0]) + bytes_of(one.program, order[1]);
  const Built exact = build(models::build_mlp(models::MlpConfig{}), false, collective::GradReduce::fp32, two);
  REQUIRE(exact.buckets.size() >= 2);
  CHECK(exact.buckets[0].vars == std::vector<std::string>{order[0], order[1]});
  CHECK(exact.buckets[0].bytes == two);
  const Built less = build(models::build_mlp(models::MlpConfig{}), false, collective::GradReduce::fp32, two - 1);
  CHECK(less.buckets[0].vars == std::vector<std::string>{order[0]});
}
